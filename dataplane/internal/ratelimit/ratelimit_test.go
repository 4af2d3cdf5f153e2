package ratelimit

import (
	"runtime"
	"strconv"
	"testing"
	"time"
	"unsafe"
)

// TestBucketExact: burst requests pass at once, the next is refused with
// the wait until one token is back; after it, exactly one more passes.
func TestBucketExact(t *testing.T) {
	l := New(5, time.Minute, 5, 100) // one token per 12s
	now := time.Hour
	for i := 0; i < 5; i++ {
		d := l.AllowOne(now)
		// Full again once the tokens taken so far are back, 12s each.
		if !d.Allowed || d.Remaining != int64(4-i) || d.Reset != time.Duration(i+1)*12*time.Second {
			t.Fatalf("request %d: %+v, want allowed with %d remaining, full in %ds", i, d, 4-i, (i+1)*12)
		}
	}
	d := l.AllowOne(now + time.Second)
	if d.Allowed || d.RetryAfter != 11*time.Second {
		t.Fatalf("6th: %+v, want refused for 11s", d)
	}
	if d := l.AllowOne(now + 12*time.Second); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after 12s: %+v, want one allowed", d)
	}
	if d := l.AllowOne(now + 12*time.Second); d.Allowed {
		t.Fatalf("second after 12s allowed")
	}
	k := l.HashBytes([]byte("a"))
	for i := 0; i < 5; i++ {
		if !l.Allow(k, now).Allowed {
			t.Fatalf("keyed request %d refused", i)
		}
	}
	if l.Allow(k, now).Allowed {
		t.Fatal("keyed 6th allowed")
	}
	if !l.Allow(l.HashBytes([]byte("b")), now).Allowed {
		t.Fatal("another key refused")
	}
}

// TestKeysBounded: a flood of 1,000,000 distinct keys (a botnet, spoofed
// header values) never has more than max_keys buckets at once, evicts
// the least recently used, and grows the heap by no more than max_keys
// buckets can take (keyHeapBound). Under the race detector, whose
// locking is ~20 times slower, the flood is 100,000 keys.
func TestKeysBounded(t *testing.T) {
	const maxKeys = 10000
	flood := 1_000_000
	if raceEnabled {
		flood = 100_000
	}
	l := New(1, time.Second, 1, maxKeys)
	hot := l.HashBytes([]byte("hot"))
	l.Allow(hot, 0)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	buf := make([]byte, 0, 32)
	for i := 0; i < flood; i++ {
		buf = strconv.AppendInt(buf[:0], int64(i), 10)
		l.Allow(l.HashBytes(buf), time.Duration(i))
		if i%1000 == 0 {
			l.Allow(hot, time.Duration(i)) // kept recent: never evicted
		}
		if i%(flood/100) == 0 {
			if n := l.Keys(); n > maxKeys {
				t.Fatalf("after %d keys: %d tracked, cap %d", i+1, n, maxKeys)
			}
		}
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	if n := l.Keys(); n > maxKeys {
		t.Fatalf("%d keys tracked, cap %d", n, maxKeys)
	}
	if l.Evicted() < uint64(flood-maxKeys-nShards) {
		t.Fatalf("evicted %d", l.Evicted())
	}
	if d := l.Allow(hot, time.Duration(flood)); d.Allowed {
		t.Fatal("the hot key's bucket was lost to the flood")
	}
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	bound := keyHeapBound(maxKeys)
	t.Logf("%d distinct keys, max_keys %d: %d keys, heap %+d KiB (bound %d KiB)", flood, maxKeys, l.Keys(), grew>>10, bound>>10)
	if grew > bound {
		t.Fatalf("heap grew %d bytes for max_keys %d, bound %d", grew, maxKeys, bound)
	}
}

// keyHeapBound is the most the buckets of maxKeys keys can take: per
// key, a slot of the entries array (append may leave it up to twice as
// long as used) and an index entry of a Go swiss map (a group is a
// control word and 8 slots of key and value, aligned; the map grows by
// doubling at 7/8 full, so at worst it is 7/16 full), plus a fixed
// allowance per shard (map and table headers) and for the runtime's own
// allocations during the test.
func keyHeapBound(maxKeys int) int64 {
	type slot struct {
		k uint64
		v int32
	}
	entryB := int64(unsafe.Sizeof(entry{}))
	groupB := 8 + 8*int64(unsafe.Sizeof(slot{}))
	mapB := groupB * 16 / (8 * 7) // bytes per key at 7/16 full
	return int64(maxKeys)*(2*entryB+mapB+1) + nShards*1024 + 256<<10
}

func TestAllowAllocs(t *testing.T) {
	l := New(1000, time.Second, 1000, 100)
	k := []byte("client")
	if n := testing.AllocsPerRun(1000, func() {
		l.Allow(l.HashBytes(k), time.Second)
		l.Allow(l.Hash2(k, k), time.Second)
		l.AllowOne(time.Second)
	}); n != 0 {
		t.Fatalf("%v allocations per decision", n)
	}
}

// BenchmarkDecision is one request's limit decision: hashing the key
// and the bucket's update (compare with a proxied request's CPU time,
// BenchmarkProxyRateLimit in package dataplane).
func BenchmarkDecision(b *testing.B) {
	l := New(1_000_000_000, time.Second, 1_000_000_000, 100000)
	key := []byte("192.0.2.123")
	b.Run("client_ip", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			l.Allow(l.HashBytes(key), time.Duration(i))
		}
	})
	b.Run("none", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			l.AllowOne(time.Duration(i))
		}
	})
	b.Run("client_ip_parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				i++
				l.Allow(l.HashBytes(key), time.Duration(i))
			}
		})
	})
}
