package exchange

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/zentinelproxy/sidecar/dataplane/internal/clock"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/observe"
	"github.com/zentinelproxy/sidecar/protocol"
)

// Decision cache (agents[].decision_cache). An agent that handles request
// headers alone answers the same way for requests that agree on the
// configured key parts, so its final request-header decisions are kept,
// keyed by those parts of the request as that agent would see it, and a
// hit applies the kept decision — header operations, block or redirect —
// without an exchange. Allows and blocks have separate TTLs; the agent
// can shorten, lengthen (up to max_ttl) or forbid caching per answer
// (protocol.Decision.Cache). The key bytes are kept with the entry and
// compared on every hit, so a hash collision never applies a decision to
// a request it was not made for. Memory is bounded by max_entries (least
// recently used evicted first) and max_key_bytes.

// cacheShards spreads the cache over independently locked shards.
const cacheShards = 16

// Key part kinds, resolved from the configuration.
const (
	partMethod uint8 = iota
	partHost
	partPath
	partURI
	partPathPrefix
	partHeader
	partClientIP
	partRoute // not configured: see decisionCache.byRoute
)

type keyPart struct {
	kind uint8
	n    int    // segments of partPathPrefix
	name []byte // lower-case header name of partHeader
}

type decisionCache struct {
	parts    []keyPart
	ttl      time.Duration
	blockTTL time.Duration
	maxTTL   time.Duration
	maxKey   int
	sig      string // the settings, to tell whether a reload may keep it
	// byRoute: the agent's answers depend on the route (an ext_authz
	// agent that routes send their own context_extensions), so the key
	// starts with the route whatever its configured parts: a decision of
	// one route is never another's.
	byRoute bool

	// gen reads the agent's connection generation (nil: unknown or not
	// flushed on reconnect); seen is the one the entries belong to.
	gen  func() uint64
	seen atomic.Uint64

	shards [cacheShards]cacheShard

	hits, misses, stores, evictions, expired, flushes, skipped atomic.Uint64
}

type cacheShard struct {
	mu         sync.Mutex
	m          map[uint64]*cacheEntry
	head, tail *cacheEntry // most recently used first
	max        int
}

// cacheEntry is immutable once stored (only its list links change, under
// the shard lock): a hit may use dec after the lock is released.
type cacheEntry struct {
	hash       uint64
	key        []byte
	expires    time.Duration // mono
	dec        protocol.Decision
	prev, next *cacheEntry
}

type generationer interface{ Generation() uint64 }

func newDecisionCache(c *config.DecisionCache, inst agentmux.Agent, byRoute bool) (*decisionCache, error) {
	if !c.On() {
		return nil, nil
	}
	dc := &decisionCache{
		ttl: c.TTL, blockTTL: c.BlockTTL, maxTTL: c.MaxTTL, maxKey: int(c.MaxKeyBytes),
		sig: cacheSig(c), byRoute: byRoute,
	}
	for _, k := range c.Key {
		kind, name, n, err := config.ParseCacheKeyPart(k)
		if err != nil {
			return nil, fmt.Errorf("%w: decision_cache: %v", ErrConfig, err)
		}
		p := keyPart{n: n, name: []byte(name)}
		switch kind {
		case config.KeyMethod:
			p.kind = partMethod
		case config.KeyHost:
			p.kind = partHost
		case config.KeyPath:
			p.kind = partPath
		case config.KeyURI:
			p.kind = partURI
		case config.KeyPathPrefix:
			p.kind = partPathPrefix
		case config.KeyHeader:
			p.kind = partHeader
		case config.KeyClientIP:
			p.kind = partClientIP
		}
		dc.parts = append(dc.parts, p)
	}
	per := (c.MaxEntries + cacheShards - 1) / cacheShards
	for i := range dc.shards {
		dc.shards[i] = cacheShard{m: make(map[uint64]*cacheEntry), max: per}
	}
	if g, ok := inst.(generationer); ok && c.FlushReconnect() {
		dc.gen = g.Generation
		dc.seen.Store(g.Generation())
	}
	return dc, nil
}

func cacheSig(c *config.DecisionCache) string {
	return fmt.Sprintf("%q|%v|%v|%v|%d|%d|%v", c.Key, c.TTL, c.BlockTTL, c.MaxTTL, c.MaxEntries, c.MaxKeyBytes, c.FlushReconnect())
}

