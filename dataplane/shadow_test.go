package dataplane_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/dataplane"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// shadowConfig has an enforcing agent (guard) and a shadow agent
// (watch); Bytes (shadow_queue_bytes) and Chunk (the body chunk sizes)
// are optional.
const shadowConfig = `
listeners:
  - name: test
    address: 127.0.0.1:0
upstreams:
  - name: app
    address: {{.Upstream}}
agents:
  - name: guard
    transport: uds
    address: {{.Guard}}
  - name: watch
    transport: uds
    address: {{.Watch}}
    shadow: true
    shadow_queue: {{.Queue}}
    shadow_workers: {{.Workers}}
{{- with .Bytes}}
    shadow_queue_bytes: {{.}}
{{- end}}
    timeouts:
      message: 5s
{{- with .Chunk}}
    request_body:
      chunk_size: {{.}}
    response_body:
      chunk_size: {{.}}
{{- end}}
routes:
  - name: main
    upstream: app
    agents: [watch, guard]
`

// shadowSetup starts an enforcing agent (guard, which tags the request)
// and the shadow agent h, with the route listing the shadow first.
func shadowSetup(t *testing.T, watch sdk.Handler, queue, workers int) (*proxy, *upstream, *atomic.Int64) {
	t.Helper()
	u := newUpstream(t, nil)
	var guardCalls atomic.Int64
	guard := serveAgent(t, &agentFuncs{
		Base: sdk.Base{Caps: headersOnly()},
		reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
			guardCalls.Add(1)
			d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderSet, Name: []byte("x-guard"), Value: []byte("seen")})
			return nil
		},
	})
	watchPath := serveAgent(t, watch)
	cfg := configText(t, shadowConfig, map[string]any{"Upstream": u.addr(), "Guard": guard, "Watch": watchPath, "Queue": queue, "Workers": workers})
	agents := map[string]agentmux.Agent{
		"guard": udsAgent(t, "guard", guard, nil),
		"watch": udsAgent(t, "watch", watchPath, func(c *udsclient.Config) { c.MessageTimeout = 5 * time.Second }),
	}
	return startProxy(t, cfg, agents, nil), u, &guardCalls
}

func shadowStatus(t *testing.T, p *proxy) dataplane.ShadowStatus {
	t.Helper()
	return onlyAgent(t, p.srv.PolicyStatus().Shadows, func(s dataplane.ShadowStatus) string { return s.Agent }, "watch")
}

