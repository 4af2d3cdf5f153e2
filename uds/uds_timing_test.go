package uds_test

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/uds"
)

// benchHeaders is a typical request: a dozen headers and full metadata.
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

type allowHandler struct{ sdk.Base }

func benchClient(b *testing.B, conns int) *uds.Client {
	path := sockPath(b)
	startAgent(b, path, &allowHandler{sdk.Base{Caps: allCaps}})
	c := newClient(b, path, func(cfg *uds.Config) { cfg.Conns = conns })
	for c.Len() < conns {
		time.Sleep(time.Millisecond)
	}
	return c
}

// BenchmarkRoundTrip1 is one request in flight: RequestHeaders out, Decision
// back, through the whole proxy-side stack and the Go SDK.
func BenchmarkRoundTrip1(b *testing.B) {
	c := benchClient(b, 1)
	m := benchHeaders()
	frame, _ := uds.AppendFrame(nil, protocol.TypeRequestHeaders, m)
	b.SetBytes(int64(len(frame)))
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
}

// BenchmarkRoundTrip64 keeps 64 requests in flight on one connection and
// reports decisions per second; Conns2 spreads them over two connections
// (the measurement behind the default of one).
func BenchmarkRoundTrip64(b *testing.B) { benchInFlight(b, 64, 1) }

// BenchmarkRoundTrip64Conns2 is BenchmarkRoundTrip64 over two connections.
func BenchmarkRoundTrip64Conns2(b *testing.B) { benchInFlight(b, 64, 2) }

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

// BenchmarkRawPingPong moves the same bytes as BenchmarkRoundTrip1 (a
// RequestHeaders frame out, an allow Decision frame back) over a bare Unix
// socket with no framing logic: the floor the protocol stack is held to.
func BenchmarkRawPingPong(b *testing.B) {
	path := sockPath(b)
	req, _ := uds.AppendFrame(nil, protocol.TypeRequestHeaders, benchHeaders())
	resp, _ := uds.AppendFrame(nil, protocol.TypeDecision, &protocol.Decision{RequestID: 1})
	ln, err := net.Listen("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		buf := make([]byte, len(req))
		for {
			if _, err := io.ReadFull(nc, buf); err != nil {
				return
			}
			if _, err := nc.Write(resp); err != nil {
				return
			}
		}
	}()
	nc, err := net.Dial("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	buf := make([]byte, len(resp))
	b.SetBytes(int64(len(req)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := nc.Write(req); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(nc, buf); err != nil {
			b.Fatal(err)
		}
	}
}
