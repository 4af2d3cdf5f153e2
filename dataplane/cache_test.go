package dataplane_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/dataplane"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

const cacheConfig = `
listeners:
  - name: test
    address: 127.0.0.1:0
upstreams:
  - name: app
    address: {{.Upstream}}
agents:
  - name: authz
    transport: uds
    address: {{.Path}}
    decision_cache:
      key: [method, path, "header:x-user"]
      ttl: 1m
      block_ttl: 1m
      max_entries: {{or .Max 1000}}
      flush_on_reload: {{or .FlushReload "true"}}
      max_key_bytes: {{or .MaxKey "4KiB"}}
routes:
  - name: main
    upstream: app
    agents: [authz]
`

// cachingAgent is an SDK agent that counts its calls, tags each allowed
// request with the call's number, blocks /deny, forbids caching of
// /nostore and asks for a 1 ms TTL on /short.
type cachingAgent struct{ calls atomic.Int64 }

func (c *cachingAgent) handler() sdk.Handler {
	return &agentFuncs{
		Base: sdk.Base{Caps: headersOnly()},
		reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
			n := c.calls.Add(1)
			switch string(m.URI) {
			case "/deny":
				d.Kind, d.Status, d.Body = protocol.DecisionBlock, 403, []byte("denied")
				return nil
			case "/nostore":
				sdk.NoStore(d)
			case "/short":
				sdk.CacheFor(d, time.Millisecond)
			}
			d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderSet, Name: []byte("x-call"), Value: []byte(fmt.Sprint(n))})
			return nil
		},
	}
}

func cacheSetup(t *testing.T, data map[string]any) (*proxy, *upstream, *cachingAgent, map[string]agentmux.Agent, *config.Config) {
	t.Helper()
	u := newUpstream(t, nil)
	ca := &cachingAgent{}
	path := serveAgent(t, ca.handler())
	data["Upstream"], data["Path"] = u.addr(), path
	cfg := configText(t, cacheConfig, data)
	agents := map[string]agentmux.Agent{"authz": udsAgent(t, "authz", path, nil)}
	return startProxy(t, cfg, agents, nil), u, ca, agents, cfg
}

func cacheStatus(t *testing.T, p *proxy) dataplane.CacheStatus {
	t.Helper()
	return onlyAgent(t, p.srv.PolicyStatus().Caches, func(s dataplane.CacheStatus) string { return s.Agent }, "authz")
}

func TestDecisionCacheHits(t *testing.T) {
	p, up, ca, _, _ := cacheSetup(t, map[string]any{})
	get := func(path string, hdr ...string) (int, string) {
		t.Helper()
		resp, body := p.do(t, "GET", path, nil, hdr...)
		return resp.StatusCode, body
	}
	// The second identical request is answered from the cache, its
	// header operation applied as the agent sent it.
	for i := 0; i < 3; i++ {
		if st, _ := get("/a", "x-user", "ann"); st != 200 {
			t.Fatalf("status %d", st)
		}
		if got := up.last(t).Header.Get("X-Call"); got != "1" {
			t.Fatalf("request %d: x-call %q, want the cached 1", i, got)
		}
	}
	if ca.calls.Load() != 1 {
		t.Fatalf("agent calls %d, want 1", ca.calls.Load())
	}
	// Another header value, path or method is another key.
	get("/a", "x-user", "bob")
	get("/b", "x-user", "ann")
	p.do(t, "POST", "/a", strings.NewReader("x"), "x-user", "ann")
	if ca.calls.Load() != 4 {
		t.Fatalf("agent calls %d, want 4", ca.calls.Load())
	}
	// A cached block answers without the upstream.
	before := up.count()
	for i := 0; i < 3; i++ {
		if st, body := get("/deny"); st != 403 || body != "denied" {
			t.Fatalf("deny %d: %d %q", i, st, body)
		}
	}
	if up.count() != before || ca.calls.Load() != 5 {
		t.Fatalf("upstream %d→%d, agent calls %d", before, up.count(), ca.calls.Load())
	}
	// no_store: asked every time.
	get("/nostore")
	get("/nostore")
	if ca.calls.Load() != 7 {
		t.Fatalf("agent calls %d after no_store, want 7", ca.calls.Load())
	}
	st := cacheStatus(t, p)
	if st.Hits != 4 || st.Stores != 5 || st.Entries != 5 || st.Misses != 7 {
		t.Fatalf("cache counters %+v, want 4 hits, 5 stores and entries, 7 misses", st)
	}
}

