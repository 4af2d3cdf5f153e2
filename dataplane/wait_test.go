package dataplane_test

import (
	"strings"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/sdk"
)

// TestRequestBudgetEndsSlotWait: a request whose agent is at its
// in-flight limit waits for a slot at most for the agent's request budget,
// and running out of it is a timeout (504 under fail-closed), not a client
// that went away.
func TestRequestBudgetEndsSlotWait(t *testing.T) {
	path := serveAgent(t, &agentFuncs{Base: sdk.Base{Caps: headersOnly()}})
	u := newUpstream(t, nil)
	cfg := configText(t, oneAgentConfig, map[string]any{
		"Upstream": u.addr(), "Chain": "a",
		"Agents": map[string]agentSpec{"a": {Path: path, Message: "5s", Request: "100ms"}},
	})
	a := udsAgent(t, "a", path, func(c *udsclient.Config) {
		c.MessageTimeout = 5 * time.Second
		c.MaxInFlight = 1
	})
	t.Cleanup(func() { _ = a.Close() })
	// Hold the agent's only slot.
	held, err := a.Begin(agentmux.Wait{})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Finish()
	p := startProxy(t, cfg, map[string]agentmux.Agent{"a": a}, nil)
	resp, body := p.do(t, "GET", "/", nil)
	if resp.StatusCode != 504 {
		t.Fatalf("status %d (%q), want 504", resp.StatusCode, body)
	}
	if u.count() != 0 || p.srv.Stats().FailClosed != 1 {
		t.Fatalf("upstream hits %d, fail-closed %d", u.count(), p.srv.Stats().FailClosed)
	}
	if !strings.Contains(p.logs.String(), "no free slot") {
		t.Errorf("the slot wait is not what failed: %s", p.logs.String())
	}
}
