package extproc_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/extproc"
	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// startNonProcessor serves a gRPC server that does not implement
// ExternalProcessor (it has the health service only) on loopback TCP.
func startNonProcessor(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return ln.Addr().String()
}

// TestProbeNotAProcessor: a server without ExternalProcessor is connected
// to but never made ready: the agent has no live session, says why, and
// its requests find it unavailable instead of failing on the wire.
func TestProbeNotAProcessor(t *testing.T) {
	addr := startNonProcessor(t)
	cfg := extproc.DefaultConfig("proc", addr)
	c, err := extproc.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testutil.WaitFor(t, "the probe to be refused", func() bool { return c.Counts()["probes_refused"] >= 1 })
	st := c.Snapshot()
	if st.Ready || st.Connections != 0 {
		t.Errorf("ready %v with %d connections, want not ready", st.Ready, st.Connections)
	}
	if !strings.Contains(st.LastError, "does not implement envoy.service.ext_proc.v3.ExternalProcessor") || !strings.Contains(st.LastError, "Unimplemented") {
		t.Errorf("last error %q", st.LastError)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := c.WaitReady(ctx); err == nil {
		t.Error("WaitReady succeeded")
	}
	if _, err := c.Begin(wait()); !errors.Is(err, agentmux.ErrAgentUnavailable) || !strings.Contains(err.Error(), "does not implement") {
		t.Errorf("Begin: %v, want unavailable with the reason", err)
	}
}

// TestProbeProcessor: a processor answers the probe (an empty stream,
// seen by no handler logic) and the agent is ready; the probe is one
// stream per connection.
func TestProbeProcessor(t *testing.T) {
	p, addr, _ := startProcessor(t, continueAll, nil)
	c := newClient(t, addr, func(cfg *extproc.Config) { cfg.Conns = 2 })
	testutil.WaitFor(t, "both connections", func() bool { return c.Len() == 2 })
	if st := c.Snapshot(); !st.Ready || st.LastError != "" {
		t.Errorf("ready %v, last error %q", st.Ready, st.LastError)
	}
	if n := p.probes.Load(); n != 2 {
		t.Errorf("%d probes for 2 connections", n)
	}
	if len(p.received()) != 0 || p.opened.Load() != 0 {
		t.Errorf("the probe reached the processor's logic: %d messages", len(p.received()))
	}
	if n := c.Counts()["probes_refused"]; n != 0 {
		t.Errorf("probes_refused = %d", n)
	}
}
