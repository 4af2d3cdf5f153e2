package extauthz_test

import (
	"context"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/conformance"
	"github.com/zentinelproxy/sidecar/internal/extauthz"
	"github.com/zentinelproxy/sidecar/protocol"
)

// benchRequest is a typical browser request's headers event.
func benchRequest() *protocol.RequestHeaders {
	m := &protocol.RequestHeaders{Method: []byte("GET"), URI: []byte("/api/items?id=7")}
	for _, h := range [][2]string{
		{"host", "shop.example"}, {"user-agent", "Mozilla/5.0 (X11; Linux x86_64)"}, {"accept", "application/json"},
		{"accept-encoding", "gzip, br"}, {"accept-language", "en-GB,en;q=0.9"}, {"cookie", "session=0123456789abcdef"},
		{"authorization", "Bearer eyJhbGciOiJIUzI1NiJ9.e30.ZRrHA1JJJW8opsbCGfG_HACGpVUMN_a9IV7pAx_Zmeo"},
		{"x-request-id", "5b0c2f0e-9d43-4f0a-a3f4-5b5c1a2f1e0d"},
	} {
		m.Headers = append(m.Headers, protocol.Header{Name: []byte(h[0]), Value: []byte(h[1])})
	}
	m.Metadata.ClientIP, m.Metadata.ClientPort = []byte("10.0.0.9"), 51234
	m.Metadata.ServerIP, m.Metadata.ServerPort = []byte("10.0.0.1"), 8080
	m.Metadata.Protocol = []byte("HTTP/1.1")
	m.Metadata.CorrelationID = []byte("5b0c2f0e9d434f0a")
	return m
}

// benchClient is a client of an ext_authz server on loopback that allows
// every request.
func benchClient(b *testing.B, conns int) *extauthz.Client {
	_, addr := startAuthB(b)
	cfg := extauthz.DefaultConfig("authz", addr)
	cfg.Conns = conns
	c, err := extauthz.NewClient(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	return c
}

// BenchmarkExtAuthzRoundTrip1: one Check in flight over loopback TCP, the
// request headers out and the verdict back, measured as every transport's
// round trip is (conformance.BenchRoundTrips: cpu-µs/op is both ends).
func BenchmarkExtAuthzRoundTrip1(b *testing.B) {
	conformance.BenchRoundTrips(b, benchClient(b, 1), 1)
}

// BenchmarkExtAuthzRoundTrip64: 64 Checks in flight on one connection.
func BenchmarkExtAuthzRoundTrip64(b *testing.B) {
	conformance.BenchRoundTrips(b, benchClient(b, 1), 64)
}

// BenchmarkCheck is one request's Check conversation as the dataplane
// holds it (Begin, the request headers event, Finish) against an
// ext_authz server on loopback that allows it; the server's side is in
// the same process and so in the figures.
func BenchmarkCheck(b *testing.B) {
	c := benchClient(b, 1)
	m := benchRequest()
	cancelCh := make(chan struct{})
	b.ReportAllocs()
	cpu0 := conformance.ProcessCPU()
	for b.Loop() {
		w := agentmux.Wait{Deadline: time.Now().Add(5 * time.Second), Cancel: cancelCh}
		ex, err := c.Begin(w)
		if err != nil {
			b.Fatal(err)
		}
		r, err := ex.RequestHeaders(w, m)
		if err != nil || r.Decision.Kind != protocol.DecisionAllow {
			b.Fatal(err)
		}
		ex.Finish()
	}
	b.ReportMetric(float64((conformance.ProcessCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
}

func startAuthB(b *testing.B) (*authServer, string) {
	return startAuthTB(b, func(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		return okResponse(nil), nil
	})
}
