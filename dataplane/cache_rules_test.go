package dataplane_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// An answer over the agent's header limits fails the request and is not
// kept: the next matching request asks the agent again.
func TestDecisionCacheSkipsAnswerOverLimits(t *testing.T) {
	u := newUpstream(t, nil)
	var calls atomic.Int64
	path := serveAgent(t, &agentFuncs{
		Base: sdk.Base{Caps: headersOnly()},
		reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
			calls.Add(1)
			if string(m.URI) == "/many" {
				for _, n := range []string{"x-a", "x-b", "x-c"} {
					d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderSet, Name: []byte(n), Value: []byte("1")})
				}
			}
			return nil
		},
	})
	tmpl := strings.Replace(cacheConfig, "    address: {{.Path}}\n", "    address: {{.Path}}\n    limits:\n      header_ops: 2\n", 1)
	cfg := configText(t, tmpl, map[string]any{"Upstream": u.addr(), "Path": path})
	p := startProxy(t, cfg, map[string]agentmux.Agent{"authz": udsAgent(t, "authz", path, nil)}, nil)
	for i := 0; i < 2; i++ {
		if resp, _ := p.do(t, "GET", "/many", nil); resp.StatusCode != 503 {
			t.Fatalf("request %d: status %d, want 503 (agent reply over its limits)", i, resp.StatusCode)
		}
	}
	if calls.Load() != 2 {
		t.Fatalf("agent calls %d, want 2: the broken answer was served from the cache", calls.Load())
	}
	if st := cacheStatus(t, p); st.Stores != 0 || st.Hits != 0 {
		t.Fatalf("cache %+v: want nothing stored", st)
	}
	// A valid answer is still kept.
	p.do(t, "GET", "/ok", nil)
	p.do(t, "GET", "/ok", nil)
	if calls.Load() != 3 {
		t.Fatalf("agent calls %d, want 3", calls.Load())
	}
}

// A decision over the per-entry bound (here a 100 KiB block body) is
// applied but not kept.
func TestDecisionCacheSkipsLargeDecision(t *testing.T) {
	u := newUpstream(t, nil)
	var calls atomic.Int64
	big := strings.Repeat("b", 100<<10)
	path := serveAgent(t, &agentFuncs{
		Base: sdk.Base{Caps: headersOnly()},
		reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
			calls.Add(1)
			switch string(m.URI) {
			case "/big":
				d.Kind, d.Status, d.Body = protocol.DecisionBlock, 403, []byte(big)
			case "/small":
				d.Kind, d.Status, d.Body = protocol.DecisionBlock, 403, []byte("no")
			}
			return nil
		},
	})
	cfg := configText(t, cacheConfig, map[string]any{"Upstream": u.addr(), "Path": path})
	p := startProxy(t, cfg, map[string]agentmux.Agent{"authz": udsAgent(t, "authz", path, nil)}, nil)
	for i := 0; i < 2; i++ {
		if resp, body := p.do(t, "GET", "/big", nil); resp.StatusCode != 403 || body != big {
			t.Fatalf("request %d: status %d, %d-byte body", i, resp.StatusCode, len(body))
		}
	}
	if calls.Load() != 2 {
		t.Fatalf("agent calls %d, want 2: the large decision was cached", calls.Load())
	}
	for i := 0; i < 2; i++ {
		if resp, body := p.do(t, "GET", "/small", nil); resp.StatusCode != 403 || body != "no" {
			t.Fatalf("small %d: status %d %q", i, resp.StatusCode, body)
		}
	}
	if calls.Load() != 3 {
		t.Fatalf("agent calls %d, want 3: the small block is cached", calls.Load())
	}
}