// cacheFor returns the decision cache of agent a for a new table: the
// previous table's when flush_on_reload is off and the agent instance and
// its cache settings are the same, else a new (empty) one. byRoute: the
// agent's answers depend on the route (decisionCache.byRoute).
func cacheFor(prev *Table, a *config.Agent, inst agentmux.Agent, byRoute bool) (*decisionCache, error) {
	c := &a.DecisionCache
	if !c.On() {
		return nil, nil
	}
	if old := prevAgent(prev, a.Name, inst); old != nil && !c.FlushReload() && old.cache != nil && old.cache.sig == cacheSig(c) && old.cache.byRoute == byRoute {
		return old.cache, nil
	}
	return newDecisionCache(c, inst, byRoute)
}

// cacheKeyBufs holds the buffers keys are built in.
var cacheKeyBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// key appends the key of the request view m to dst; ok is false when it
// is longer than max_key_bytes.
func (dc *decisionCache) key(dst []byte, m *protocol.RequestHeaders) ([]byte, bool) {
	if dc.byRoute {
		dst = append(dst, partRoute)
		dst = appendPart(dst, m.Metadata.RouteID)
	}
	for k := range dc.parts {
		p := &dc.parts[k]
		dst = append(dst, p.kind)
		switch p.kind {
		case partMethod:
			dst = appendPart(dst, m.Method)
		case partHost:
			for _, h := range m.Headers {
				if string(h.Name) == "host" {
					start := len(dst)
					dst = appendPart(dst, h.Value)
					lowerInPlace(dst[start:])
					break
				}
			}
		case partPath:
			dst = appendPart(dst, pathOf(m.URI))
		case partURI:
			dst = appendPart(dst, m.URI)
		case partPathPrefix:
			dst = appendPart(dst, pathPrefix(pathOf(m.URI), p.n))
		case partHeader:
			// The count first: the values of one header never run into
			// the next part.
			at := len(dst)
			dst = append(dst, 0, 0)
			n := 0
			for _, h := range m.Headers {
				if string(h.Name) == string(p.name) {
					dst = appendPart(dst, h.Value)
					n++
				}
			}
			dst[at], dst[at+1] = byte(n>>8), byte(n)
		case partClientIP:
			dst = appendPart(dst, m.Metadata.ClientIP)
		}
		if len(dst) > dc.maxKey {
			return dst, false
		}
	}
	return dst, true
}

// appendPart appends v with its length, so that parts cannot run into
// each other ("ab"+"c" and "a"+"bc" differ).
func appendPart(dst, v []byte) []byte {
	n := len(v)
	dst = append(dst, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	return append(dst, v...)
}

func lowerInPlace(b []byte) {
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
}

func pathOf(uri []byte) []byte {
	for i, c := range uri {
		if c == '?' || c == '#' {
			return uri[:i]
		}
	}
	return uri
}

// pathPrefix returns the first n segments of path ("/a/b/c", 2 → "/a/b").
func pathPrefix(path []byte, n int) []byte {
	seen := 0
	for i := 1; i < len(path); i++ {
		if path[i] == '/' {
			seen++
			if seen == n {
				return path[:i]
			}
		}
	}
	return path
}

// checkGen empties the cache when the agent got a new connection since
// the entries were stored.
func (dc *decisionCache) checkGen() {
	if dc.gen == nil {
		return
	}
	g := dc.gen()
	old := dc.seen.Load()
	if g != old && dc.seen.CompareAndSwap(old, g) {
		dc.flush()
	}
}

func (dc *decisionCache) flush() {
	dc.flushes.Add(1)
	for i := range dc.shards {
		s := &dc.shards[i]
		s.mu.Lock()
		clear(s.m)
		s.head, s.tail = nil, nil
		s.mu.Unlock()
	}
}

// get returns the live entry for key (nil: a miss).
func (dc *decisionCache) get(key []byte, now time.Duration) *cacheEntry {
	h := xxhash.Sum64(key)
	s := &dc.shards[h%cacheShards]
	s.mu.Lock()
	e := s.m[h]
	if e == nil || string(e.key) != string(key) {
		s.mu.Unlock()
		dc.misses.Add(1)
		return nil
	}
	if now >= e.expires {
		s.remove(e)
		s.mu.Unlock()
		dc.expired.Add(1)
		dc.misses.Add(1)
		return nil
	}
	s.toFront(e)
	s.mu.Unlock()
	dc.hits.Add(1)
	return e
}

// put stores d under key for ttl, evicting the least recently used entry
// of the shard when it is full.
func (dc *decisionCache) put(key []byte, d *protocol.Decision, ttl time.Duration) {
	// The lookup may have been skipped (the agent's capabilities were not
	// known before the exchange connected): the entries of an earlier
	// connection go before this answer joins them.
	dc.checkGen()
	e := &cacheEntry{hash: xxhash.Sum64(key), key: append([]byte(nil), key...), expires: clock.Mono() + ttl}
	copyDecision(&e.dec, d)
	s := &dc.shards[e.hash%cacheShards]
	s.mu.Lock()
	if old := s.m[e.hash]; old != nil {
		s.remove(old)
	}
	for len(s.m) >= s.max && s.tail != nil {
		s.remove(s.tail)
		dc.evictions.Add(1)
	}
	s.m[e.hash] = e
	e.next = s.head
	if s.head != nil {
		s.head.prev = e
	}
	s.head = e
	if s.tail == nil {
		s.tail = e
	}
	s.mu.Unlock()
	dc.stores.Add(1)
}

func (s *cacheShard) remove(e *cacheEntry) {
	delete(s.m, e.hash)
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		s.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		s.tail = e.prev
	}
	e.prev, e.next = nil, nil
}

