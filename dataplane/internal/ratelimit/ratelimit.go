// Package ratelimit is the dataplane's local rate limiting: token
// buckets, one per key, in bounded memory.
//
// A bucket is kept as GCRA's theoretical arrival time (one int64): a
// request at now is allowed when tat−now ≤ (burst−1)·T, T the emission
// interval period/requests, and moves tat to max(tat, now)+T. This is a
// token bucket of burst tokens refilled at one per T, exact to the
// nanosecond and without a refill loop.
//
// Keys are hashed (hash/maphash, a random seed per limiter) into 64 bits
// and kept in shards, each a map from hash to a slot of a fixed-capacity
// array with an LRU list through it. A shard never holds more than its
// share of max_keys: a new key past it takes the least recently used
// slot, whose bucket is forgotten (it starts full when it returns). A
// bucket whose tat is past is full, so an evicted idle key loses
// nothing; a flood of distinct keys (a botnet, spoofed header values)
// costs at most max_keys slots and only evicts the least recent ones.
// Nothing on the path of a known key allocates; a new key allocates only
// while its shard grows to its capacity. Two keys whose 64-bit hashes
// collide share a bucket; the seed is random per limiter, so a client
// cannot aim for that.
package ratelimit

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// nShards spreads the keys' locks; 64 keeps contention low on the
// machines a sidecar runs on while a shard's LRU stays long enough to
// approximate a global one.
const nShards = 64

// Limiter is one rate limit: requests per period, burst at once, per key.
type Limiter struct {
	t, tau int64 // emission interval; (burst-1)·t
	single atomic.Int64
	seed   maphash.Seed
	perCap int
	shards [nShards]shard

	evicted atomic.Uint64
}

// New returns a limiter of requests per period with a bucket of burst,
// tracking at most maxKeys keys.
func New(requests int, period time.Duration, burst, maxKeys int) *Limiter {
	t := int64(period) / int64(requests)
	if t < 1 {
		t = 1
	}
	l := &Limiter{t: t, tau: int64(burst-1) * t, seed: maphash.MakeSeed()}
	l.perCap = max(1, maxKeys/nShards) // never more than maxKeys (but one per shard)
	return l
}

// Decision is the answer for one request.
type Decision struct {
	// Allowed reports the request may pass.
	Allowed bool
	// Remaining is the requests the bucket still allows now.
	Remaining int64
	// RetryAfter is how long until one request would be allowed (0 when
	// Allowed).
	RetryAfter time.Duration
	// Reset is how long until the bucket is full again, Remaining back
	// to burst (when Allowed).
	Reset time.Duration
}

// decide applies GCRA to tat at now, returning the new tat.
func (l *Limiter) decide(tat, now int64) (int64, Decision) {
	if tat < now {
		tat = now
	}
	if over := tat - now - l.tau; over > 0 {
		return tat, Decision{RetryAfter: time.Duration(over)}
	}
	tat += l.t
	rem := (l.tau + l.t - (tat - now)) / l.t
	return tat, Decision{Allowed: true, Remaining: max(rem, 0), Reset: time.Duration(tat - now)}
}

// AllowOne decides for the limiter's single bucket (no key) at now, a
// monotonic reading.
func (l *Limiter) AllowOne(now time.Duration) Decision {
	for {
		old := l.single.Load()
		tat, d := l.decide(old, int64(now))
		if !d.Allowed || l.single.CompareAndSwap(old, tat) {
			return d
		}
	}
}

// HashBytes is the limiter's hash of a key.
func (l *Limiter) HashBytes(b []byte) uint64 { return maphash.Bytes(l.seed, b) }

// Hash2 is the limiter's hash of a key of two parts (joined by a NUL,
// which no part holds).
func (l *Limiter) Hash2(a, b []byte) uint64 {
	var h maphash.Hash
	h.SetSeed(l.seed)
	_, _ = h.Write(a)
	_ = h.WriteByte(0)
	_, _ = h.Write(b)
	return h.Sum64()
}

// Allow decides for the bucket of key (HashBytes, Hash2) at now.
func (l *Limiter) Allow(key uint64, now time.Duration) Decision {
	s := &l.shards[key%nShards]
	s.mu.Lock()
	e := s.get(key, l.perCap, &l.evicted)
	tat, d := l.decide(e.tat, int64(now))
	if d.Allowed {
		e.tat = tat
	}
	s.mu.Unlock()
	return d
}

// Keys is the number of keys tracked.
func (l *Limiter) Keys() int {
	n := 0
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		n += len(s.ents)
		s.mu.Unlock()
	}
	return n
}

// Evicted is the number of keys dropped to make room for others.
func (l *Limiter) Evicted() uint64 { return l.evicted.Load() }

// shard is a part of the keys: index, slots and their LRU list (head:
// most recent).
type shard struct {
	mu         sync.Mutex
	idx        map[uint64]int32
	ents       []entry
	head, tail int32
	_          [80]byte // pads the shard to 128 bytes, a cache line pair: no false sharing of locks
}

type entry struct {
	key        uint64
	tat        int64
	prev, next int32
}

// get returns the entry of key, made most recent, creating it (in a new
// slot while the shard is under capacity, else in the least recent one's).
func (s *shard) get(key uint64, capacity int, evicted *atomic.Uint64) *entry {
	if s.idx == nil {
		s.idx = make(map[uint64]int32)
		s.head, s.tail = -1, -1
	}
	if i, ok := s.idx[key]; ok {
		s.touch(i)
		return &s.ents[i]
	}
	var i int32
	if len(s.ents) < capacity {
		i = int32(len(s.ents))
		s.ents = append(s.ents, entry{prev: -1, next: -1})
	} else {
		i = s.tail
		s.unlink(i)
		delete(s.idx, s.ents[i].key)
		evicted.Add(1)
	}
	s.ents[i] = entry{key: key, prev: -1, next: -1}
	s.idx[key] = i
	s.pushFront(i)
	return &s.ents[i]
}

func (s *shard) touch(i int32) {
	if s.head == i {
		return
	}
	s.unlink(i)
	s.pushFront(i)
}

func (s *shard) unlink(i int32) {
	e := &s.ents[i]
	if e.prev >= 0 {
		s.ents[e.prev].next = e.next
	} else {
		s.head = e.next
	}
	if e.next >= 0 {
		s.ents[e.next].prev = e.prev
	} else {
		s.tail = e.prev
	}
	e.prev, e.next = -1, -1
}

func (s *shard) pushFront(i int32) {
	e := &s.ents[i]
	e.prev, e.next = -1, s.head
	if s.head >= 0 {
		s.ents[s.head].prev = i
	}
	s.head = i
	if s.tail < 0 {
		s.tail = i
	}
}
