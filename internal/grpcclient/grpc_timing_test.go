package grpcclient_test

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc/mem"

	"github.com/zentinelproxy/sidecar/internal/conformance"
	"github.com/zentinelproxy/sidecar/internal/grpcclient"
	"github.com/zentinelproxy/sidecar/internal/grpcwire"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/sdk/grpcsdk"
)

// benchHeaders is the request of every transport's benchmarks.
func benchHeaders() *protocol.RequestHeaders { return conformance.TypicalRequestHeaders() }

var benchCaps = protocol.Capabilities{HandlesRequestHeaders: true, SupportsCancellation: true}

func benchClient(b *testing.B, conns int) *grpcclient.Client {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = grpcsdk.Serve(ctx, ln, &sdk.Base{Caps: benchCaps}, nil)
	}()
	cfg := grpcclient.DefaultConfig("bench", ln.Addr().String())
	cfg.Conns = conns
	c, err := grpcclient.NewClient(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = c.Close()
		cancel()
		<-done
	})
	if err := c.WaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	for c.Len() < conns {
		if err := c.WaitReady(ctx); err != nil {
			b.Fatal(err)
		}
	}
	return c
}

// BenchmarkGRPCRoundTrip1 is one request in flight over loopback TCP:
// RequestHeaders out, Decision back, through the proxy-side stack, gRPC
// and the Go SDK.
func BenchmarkGRPCRoundTrip1(b *testing.B) { conformance.BenchRoundTrips(b, benchClient(b, 1), 1) }

// BenchmarkGRPCRoundTrip64 keeps 64 requests in flight on one stream and
// reports decisions per second.
func BenchmarkGRPCRoundTrip64(b *testing.B) { conformance.BenchRoundTrips(b, benchClient(b, 1), 64) }

// BenchmarkGRPCRoundTrip64Conns2 spreads 64 in flight over two connections.
func BenchmarkGRPCRoundTrip64Conns2(b *testing.B) {
	conformance.BenchRoundTrips(b, benchClient(b, 2), 64)
}

// BenchmarkWireRequestHeaders encodes and decodes the typical RequestHeaders
// with the stream codec (no gRPC): the per-event protobuf cost.
func BenchmarkWireRequestHeaders(b *testing.B) {
	m := benchHeaders()
	m.RequestID = 42
	var buf []byte
	var f grpcwire.Frame
	var out protocol.RequestHeaders
	codec := grpcwire.Codec()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		var err error
		buf, err = grpcwire.AppendMessage(buf[:0], m)
		if err != nil {
			b.Fatal(err)
		}
		// The codec copies the message once, as gRPC hands it over.
		if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(buf)}, &f); err != nil {
			b.Fatal(err)
		}
		if err := f.DecodeRequestHeaders(&out); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(buf)))
}
