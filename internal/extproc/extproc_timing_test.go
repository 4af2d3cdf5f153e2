package extproc_test

import (
	"context"
	"net"
	"testing"

	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/conformance"
	"github.com/zentinelproxy/sidecar/internal/extproc"
	"github.com/zentinelproxy/sidecar/internal/grpcclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/sdk/grpcsdk"
)

// benchExtProc is a client of a processor that answers CONTINUE, with only
// the request headers sent: one exchange is one stream, opened, one
// request_headers message each way, half-closed.
func benchExtProc(b *testing.B, conns int) agentmux.Agent {
	p, addr, _ := startProcessor(b, continueAll, nil)
	p.quiet = true
	c := newClient(b, addr, func(cfg *extproc.Config) {
		cfg.Conns = conns
		cfg.Mode.ResponseHeader = extprocfilter.ProcessingMode_SKIP
	})
	ctx := context.Background()
	for c.Len() < conns {
		if err := c.WaitReady(ctx); err != nil {
			b.Fatal(err)
		}
	}
	return c
}

// benchGRPC is the baseline: the same exchange with the sidecar's own
// gRPC transport and the Go SDK, in the same process and run.
func benchGRPC(b *testing.B) agentmux.Agent {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = grpcsdk.Serve(ctx, ln, &sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true, SupportsCancellation: true}}, nil)
	}()
	c, err := grpcclient.NewClient(grpcclient.DefaultConfig("bench", ln.Addr().String()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close(); cancel(); <-done })
	if err := c.WaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	return c
}

// BenchmarkExtProcRoundTrip1: one request in flight over loopback TCP,
// request headers to an ext_proc processor and its answer back.
func BenchmarkExtProcRoundTrip1(b *testing.B) { conformance.BenchRoundTrips(b, benchExtProc(b, 1), 1) }

// BenchmarkExtProcRoundTrip64: 64 requests (64 streams) in flight on one
// HTTP/2 connection.
func BenchmarkExtProcRoundTrip64(b *testing.B) {
	conformance.BenchRoundTrips(b, benchExtProc(b, 1), 64)
}

// BenchmarkExtProcRoundTrip64Conns2 spreads the 64 streams over two
// connections.
func BenchmarkExtProcRoundTrip64Conns2(b *testing.B) {
	conformance.BenchRoundTrips(b, benchExtProc(b, 2), 64)
}

// BenchmarkGRPCBaselineRoundTrip1 is BenchmarkExtProcRoundTrip1 over the
// sidecar's gRPC transport (one long-lived stream), for the ratio.
func BenchmarkGRPCBaselineRoundTrip1(b *testing.B) { conformance.BenchRoundTrips(b, benchGRPC(b), 1) }

// BenchmarkGRPCBaselineRoundTrip64 is BenchmarkExtProcRoundTrip64 over the
// sidecar's gRPC transport.
func BenchmarkGRPCBaselineRoundTrip64(b *testing.B) { conformance.BenchRoundTrips(b, benchGRPC(b), 64) }
