package dataplane_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/dataplane"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

const breakerConfig = `
listeners:
  - name: test
    address: 127.0.0.1:0
upstreams:
  - name: app
    address: {{.Upstream}}
agents:
  - name: slow
    transport: uds
    address: {{.Path}}
    failure_mode: {{.Failure}}
    timeouts:
      message: {{or .Message "100ms"}}
      request: {{or .Request "1s"}}
    circuit_breaker:
      failures: 3
      cooldown: {{.Cooldown}}
routes:
  - name: main
    upstream: app
    agents: [slow]
`

// hangAgent is an SDK agent that counts its request-header events and,
// while hung, answers none of them (until the proxy gives up).
type hangAgent struct {
	calls atomic.Int64
	hung  atomic.Bool
}

func (h *hangAgent) handler() sdk.Handler {
	return &agentFuncs{
		Base: sdk.Base{Caps: headersOnly()},
		reqHeaders: func(ctx context.Context, _ *protocol.RequestHeaders, _ *protocol.Decision) error {
			h.calls.Add(1)
			if h.hung.Load() {
				select {
				case <-ctx.Done():
				case <-time.After(hangGuard):
				}
			}
			return nil
		},
	}
}

func breakerSetup(t *testing.T, failure, cooldown string) (*proxy, *upstream, *hangAgent) {
	t.Helper()
	return breakerSetupTimeout(t, failure, cooldown, 100*time.Millisecond)
}

// breakerSetupTimeout is breakerSetup with the agent's message timeout
// msg: every hung request waits it out, and every answered one must beat
// it.
func breakerSetupTimeout(t *testing.T, failure, cooldown string, msg time.Duration) (*proxy, *upstream, *hangAgent) {
	t.Helper()
	u := newUpstream(t, nil)
	h := &hangAgent{}
	path := serveAgent(t, h.handler())
	cfg := configText(t, breakerConfig, map[string]any{"Upstream": u.addr(), "Path": path, "Failure": failure, "Cooldown": cooldown,
		"Message": msg.String(), "Request": max(time.Second, 2*msg).String()})
	a := udsAgent(t, "slow", path, func(c *udsclient.Config) { c.MessageTimeout = msg })
	return startProxy(t, cfg, map[string]agentmux.Agent{"slow": a}, nil), u, h
}

// onlyAgent returns the one entry of a PolicyStatus list, failing the
// test unless the list holds exactly one, for agent want.
func onlyAgent[T any](t *testing.T, list []T, agent func(T) string, want string) T {
	t.Helper()
	if len(list) != 1 || agent(list[0]) != want {
		t.Fatalf("%T %+v, want one for agent %s", list, list, want)
	}
	return list[0]
}

func circuit(t *testing.T, p *proxy) dataplane.BreakerStatus {
	t.Helper()
	return onlyAgent(t, p.srv.PolicyStatus().Circuits, func(s dataplane.BreakerStatus) string { return s.Agent }, "slow")
}

// A hung fail-open agent: after 3 timeouts the circuit opens and later
// requests pass (marked fail-open) without the agent hearing of them.
func TestBreakerOpensOnHungAgent(t *testing.T) {
	p, up, h := breakerSetup(t, "open", "10m")
	if st := circuit(t, p); st.State != dataplane.CircuitClosed {
		t.Fatalf("initial state %q", st.State)
	}
	resp, _ := p.do(t, "GET", "/", nil)
	if resp.StatusCode != 200 || h.calls.Load() != 1 {
		t.Fatalf("healthy: status %d, calls %d", resp.StatusCode, h.calls.Load())
	}
	h.hung.Store(true)
	for i := 0; i < 3; i++ {
		resp, _ := p.do(t, "GET", "/", nil)
		if resp.StatusCode != 200 || resp.Header.Get("X-Sidecar-Fail-Open") != "slow" {
			t.Fatalf("timeout %d: status %d, fail-open %q", i, resp.StatusCode, resp.Header.Get("X-Sidecar-Fail-Open"))
		}
	}
	st := circuit(t, p)
	if st.State != dataplane.CircuitOpen || st.Opens != 1 || st.Failures < 3 {
		t.Fatalf("after 3 timeouts: %+v", st)
	}
	if h.calls.Load() != 4 {
		t.Fatalf("agent calls %d, want 4", h.calls.Load())
	}
	for i := 0; i < 10; i++ {
		resp, _ := p.do(t, "GET", "/", nil)
		if resp.StatusCode != 200 || resp.Header.Get("X-Sidecar-Fail-Open") != "slow" {
			t.Fatalf("open %d: status %d", i, resp.StatusCode)
		}
	}
	if got := h.calls.Load(); got != 4 {
		t.Fatalf("agent consulted %d times while open, want 4 in all", got)
	}
	st = circuit(t, p)
	if st.Rejected != 10 || st.Probes != 0 {
		t.Fatalf("while open: %+v, want 10 rejected, no probe", st)
	}
	if got := up.last(t).Header.Get("X-Sidecar-Fail-Open"); got != "slow" {
		t.Fatalf("upstream fail-open marker %q", got)
	}
	if !strings.Contains(p.logs.String(), "agent circuit opened") {
		t.Fatalf("no log line for the opening:\n%s", p.logs.String())
	}
}