// waitShadow polls the shadow counters until cond holds (bounded by the
// hang guard): the shadow agent answers after the request is done.
func waitShadow(t *testing.T, p *proxy, cond func(dataplane.ShadowStatus) bool) dataplane.ShadowStatus {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for {
		st := shadowStatus(t, p)
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("shadow counters never got there: %+v", st)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// A shadow agent's blocks are counted (by status and rule) and logged,
// never applied; it sees the request as the client sent it.
func TestShadowBlockIsOnlyCounted(t *testing.T) {
	var seenGuard atomic.Int64
	watch := &agentFuncs{
		Base: sdk.Base{Caps: headersOnly()},
		reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
			for _, h := range m.Headers {
				if string(h.Name) == "x-guard" {
					seenGuard.Add(1)
				}
			}
			if strings.HasPrefix(string(m.URI), "/admin") {
				d.Kind = protocol.DecisionBlock
				d.Status = 451
				d.Audit.RuleIDs = [][]byte{[]byte("admin-path")}
			}
			return nil
		},
	}
	p, up, guardCalls := shadowSetup(t, watch, 64, 4)
	for i := 0; i < 5; i++ {
		resp, body := p.do(t, "GET", "/admin/x", nil)
		if resp.StatusCode != 200 || body != "hello from upstream" {
			t.Fatalf("request %d: %d %q, want the upstream's answer", i, resp.StatusCode, body)
		}
	}
	p.do(t, "GET", "/public", nil)
	if up.count() != 6 || guardCalls.Load() != 6 {
		t.Fatalf("upstream saw %d, guard %d, want 6 each", up.count(), guardCalls.Load())
	}
	if got := up.last(t).Header.Get("X-Guard"); got != "seen" {
		t.Fatalf("guard's operation not applied: %q", got)
	}
	st := waitShadow(t, p, func(s dataplane.ShadowStatus) bool { return s.WouldBlock+s.Allowed == 6 })
	if st.WouldBlock != 5 || st.Allowed != 1 || st.Queued != 6 || st.Dropped != 0 || st.Failed != 0 {
		t.Fatalf("shadow counters %+v", st)
	}
	if st.ByStatus["451"] != 5 || st.ByRule["admin-path"] != 5 {
		t.Fatalf("by status %v, by rule %v", st.ByStatus, st.ByRule)
	}
	if seenGuard.Load() != 0 {
		t.Fatal("the shadow agent saw the enforcing agent's header operation")
	}
	if !strings.Contains(p.logs.String(), "shadow agent would block") {
		t.Fatalf("no log line for the would-be block:\n%s", p.logs.String())
	}
}

// A hung shadow agent delays nothing: requests complete while it holds
// its events, and past its queue the events are dropped and counted.
func TestShadowHungAgentDropsEvents(t *testing.T) {
	release := make(chan struct{})
	var got atomic.Int64
	watch := &agentFuncs{
		Base: sdk.Base{Caps: headersOnly()},
		reqHeaders: func(ctx context.Context, _ *protocol.RequestHeaders, _ *protocol.Decision) error {
			got.Add(1)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		},
	}
	p, up, _ := shadowSetup(t, watch, 2, 1)
	const n = 10
	for i := 0; i < n; i++ {
		// Were a request to wait for the shadow agent, it would block
		// until release, which comes only after the loop.
		if resp, _ := p.do(t, "GET", "/", nil); resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
	if up.count() != n {
		t.Fatalf("upstream saw %d, want %d", up.count(), n)
	}
	st := shadowStatus(t, p)
	// One worker holds an event, at most two wait: the rest are dropped.
	if st.Queued+st.Dropped != n || st.Queued > 3 || st.Dropped < n-3 {
		t.Fatalf("hung shadow: %+v, want %d events, at most 3 queued", st, n)
	}
	close(release)
	st = waitShadow(t, p, func(s dataplane.ShadowStatus) bool { return s.Allowed == s.Queued })
	if st.Failed != 0 || got.Load() != int64(st.Queued) {
		t.Fatalf("after release: %+v, agent got %d", st, got.Load())
	}
	if !strings.Contains(p.logs.String(), "shadow agent queue full") {
		t.Fatalf("no log line for the drops:\n%s", p.logs.String())
	}
}

// A shadow agent that is down costs requests nothing; its events fail
// and are counted.
func TestShadowAgentDown(t *testing.T) {
	p, _ := shadowDownSetup(t, headersOnly(), nil)
	for i := 0; i < 4; i++ {
		if resp, _ := p.do(t, "GET", "/", nil); resp.StatusCode != 200 || resp.Header.Get("X-Sidecar-Fail-Open") != "" {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
	st := waitShadow(t, p, func(s dataplane.ShadowStatus) bool { return s.Failed == 4 })
	if st.Allowed != 0 || st.WouldBlock != 0 || st.Queued != 4 {
		t.Fatalf("down shadow: %+v", st)
	}
}

// shadowDownSetup starts a proxy whose shadow agent (with capabilities
// caps) is closed before the first request; data adds to or overrides
// the shadowConfig fields (Queue 16, Workers 2).
func shadowDownSetup(t *testing.T, caps protocol.Capabilities, data map[string]any) (*proxy, *upstream) {
	t.Helper()
	u := newUpstream(t, nil)
	guard := serveAgent(t, &agentFuncs{Base: sdk.Base{Caps: headersOnly()}})
	watchPath := serveAgent(t, &agentFuncs{Base: sdk.Base{Caps: caps}})
	vals := map[string]any{"Upstream": u.addr(), "Guard": guard, "Watch": watchPath, "Queue": 16, "Workers": 2}
	for k, v := range data {
		vals[k] = v
	}
	cfg := configText(t, shadowConfig, vals)
	watch := udsAgent(t, "watch", watchPath, nil)
	if err := watch.Close(); err != nil {
		t.Fatal(err)
	}
	return startProxy(t, cfg, map[string]agentmux.Agent{"guard": udsAgent(t, "guard", guard, nil), "watch": watch}, nil), u
}
