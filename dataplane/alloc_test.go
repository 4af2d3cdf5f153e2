package dataplane_test

import (
	"context"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// TestAllocsProxiedRequest is the allocation gate of the request path: a
// proxied GET allocates nothing in the whole process (client, proxy,
// upstream) without an agent, and with a headers agent only the agent's
// fresh per-event handler context (one allocation; see package sdk),
// whether the agent takes the upstream's view or the client's
// (client_request, with a header operation that both views apply). It
// counts every allocation of the process, so it runs without the race
// detector, after a warm-up that fills the pools.
func TestAllocsProxiedRequest(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, tc := range []struct {
		name   string
		agent  bool
		client bool
		max    float64
	}{
		{"no agent", false, false, 0},
		{"headers agent", true, false, 1},
		{"client_request agent", true, true, 2}, // two agents: one context each
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := fastUpstream(t)
			data := map[string]any{"Upstream": up, "Chain": ""}
			agents := map[string]agentmux.Agent{}
			if tc.agent {
				var spec agentSpec
				if tc.client {
					// Two agents: the first one's operation reaches the
					// second's client view through the operation log.
					first := serveAgent(t, &agentFuncs{Base: sdk.Base{Caps: headersOnly()}, reqHeaders: setHeaderOp})
					spec = agentSpec{Path: serveAgent(t, &agentFuncs{Base: sdk.Base{Caps: headersOnly()}})}
					data["Chain"] = "f, a"
					data["Agents"] = map[string]agentSpec{"f": {Path: first}, "a": spec}
					agents["f"] = udsAgent(t, "f", first, nil)
				} else {
					spec = agentSpec{Path: serveAgentUpstreamView(t, &agentFuncs{Base: sdk.Base{Caps: headersOnly()}})}
					data["Chain"] = "a"
					data["Agents"] = map[string]agentSpec{"a": spec}
				}
				agents["a"] = udsAgent(t, "a", spec.Path, nil)
				if got := agents["a"].Capabilities().SupportsClientRequest; got != tc.client {
					t.Fatalf("agent negotiated client_request %v, want %v", got, tc.client)
				}
			}
			p := startProxy(t, configText(t, oneAgentConfig, data), agents, nil)
			req := fasthttp.AcquireRequest()
			req.SetRequestURI("http://x/alloc")
			do := steadyRequest(t, p.addr, req)
			n := testing.AllocsPerRun(500, do)
			t.Logf("%.2f allocations per request", n)
			if n > tc.max {
				t.Errorf("%.2f allocations per proxied request, want at most %v", n, tc.max)
			}
		})
	}
}

// steadyRequest sends req to the proxy at addr 200 times, to warm every
// pool on the path, and returns the function that sends it once more,
// failing the test on anything but a 200: what an allocation gate runs
// under testing.AllocsPerRun.
func steadyRequest(t *testing.T, addr string, req *fasthttp.Request) func() {
	t.Helper()
	hc := &fasthttp.HostClient{Addr: addr, MaxConns: 1, ReadTimeout: 5 * time.Second}
	resp := fasthttp.AcquireResponse()
	t.Cleanup(func() { fasthttp.ReleaseResponse(resp) })
	do := func() {
		if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
			t.Fatalf("%v %d", err, resp.StatusCode())
		}
	}
	for i := 0; i < 200; i++ {
		do()
	}
	return do
}

// setHeaderOp is a request-header handler that sets one header (its
// name and value allocated once, not per call).
func setHeaderOp(_ context.Context, _ *protocol.RequestHeaders, d *protocol.Decision) error {
	d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderSet, Name: checkedName, Value: checkedValue})
	return nil
}

var checkedName, checkedValue = []byte("x-checked"), []byte("1")