// A key over max_key_bytes is not cached: the agent is asked each time.
func TestDecisionCacheKeyLimit(t *testing.T) {
	p, _, ca, _, _ := cacheSetup(t, map[string]any{"MaxKey": 64})
	long := strings.Repeat("u", 100)
	for i := 0; i < 3; i++ {
		p.do(t, "GET", "/a", nil, "x-user", long)
	}
	p.do(t, "GET", "/a", nil, "x-user", "short")
	p.do(t, "GET", "/a", nil, "x-user", "short")
	st := cacheStatus(t, p)
	if ca.calls.Load() != 4 || st.Skipped != 3 || st.Hits != 1 {
		t.Fatalf("calls %d, cache %+v: want the long key skipped 3 times, the short one hit once", ca.calls.Load(), st)
	}
}

// The agent's own TTL: a 1 ms entry expires (the agent is asked again).
func TestDecisionCacheAgentTTL(t *testing.T) {
	p, _, ca, _, _ := cacheSetup(t, map[string]any{})
	p.do(t, "GET", "/short", nil)
	deadline := time.Now().Add(hangGuard)
	for ca.calls.Load() == 1 {
		if time.Now().After(deadline) {
			t.Fatal("the 1 ms entry never expired")
		}
		p.do(t, "GET", "/short", nil)
	}
	if st := cacheStatus(t, p); st.Expired == 0 {
		t.Fatalf("no expiry counted: %+v", st)
	}
}

// max_entries bounds the cache; the least recently used entries go.
func TestDecisionCacheEviction(t *testing.T) {
	p, _, ca, _, _ := cacheSetup(t, map[string]any{"Max": 16})
	for i := 0; i < 200; i++ {
		p.do(t, "GET", fmt.Sprintf("/p%d", i), nil)
	}
	st := cacheStatus(t, p)
	if st.Entries > 16 || st.Evictions < 200-16 || ca.calls.Load() != 200 {
		t.Fatalf("cache %+v, calls %d: want at most 16 entries", st, ca.calls.Load())
	}
}

// A new connection to the agent (a restart) empties the cache.
func TestDecisionCacheFlushOnReconnect(t *testing.T) {
	u := newUpstream(t, nil)
	ca := &cachingAgent{}
	path := testutil.SocketPath(t)
	stop := testagent.Serve(t, path, ca.handler())
	cfg := configText(t, cacheConfig, map[string]any{"Upstream": u.addr(), "Path": path})
	a := udsAgent(t, "authz", path, nil)
	p := startProxy(t, cfg, map[string]agentmux.Agent{"authz": a}, nil)
	p.do(t, "GET", "/a", nil)
	p.do(t, "GET", "/a", nil)
	if ca.calls.Load() != 1 {
		t.Fatalf("calls %d", ca.calls.Load())
	}
	stop()
	ca2 := &cachingAgent{}
	testagent.Serve(t, path, ca2.handler())
	// Until the proxy has reconnected, /a may still be served from the
	// cache; once it has, the cache is flushed and the new agent asked.
	deadline := time.Now().Add(hangGuard)
	for ca2.calls.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("new agent never asked: %+v", cacheStatus(t, p))
		}
		p.do(t, "GET", "/a", nil)
	}
	if st := cacheStatus(t, p); st.Flushes == 0 {
		t.Fatalf("no flush counted: %+v", st)
	}
}

// A reload empties the cache unless flush_on_reload is off.
func TestDecisionCacheReload(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprint("keep=", keep), func(t *testing.T) {
			p, _, ca, agents, cfg := cacheSetup(t, map[string]any{"FlushReload": fmt.Sprint(!keep)})
			p.do(t, "GET", "/a", nil)
			// The same instance: the reload may keep the cache.
			if err := p.srv.Swap(cfg, agents); err != nil {
				t.Fatal(err)
			}
			p.do(t, "GET", "/a", nil)
			want := int64(2)
			if keep {
				want = 1
			}
			if ca.calls.Load() != want {
				t.Fatalf("calls %d after reload, want %d", ca.calls.Load(), want)
			}
		})
	}
}

// A cache hit costs no allocation: the request is answered from the
// cache without an exchange (the whole process is counted).
func TestAllocsDecisionCacheHit(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	up := fastUpstream(t)
	ca := &cachingAgent{}
	path := serveAgent(t, ca.handler())
	cfg := configText(t, cacheConfig, map[string]any{"Upstream": up, "Path": path})
	p := startProxy(t, cfg, map[string]agentmux.Agent{"authz": udsAgent(t, "authz", path, nil)}, nil)
	req := fasthttp.AcquireRequest()
	req.SetRequestURI("http://x/alloc")
	req.Header.Set("X-User", "ann")
	do := steadyRequest(t, p.addr, req)
	n := testing.AllocsPerRun(500, do)
	t.Logf("%.2f allocations per request", n)
	if ca.calls.Load() != 1 {
		t.Fatalf("agent asked %d times, want once", ca.calls.Load())
	}
	if n > 0 {
		t.Errorf("%.2f allocations per cached request, want 0", n)
	}
}
