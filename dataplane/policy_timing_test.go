package dataplane_test

import (
	"context"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

const policyBenchConfig = `
listeners:
  - name: test
    address: 127.0.0.1:0
upstreams:
  - name: app
    address: {{.Upstream}}
agents:
  - name: guard
    transport: uds
    address: {{.Guard}}
{{- if .Cache}}
    decision_cache:
      key: [method, path]
{{- end}}
{{- if .Watch}}
  - name: watch
    transport: uds
    address: {{.Watch}}
    shadow: true
{{- end}}
routes:
  - name: main
    upstream: app
    agents: [guard{{if .Watch}}, watch{{end}}]
`

// BenchmarkPolicy prices the policy features on the headers-agent path,
// as sub-benchmarks of one run (compare their ns/op as ratios): the
// enforcing agent alone, with a shadow agent that takes 100 ms per event
// next to it (the request must not wait for it), with one that answers at
// once (every event is queued and sent, none dropped), and with a warm
// decision cache.
func BenchmarkPolicy(b *testing.B) {
	for _, tc := range []struct {
		name                string
		shadow, slow, cache bool
	}{
		{"headers agent", false, false, false},
		{"headers agent + slow shadow", true, true, false},
		{"headers agent + shadow", true, false, false},
		{"headers agent, cache warm", false, false, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			up := fastUpstream(b)
			guard := serveAgent(b, &agentFuncs{Base: sdk.Base{Caps: headersOnly()}})
			data := map[string]any{"Upstream": up, "Guard": guard, "Cache": tc.cache}
			agents := map[string]agentmux.Agent{"guard": udsAgent(b, "guard", guard, nil)}
			if tc.shadow {
				watch := serveAgent(b, &agentFuncs{
					Base: sdk.Base{Caps: headersOnly()},
					reqHeaders: func(ctx context.Context, _ *protocol.RequestHeaders, _ *protocol.Decision) error {
						if !tc.slow {
							return nil
						}
						select {
						case <-time.After(100 * time.Millisecond):
						case <-ctx.Done():
						}
						return nil
					},
				})
				data["Watch"] = watch
				agents["watch"] = udsAgent(b, "watch", watch, nil)
			}
			p := startProxy(b, configText(b, policyBenchConfig, data), agents, nil)
			hc := &fasthttp.HostClient{Addr: p.addr, MaxConns: 256, ReadTimeout: 5 * time.Second}
			b.ReportAllocs()
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
				req.SetRequestURI("http://x/bench")
				for pb.Next() {
					if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
						b.Errorf("%v %d", err, resp.StatusCode())
						return
					}
				}
			})
		})
	}
}