func (s *cacheShard) toFront(e *cacheEntry) {
	if s.head == e {
		return
	}
	e.prev.next = e.next
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		s.tail = e.prev
	}
	e.prev, e.next = nil, s.head
	s.head.prev = e
	s.head = e
}

// maxCachedDecision bounds the bytes of one cached decision (block body,
// redirect URL, header names and values): a larger one is not kept, so
// max_entries bounds the cache's memory, not the agents' answers.
const maxCachedDecision = 64 << 10

// decisionBytes is the size of what copyDecision copies of d.
func decisionBytes(d *protocol.Decision) int {
	n := len(d.Body) + len(d.RedirectURL)
	for _, h := range d.BlockHeaders {
		n += len(h.Name) + len(h.Value)
	}
	for _, op := range d.RequestHeaderOps {
		n += len(op.Name) + len(op.Value)
	}
	for _, op := range d.ResponseHeaderOps {
		n += len(op.Name) + len(op.Value)
	}
	return n
}

// copyDecision deep-copies what applying a header decision needs.
func copyDecision(dst, src *protocol.Decision) {
	arena := make([]byte, 0, decisionBytes(src))
	cp := func(b []byte) []byte {
		if b == nil {
			return nil
		}
		start := len(arena)
		arena = append(arena, b...)
		return arena[start:len(arena):len(arena)]
	}
	*dst = protocol.Decision{Kind: src.Kind, Status: src.Status, Body: cp(src.Body), RedirectURL: cp(src.RedirectURL)}
	for _, h := range src.BlockHeaders {
		dst.BlockHeaders = append(dst.BlockHeaders, protocol.Header{Name: cp(h.Name), Value: cp(h.Value)})
	}
	for _, op := range src.RequestHeaderOps {
		dst.RequestHeaderOps = append(dst.RequestHeaderOps, protocol.HeaderOp{Op: op.Op, Name: cp(op.Name), Value: cp(op.Value)})
	}
	for _, op := range src.ResponseHeaderOps {
		dst.ResponseHeaderOps = append(dst.ResponseHeaderOps, protocol.HeaderOp{Op: op.Op, Name: cp(op.Name), Value: cp(op.Value)})
	}
}

// cacheable reports whether agent i's decision cache applies to this
// request: the agent is known to handle request headers alone.
func (ex *Exchange) cacheable(sl *slot) bool {
	c, known := ex.knownCaps(sl)
	return known && c.HandlesRequestHeaders && !c.HandlesRequestBody && !c.HandlesResponseHeaders && !c.HandlesResponseBody
}

