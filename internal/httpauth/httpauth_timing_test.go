package httpauth_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/conformance"
	"github.com/zentinelproxy/sidecar/internal/httpauth"
)

// benchClient is a client of a forward-auth endpoint on loopback that
// answers 200 with one header to copy.
func benchClient(b *testing.B, pipeline ...int) *httpauth.Client {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Auth-User", "bench")
	}))
	b.Cleanup(hs.Close)
	cfg := httpauth.DefaultConfig("auth", hs.URL+"/auth")
	cfg.ResponseHeaders = []string{"X-Auth-User"}
	if len(pipeline) > 0 {
		cfg.Pipeline = pipeline[0]
	}
	c, err := httpauth.NewClient(cfg)
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

// BenchmarkHTTPAuthRoundTrip1: one subrequest in flight over loopback,
// measured as every transport's round trip is
// (conformance.BenchRoundTrips: cpu-µs/op is both ends).
func BenchmarkHTTPAuthRoundTrip1(b *testing.B) { conformance.BenchRoundTrips(b, benchClient(b), 1) }

// BenchmarkHTTPAuthRoundTrip64: 64 subrequests in flight (as many
// keep-alive connections).
func BenchmarkHTTPAuthRoundTrip64(b *testing.B) { conformance.BenchRoundTrips(b, benchClient(b), 64) }

// BenchmarkHTTPAuthRoundTrip1Pipelined: one subrequest in flight with
// the option pipeline on (the leader's yields stop paying and stop).
func BenchmarkHTTPAuthRoundTrip1Pipelined(b *testing.B) {
	conformance.BenchRoundTrips(b, benchClient(b, 16), 1)
}

// BenchmarkHTTPAuthRoundTrip64Pipelined: 64 subrequests in flight with
// the option pipeline (16 at most in a batch).
func BenchmarkHTTPAuthRoundTrip64Pipelined(b *testing.B) {
	conformance.BenchRoundTrips(b, benchClient(b, 16), 64)
}
