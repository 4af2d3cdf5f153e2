package metrics

import (
	"testing"

	"github.com/zentinelproxy/sidecar/internal/observe"
)

// TestUpstreamEndpointMetrics: the endpoint state, the endpoint retries,
// the trace context counters and the span counters are exported from the
// dataplane's snapshots at scrape time.
func TestUpstreamEndpointMetrics(t *testing.T) {
	m := newMetrics(t)
	m.SetUpstreams(func() []observe.UpstreamStatus {
		return []observe.UpstreamStatus{{Name: "app", Resolutions: 5, ResolveErrors: 1, AddressesDropped: 2,
			Endpoints: []observe.EndpointStatus{
				{Upstream: "app", Address: "10.0.0.1:80", Healthy: true, Requests: 7, Checks: 4},
				{Upstream: "app", Address: "10.0.0.2:80", Healthy: false, Ejected: true, InFlight: 1,
					Requests: 3, Errors: 2, Status5xx: 1, Ejections: 1, Checks: 4, ChecksFailed: 3},
			}}}
	})
	m.SetStats(func() observe.Stats {
		return observe.Stats{EndpointRetries: 6, TraceInvalid: 2, TracestateInvalid: 3, TraceGenerated: 9}
	})
	m.SetTracing(func() observe.TracingStats { return observe.TracingStats{Exported: 11, Failed: 1, Dropped: 4} })
	v := values(t, m.Registry())
	for k, want := range map[string]float64{
		`sidecar_upstream_endpoint_healthy{endpoint="10.0.0.1:80",upstream="app"}`:                             1,
		`sidecar_upstream_endpoint_healthy{endpoint="10.0.0.2:80",upstream="app"}`:                             0,
		`sidecar_upstream_endpoint_ejected{endpoint="10.0.0.2:80",upstream="app"}`:                             1,
		`sidecar_upstream_endpoint_in_flight{endpoint="10.0.0.2:80",upstream="app"}`:                           1,
		`sidecar_upstream_endpoint_requests_total{endpoint="10.0.0.1:80",upstream="app"}`:                      7,
		`sidecar_upstream_endpoint_failures_total{endpoint="10.0.0.2:80",kind="error",upstream="app"}`:         2,
		`sidecar_upstream_endpoint_failures_total{endpoint="10.0.0.2:80",kind="5xx",upstream="app"}`:           1,
		`sidecar_upstream_endpoint_ejections_total{endpoint="10.0.0.2:80",upstream="app"}`:                     1,
		`sidecar_upstream_endpoint_health_checks_total{endpoint="10.0.0.2:80",result="failed",upstream="app"}`: 3,
		`sidecar_upstream_endpoint_health_checks_total{endpoint="10.0.0.2:80",result="passed",upstream="app"}`: 1,
		`sidecar_upstream_resolutions_total{result="success",upstream="app"}`:                                  4,
		`sidecar_upstream_resolutions_total{result="failure",upstream="app"}`:                                  1,
		`sidecar_upstream_resolved_addresses_dropped_total{upstream="app"}`:                                    2,
		`sidecar_upstream_endpoint_retries_total`:                                                              6,
		`sidecar_trace_context_invalid_total{header="traceparent"}`:                                            2,
		`sidecar_trace_context_invalid_total{header="tracestate"}`:                                             3,
		`sidecar_trace_context_generated_total`:                                                                9,
		`sidecar_spans_total{result="exported"}`:                                                               11,
		`sidecar_spans_total{result="dropped"}`:                                                                4,
	} {
		got, ok := v[k]
		if !ok {
			t.Errorf("%s missing", k)
			continue
		}
		if got != want {
			t.Errorf("%s = %v, want %v", k, got, want)
		}
	}
}
