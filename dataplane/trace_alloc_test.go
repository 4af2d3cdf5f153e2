package dataplane_test

import (
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// tracedProxy starts a proxy without agents over three fast endpoints,
// with the tracing settings of mod, and a client for it.
func tracedProxy(tb testing.TB, mod func(*config.Tracing)) (*fasthttp.HostClient, *proxy) {
	eps := []string{fastUpstream(tb), fastUpstream(tb), fastUpstream(tb)}
	cfg := configText(tb, endpointsConfig, map[string]any{"Endpoints": strings.Join(eps, ", ")})
	if mod != nil {
		mod(&cfg.Tracing)
	}
	p := startProxy(tb, cfg, nil, nil)
	return &fasthttp.HostClient{Addr: p.addr, MaxConns: 1, ReadTimeout: 5 * time.Second}, p
}

// TestAllocsTraceEndpoints extends the allocation gate to upstreams of
// several endpoints and to trace context handling: propagating a valid
// traceparent, or making one, allocates nothing.
func TestAllocsTraceEndpoints(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, tc := range []struct {
		name     string
		generate bool
		header   string
	}{
		{"endpoints", false, ""},
		{"propagate", false, inTP},
		{"generate", true, ""},
		{"replace malformed", true, strings.ToUpper(inTP)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, p := tracedProxy(t, func(c *config.Tracing) { c.Generate = tc.generate })
			req := fasthttp.AcquireRequest()
			req.SetRequestURI("http://x/alloc")
			if tc.header != "" {
				req.Header.Set("traceparent", tc.header)
			}
			do := steadyRequest(t, p.addr, req)
			n := testing.AllocsPerRun(500, do)
			t.Logf("%.2f allocations per request", n)
			if n > 0 {
				t.Errorf("%.2f allocations per proxied request, want 0", n)
			}
		})
	}
}

// BenchmarkTracing compares a proxied GET with tracing off, with
// traceparent generation, and with every request's spans exported to an
// in-process OTLP collector (compare the rows as ratios of "off").
func BenchmarkTracing(b *testing.B) {
	for _, bc := range []struct {
		name string
		mod  func(*testing.B, *config.Tracing)
	}{
		{"off", nil},
		{"generate", func(_ *testing.B, c *config.Tracing) { c.Generate = true }},
		{"export", func(b *testing.B, c *config.Tracing) {
			col := startCollectorTB(b)
			c.OTLP.Endpoint, c.OTLP.Insecure = col.addr, true
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			hc, _ := tracedProxy(b, func(c *config.Tracing) {
				if bc.mod != nil {
					bc.mod(b, c)
				}
			})
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			req.SetRequestURI("http://x/bench")
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
					b.Fatalf("%v %d", err, resp.StatusCode())
				}
			}
		})
	}
}
