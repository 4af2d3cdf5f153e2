package grpcclient_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/conformance"
	"github.com/zentinelproxy/sidecar/internal/grpcclient"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/sdk/grpcsdk"
)

// TestConformance runs the transport-independent conversation suite over
// gRPC on loopback TCP.
func TestConformance(t *testing.T) {
	conformance.Run(t, func(t *testing.T, h sdk.Handler) agentmux.Agent {
		return startPair(t, h, nil).client
	})
}

// TestDeadlines runs the deadline suite over gRPC.
func TestDeadlines(t *testing.T) {
	conformance.RunDeadlines(t, func(t *testing.T, h sdk.Handler, lim *sdk.Limiter) agentmux.Agent {
		return startPairWith(t, h, &grpcsdk.Options{Name: "test-agent", Limiter: lim}, nil).client
	})
}

// pair is an agent served with grpcsdk.Serve and a Client connected to it.
type pair struct {
	client *grpcclient.Client
	addr   string
	stop   func() // stops the agent (the client stays)
}

// startPair serves h on 127.0.0.1:0 and connects a Client; tweak adjusts
// the client config. Both are cleaned up with t.
func startPair(t *testing.T, h sdk.Handler, tweak func(*grpcclient.Config)) *pair {
	t.Helper()
	return startPairWith(t, h, &grpcsdk.Options{Name: "test-agent"}, tweak)
}

// startPairWith is startPair with the agent's options.
func startPairWith(t *testing.T, h sdk.Handler, opts *grpcsdk.Options, tweak func(*grpcclient.Config)) *pair {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pair{addr: ln.Addr().String()}
	p.stop = serveAgentWith(t, ln, h, opts)
	cfg := grpcclient.DefaultConfig("conformance", p.addr)
	cfg.MessageTimeout = 15 * time.Second
	cfg.MaxInFlight = 256
	if tweak != nil {
		tweak(&cfg)
	}
	c, err := grpcclient.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	p.client = c
	return p
}

// serveAgent runs grpcsdk.Serve on ln until the returned stop (also run at
// cleanup) is called.
func serveAgent(t *testing.T, ln net.Listener, h sdk.Handler, sopts ...grpcServerOption) func() {
	t.Helper()
	return serveAgentWith(t, ln, h, &grpcsdk.Options{Name: "test-agent"}, sopts...)
}

// serveAgentWith is serveAgent with the agent's options.
func serveAgentWith(t *testing.T, ln net.Listener, h sdk.Handler, opts *grpcsdk.Options, sopts ...grpcServerOption) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- grpcsdk.Serve(ctx, ln, h, opts, sopts...) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeGRPC: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}