// Fail-closed: an open circuit answers 503 without consulting the agent.
func TestBreakerFailClosed(t *testing.T) {
	p, up, h := breakerSetup(t, "closed", "10m")
	h.hung.Store(true)
	for i := 0; i < 3; i++ {
		if resp, _ := p.do(t, "GET", "/", nil); resp.StatusCode != 504 {
			t.Fatalf("timeout %d: status %d, want 504", i, resp.StatusCode)
		}
	}
	for i := 0; i < 5; i++ {
		if resp, _ := p.do(t, "GET", "/", nil); resp.StatusCode != 503 {
			t.Fatalf("open %d: status %d, want 503", i, resp.StatusCode)
		}
	}
	if got := h.calls.Load(); got != 3 {
		t.Fatalf("agent calls %d, want 3", got)
	}
	if up.count() != 0 {
		t.Fatalf("upstream saw %d requests", up.count())
	}
	if st := circuit(t, p); st.State != dataplane.CircuitOpen || st.Rejected != 5 {
		t.Fatalf("state %+v", st)
	}
}

// After the cool-down a probe request reaches the agent: a failed probe
// reopens the circuit, an answered one closes it.
func TestBreakerProbe(t *testing.T) {
	p, _, h := breakerSetup(t, "open", "50ms")
	h.hung.Store(true)
	for i := 0; i < 3; i++ {
		p.do(t, "GET", "/", nil)
	}
	if st := circuit(t, p); st.State != dataplane.CircuitOpen {
		t.Fatalf("state %+v", st)
	}
	// Still hung: requests go on until one is the probe, which times out.
	deadline := time.Now().Add(hangGuard)
	for h.calls.Load() == 3 {
		if time.Now().After(deadline) {
			t.Fatal("no probe within the guard")
		}
		p.do(t, "GET", "/", nil)
	}
	st := circuit(t, p)
	if st.Probes != 1 || st.Opens != 2 || st.State != dataplane.CircuitOpen {
		t.Fatalf("after a failed probe: %+v, want 1 probe, 2 opens, open", st)
	}
	// The agent recovers: the next probe closes the circuit.
	h.hung.Store(false)
	for circuit(t, p).State != dataplane.CircuitClosed {
		if time.Now().After(deadline) {
			t.Fatal("circuit did not close within the guard")
		}
		p.do(t, "GET", "/", nil)
	}
	st = circuit(t, p)
	if st.Closes != 1 || st.Probes != 2 || st.Failures != 0 {
		t.Fatalf("after a good probe: %+v", st)
	}
	before := h.calls.Load()
	resp, _ := p.do(t, "GET", "/", nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Sidecar-Fail-Open") != "" || h.calls.Load() != before+1 {
		t.Fatalf("closed again: status %d, fail-open %q, calls %d→%d", resp.StatusCode, resp.Header.Get("X-Sidecar-Fail-Open"), before, h.calls.Load())
	}
}

// Successes between failures reset the run: no circuit opens.
func TestBreakerNeedsConsecutiveFailures(t *testing.T) {
	// The answered requests must beat the message timeout, or they count
	// as failures too and the circuit opens: 100ms, which a loaded
	// machine can miss, would make this test fail for want of CPU. Each
	// hung request waits the timeout out (8 of them).
	p, _, h := breakerSetupTimeout(t, "open", "10m", time.Second)
	for i := 0; i < 4; i++ {
		h.hung.Store(true)
		p.do(t, "GET", "/", nil)
		p.do(t, "GET", "/", nil)
		h.hung.Store(false)
		p.do(t, "GET", "/", nil)
	}
	if st := circuit(t, p); st.State != dataplane.CircuitClosed || st.Opens != 0 || st.Failures != 0 {
		t.Fatalf("state %+v, want closed with no opening", st)
	}
}

// A restarted agent (a new connection) is probed at once, without
// waiting for the cool-down, and its answer closes the circuit.
func TestBreakerProbesOnReconnect(t *testing.T) {
	u := newUpstream(t, nil)
	h := &hangAgent{}
	path := testutil.SocketPath(t)
	stop := testagent.Serve(t, path, h.handler())
	cfg := configText(t, breakerConfig, map[string]any{"Upstream": u.addr(), "Path": path, "Failure": "closed", "Cooldown": "10m"})
	a := udsAgent(t, "slow", path, func(c *udsclient.Config) { c.MessageTimeout = 100 * time.Millisecond })
	p := startProxy(t, cfg, map[string]agentmux.Agent{"slow": a}, nil)
	stop() // the agent is gone: every request fails unavailable
	for i := 0; i < 3; i++ {
		if resp, _ := p.do(t, "GET", "/", nil); resp.StatusCode != 503 {
			t.Fatalf("agent down %d: status %d", i, resp.StatusCode)
		}
	}
	if st := circuit(t, p); st.State != dataplane.CircuitOpen || st.Opens != 1 {
		t.Fatalf("after 3 failures: %+v", st)
	}
	h2 := &hangAgent{}
	testagent.Serve(t, path, h2.handler())
	// Until the proxy has reconnected the circuit refuses (503); the
	// first request after the reconnect probes and closes it, long
	// before the 10 minute cool-down.
	deadline := time.Now().Add(hangGuard)
	for circuit(t, p).State != dataplane.CircuitClosed {
		if time.Now().After(deadline) {
			t.Fatalf("circuit never closed: %+v", circuit(t, p))
		}
		p.do(t, "GET", "/", nil)
	}
	st := circuit(t, p)
	if st.Probes != 1 || st.Closes != 1 || h2.calls.Load() != 1 {
		t.Fatalf("after the reconnect: %+v, new agent asked %d times", st, h2.calls.Load())
	}
	if resp, _ := p.do(t, "GET", "/", nil); resp.StatusCode != 200 || h2.calls.Load() != 2 {
		t.Fatalf("closed: status %d, calls %d", resp.StatusCode, h2.calls.Load())
	}
}
