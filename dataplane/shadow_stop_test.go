package dataplane_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// shadowWorkers counts the goroutines running a shadow agent's worker.
func shadowWorkers() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "(*shadowRunner).work(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// Shutdown ends the shadow workers, one held by a hung shadow agent
// included: none is left running once it returns.
func TestShadowWorkersEndAtShutdown(t *testing.T) {
	release := make(chan struct{})
	got := make(chan struct{}, 16)
	watch := &agentFuncs{
		Base: sdk.Base{Caps: headersOnly()},
		reqHeaders: func(ctx context.Context, _ *protocol.RequestHeaders, _ *protocol.Decision) error {
			got <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		},
	}
	p, _, _ := shadowSetup(t, watch, 8, 2)
	t.Cleanup(func() { close(release) })
	before := shadowWorkers()
	for i := 0; i < 4; i++ {
		if resp, _ := p.do(t, "GET", "/", nil); resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
	<-got // a worker holds an event in the hung agent
	if n := shadowWorkers(); n <= before {
		t.Fatalf("%d shadow workers running, want more than %d", n, before)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	if err := p.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if n := shadowWorkers(); n != before {
		t.Fatalf("%d shadow workers left after shutdown, want %d", n, before)
	}
}

// A reload that replaces a shadow agent's runner (its settings changed)
// ends the old runner's workers: an event held by a hung agent is
// canceled rather than left waiting out the agent's message timeout.
func TestShadowReloadStopsOldRunner(t *testing.T) {
	canceled := make(chan struct{}, 16)
	got := make(chan struct{}, 16)
	watch := &agentFuncs{
		Base: sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true, SupportsCancellation: true}},
		reqHeaders: func(ctx context.Context, _ *protocol.RequestHeaders, _ *protocol.Decision) error {
			got <- struct{}{}
			<-ctx.Done()
			canceled <- struct{}{}
			return nil
		},
	}
	u := newUpstream(t, nil)
	guard := serveAgent(t, &agentFuncs{Base: sdk.Base{Caps: headersOnly()}})
	watchPath := serveAgent(t, watch)
	tmpl := strings.Replace(shadowConfig, "message: 5s", "message: 1h", 1)
	data := map[string]any{"Upstream": u.addr(), "Guard": guard, "Watch": watchPath, "Queue": 8, "Workers": 1}
	cfg := configText(t, tmpl, data)
	agents := map[string]agentmux.Agent{
		"guard": udsAgent(t, "guard", guard, nil),
		"watch": udsAgent(t, "watch", watchPath, func(c *udsclient.Config) { c.MessageTimeout = time.Hour }),
	}
	p := startProxy(t, cfg, agents, nil)
	if resp, _ := p.do(t, "GET", "/", nil); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	<-got // the old runner's worker waits on the hung agent
	data["Workers"] = 2
	if err := p.srv.Swap(configText(t, tmpl, data), agents); err != nil {
		t.Fatal(err)
	}
	select {
	case <-canceled:
	case <-time.After(hangGuard):
		t.Fatal("the replaced runner's event was never canceled")
	}
}