// cacheLookup answers agent i's request-header event from its cache.
// done is false on a miss (the agent is asked); otherwise goOn is what
// headerEvent reports.
func (ex *Exchange) cacheLookup(i int) (done, goOn bool) {
	sl := &ex.slots[i]
	dc := sl.ra.a.cache
	if !ex.cacheable(sl) {
		dc.skipped.Add(1)
		return false, false
	}
	dc.checkGen()
	// The key is made from the view the agent takes (clientview.go).
	caps, _ := ex.knownCaps(sl)
	ex.requestView(caps.SupportsClientRequest)
	bp := cacheKeyBufs.Get().(*[]byte)
	key, ok := dc.key((*bp)[:0], &ex.rh)
	var e *cacheEntry
	if ok {
		e = dc.get(key, clock.Mono())
	} else {
		dc.skipped.Add(1)
	}
	*bp = key[:0]
	cacheKeyBufs.Put(bp)
	if e == nil {
		return false, false
	}
	sl.flags |= flagReqHdrDone
	return true, ex.applyCached(i, &e.dec)
}

// applyCached applies a cached decision of agent i. The decision passed
// the status and redirect rules when it was stored; the header limits
// depend on the request and are checked again.
func (ex *Exchange) applyCached(i int, d *protocol.Decision) bool {
	if err := ex.checkLimits(i, d); err != nil {
		ex.core.stats.limits.Add(1)
		return ex.failure(i, protocol.PhaseRequest, false, err)
	}
	ex.applyOps(i, d)
	switch d.Kind {
	case protocol.DecisionBlock:
		ex.block(i, d, d.Status)
		return false
	case protocol.DecisionRedirect:
		ex.redirect(i, d, d.Status)
		return false
	}
	return true
}

// cacheStore keeps agent i's answer d to the request-header event when it
// may be cached: a final allow, block or redirect that passes the rules,
// not forbidden by the agent.
func (ex *Exchange) cacheStore(i int, d *protocol.Decision) {
	sl := &ex.slots[i]
	dc := sl.ra.a.cache
	// A query rewrite is made from the target the agent was shown, which
	// the key need not cover: never stored.
	if d.Cache.NoStore || !d.Final() || ex.rh.HasInlineBody || d.HasRequestBodyMutation || d.SetQuery || !ex.cacheable(sl) {
		return
	}
	if ex.checkLimits(i, d) != nil {
		return // breaks the header limits: the agent is asked again
	}
	if decisionBytes(d) > maxCachedDecision {
		return
	}
	ttl := dc.ttl
	switch d.Kind {
	case protocol.DecisionAllow:
	case protocol.DecisionBlock:
		if d.Status < 200 || d.Status > 599 {
			return
		}
		ttl = dc.blockTTL
	case protocol.DecisionRedirect:
		switch d.Status {
		case 301, 302, 303, 307, 308:
		default:
			return
		}
		if !validRedirect(d.RedirectURL) {
			return
		}
		ttl = dc.blockTTL
	default:
		return
	}
	if d.Cache.TTLMs > 0 {
		ttl = min(time.Duration(d.Cache.TTLMs)*time.Millisecond, dc.maxTTL)
	}
	bp := cacheKeyBufs.Get().(*[]byte)
	key, ok := dc.key((*bp)[:0], &ex.rh)
	if ok {
		dc.put(key, d, ttl)
	}
	*bp = key[:0]
	cacheKeyBufs.Put(bp)
}

// Caches returns the counters of every current agent's decision cache.
func (c *Core) Caches() []observe.CacheStatus {
	t := c.tbl.Load()
	var out []observe.CacheStatus
	for _, a := range t.agents {
		dc := a.cache
		if dc == nil {
			continue
		}
		n := 0
		for i := range dc.shards {
			sh := &dc.shards[i]
			sh.mu.Lock()
			n += len(sh.m)
			sh.mu.Unlock()
		}
		out = append(out, observe.CacheStatus{
			Agent: a.name, Entries: n, Hits: dc.hits.Load(), Misses: dc.misses.Load(), Stores: dc.stores.Load(),
			Evictions: dc.evictions.Load(), Expired: dc.expired.Load(), Flushes: dc.flushes.Load(), Skipped: dc.skipped.Load(),
		})
	}
	return out
}
