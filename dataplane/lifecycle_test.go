package dataplane_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/dataplane"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

const lingerConfig = `
listeners:
  - name: test
    address: 127.0.0.1:0
    lingering_timeout: {{.Linger}}
upstreams:
  - name: app
    address: {{.Upstream}}
agents:
  - name: block
    transport: uds
    address: {{.Agent}}
routes:
  - name: main
    upstream: app
    agents: [block]
`

// lingering starts a proxy whose agent blocks every request on its
// headers and leaves one connection lingering: a POST whose body is
// mostly unsent got its 403, and its client stays connected and silent.
func lingering(t *testing.T, linger string) (*dataplane.Server, net.Conn) {
	t.Helper()
	u := newUpstream(t, func(w http.ResponseWriter, _ *http.Request) {})
	path := serveAgent(t, &agentFuncs{Base: sdk.Base{Caps: headersOnly()}, reqHeaders: func(_ context.Context, _ *protocol.RequestHeaders, d *protocol.Decision) error {
		d.Kind, d.Status = protocol.DecisionBlock, 403
		return nil
	}})
	cfg := configText(t, lingerConfig, map[string]any{"Upstream": u.addr(), "Agent": path, "Linger": linger})
	p := startProxy(t, cfg, map[string]agentmux.Agent{"block": udsAgent(t, "block", path, nil)}, nil)
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(hangGuard))
	// The head and the 8 KiB fasthttp reads before the handler.
	if _, err := c.Write([]byte("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1048576\r\n\r\n" + strings.Repeat("x", 8<<10))); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: "POST"})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Fatalf("status %d, want 403", resp.StatusCode)
	}
	return p.srv, c
}

// TestShutdownWaitsForLingeringClose: the answers lingering closes protect
// were written before shutdown; Shutdown lets those closes end (each
// within lingering_timeout) before it returns.
func TestShutdownWaitsForLingeringClose(t *testing.T) {
	srv, _ := lingering(t, "300ms")
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	st := srv.Stats().Connections[0]
	if st.LingeringCloses != 1 || st.LingeringTimeouts != 1 || st.Open != 0 {
		t.Fatalf("when Shutdown returned: %+v, want the lingering close ended (at its timeout)", st)
	}
}

// TestShutdownLingeringBoundedByContext: Shutdown's context bounds its
// wait for lingering closes too.
func TestShutdownLingeringBoundedByContext(t *testing.T) {
	srv, _ := lingering(t, "1m")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Shutdown(ctx) }()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
	case <-time.After(hangGuard):
		t.Fatal("Shutdown waited for a lingering close past its context")
	}
	if st := srv.Stats().Connections[0]; st.LingeringTimeouts != 0 || st.Open != 1 {
		t.Fatalf("%+v: the close should still be lingering", st)
	}
}
