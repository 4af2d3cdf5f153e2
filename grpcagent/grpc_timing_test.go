package grpcagent_test

import (
	"context"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc/mem"

	"github.com/zentinelproxy/sidecar/grpcagent"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// benchHeaders is a typical request: a dozen headers and full metadata
// (the same as the UDS benchmarks').
func benchHeaders() *protocol.RequestHeaders {
	m := &protocol.RequestHeaders{Method: []byte("GET"), URI: []byte("/api/users?id=7")}
	for _, h := range [][2]string{
		{"host", "example.com"}, {"user-agent", "Mozilla/5.0 (X11; Linux x86_64)"}, {"accept", "text/html,application/xhtml+xml"},
		{"accept-encoding", "gzip, deflate, br"}, {"accept-language", "en-US,en;q=0.9"}, {"cookie", "session=abcdef0123456789"},
		{"x-request-id", "b9e2c1d4"}, {"cache-control", "no-cache"},
	} {
		m.Headers = m.Headers.Add([]byte(h[0]), []byte(h[1]))
	}
	m.Metadata = protocol.Metadata{CorrelationID: []byte("b9e2c1d4"), ClientIP: []byte("127.0.0.1"), ClientPort: 51234,
		Protocol: []byte("HTTP/1.1"), RouteID: []byte("default"), UpstreamID: []byte("app"), Timestamp: []byte("2026-11-21T10:00:00Z")}
	return m
}

var benchCaps = protocol.Capabilities{HandlesRequestHeaders: true, SupportsCancellation: true}

func benchClient(b *testing.B, conns int) *grpcagent.Client {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = sdk.ServeGRPC(ctx, ln, &sdk.Base{Caps: benchCaps}, nil)
	}()
	cfg := grpcagent.DefaultConfig("bench", ln.Addr().String())
	cfg.Conns = conns
	c, err := grpcagent.NewClient(cfg)
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
func BenchmarkGRPCRoundTrip1(b *testing.B) {
	c := benchClient(b, 1)
	m := benchHeaders()
	b.ReportAllocs()
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ex, err := c.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := ex.RequestHeaders(ctx, m); err != nil {
			b.Fatal(err)
		}
		ex.Finish()
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}

// BenchmarkGRPCRoundTrip64 keeps 64 requests in flight on one stream and
// reports decisions per second.
func BenchmarkGRPCRoundTrip64(b *testing.B) { benchInFlight(b, 64, 1) }

// BenchmarkGRPCRoundTrip64Conns2 spreads 64 in flight over two connections.
func BenchmarkGRPCRoundTrip64Conns2(b *testing.B) { benchInFlight(b, 64, 2) }

func benchInFlight(b *testing.B, workers, conns int) {
	c := benchClient(b, conns)
	b.ReportAllocs()
	ctx := context.Background()
	var wg sync.WaitGroup
	per := b.N/workers + 1
	b.ResetTimer()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := benchHeaders()
			for i := 0; i < per; i++ {
				ex, err := c.Begin(ctx)
				if err != nil {
					b.Error(err)
					return
				}
				if _, err := ex.RequestHeaders(ctx, m); err != nil {
					b.Error(err)
				}
				ex.Finish()
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(per*workers)/b.Elapsed().Seconds(), "decisions/s")
}

// BenchmarkWireRequestHeaders encodes and decodes the typical RequestHeaders
// with the stream codec (no gRPC): the per-event protobuf cost.
func BenchmarkWireRequestHeaders(b *testing.B) {
	m := benchHeaders()
	m.RequestID = 42
	var buf []byte
	var f grpcagent.Frame
	var out protocol.RequestHeaders
	codec := grpcagent.Codec()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		var err error
		buf, err = grpcagent.AppendMessage(buf[:0], protocol.TypeRequestHeaders, m)
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
