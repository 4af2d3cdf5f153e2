package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/config"
)

const endpointsBase = `listeners:
  - address: 127.0.0.1:8080
upstreams:
  - name: app
    endpoints: ["10.0.0.1:80", "10.0.0.2:80", "app.internal:80"]
    health_check:
      path: /healthz
routes:
  - name: r
    upstream: app
`

func TestEndpointDefaults(t *testing.T) {
	c, err := config.Parse([]byte(endpointsBase))
	if err != nil {
		t.Fatal(err)
	}
	u := c.Upstreams[0]
	h, e, r := u.HealthCheck, u.Ejection, u.Resolve
	if u.Balance != "round_robin" || u.EndpointAttempts != 3 || h.Interval != 5*time.Second || h.Timeout != time.Second ||
		h.HealthyThreshold != 2 || h.UnhealthyThreshold != 3 || e.Consecutive5xx != 5 || e.ConsecutiveErrors != 3 ||
		e.Time != 30*time.Second || r.Interval != 0 || r.MaxAddresses != 8 || r.Timeout != 2*time.Second {
		t.Fatalf("defaults %+v", u)
	}
	if n := u.MaxEndpointCount(); n != 3 {
		t.Fatalf("MaxEndpointCount %d", n)
	}
	u.Resolve.Interval = time.Second
	if n := u.MaxEndpointCount(); n != 2+8 {
		t.Fatalf("MaxEndpointCount with resolve %d", n)
	}
	tr := c.Tracing
	if tr.Generate || tr.OTLP.Endpoint != "" || tr.OTLP.ServiceName != "sidecar" || *tr.OTLP.SampleRatio != 1 || tr.OTLP.MaxQueue != 2048 {
		t.Fatalf("tracing defaults %+v", tr)
	}
}

// TestEndpointConfigErrors: each bad endpoint or tracing key is refused
// with its path and line.
func TestEndpointConfigErrors(t *testing.T) {
	rep := func(old, new string) string { return strings.Replace(endpointsBase, old, new, 1) }
	for _, tc := range []struct{ name, yaml, want string }{
		{"both", rep("    endpoints:", "    address: 10.0.0.9:80\n    endpoints:"),
			`line 6: upstreams[0].endpoints: set address or endpoints, not both`},
		{"neither", rep(`    endpoints: ["10.0.0.1:80", "10.0.0.2:80", "app.internal:80"]`, "    endpoints: []"),
			`upstreams[0].address: address is required`},
		{"duplicate", rep(`"app.internal:80"`, `"10.0.0.1:80"`),
			`line 5: upstreams[0].endpoints[2]: endpoint "10.0.0.1:80" is listed twice`},
		{"bad endpoint", rep(`"app.internal:80"`, `"app.internal"`),
			`upstreams[0].endpoints[2]: "app.internal" is not host:port`},
		{"balance", rep("    health_check:", "    balance: random\n    health_check:"),
			`line 6: upstreams[0].balance: unknown balance "random"`},
		{"attempts", rep("    health_check:", "    endpoint_attempts: 9\n    health_check:"),
			`line 6: upstreams[0].endpoint_attempts: 9 is not in 1..8`},
		{"path", rep("path: /healthz", "path: healthz"),
			`line 7: upstreams[0].health_check.path: "healthz" is not an origin-form path`},
		{"interval", rep("path: /healthz", "path: /healthz\n      interval: 10ms"),
			`line 8: upstreams[0].health_check.interval: must be at least 100ms`},
		{"timeout", rep("path: /healthz", "path: /healthz\n      interval: 1s\n      timeout: 2s"),
			`line 9: upstreams[0].health_check.timeout: 2s is longer than the interval 1s`},
		{"threshold", rep("path: /healthz", "path: /healthz\n      unhealthy_threshold: 101"),
			`line 8: upstreams[0].health_check.unhealthy_threshold: 101 is not in 1..100`},
		{"ejection", rep("    health_check:", "    ejection: {consecutive_5xx: -2}\n    health_check:"),
			`line 6: upstreams[0].ejection.consecutive_5xx: -2 is not in 1..1000 (or -1: off)`},
		{"resolve", rep("    health_check:", "    resolve: {interval: 10ms}\n    health_check:"),
			`line 6: upstreams[0].resolve.interval: must be 0 (off) or at least 1s`},
		{"too many", rep(`["10.0.0.1:80", "10.0.0.2:80", "app.internal:80"]`, "["+strings.Repeat(`"a:1",`, 64)+`"b:1"]`),
			`upstreams[0].endpoints: 65 endpoints (at most 64)`},
		{"otlp endpoint", endpointsBase + "tracing:\n  otlp: {endpoint: collector}\n",
			`line 12: tracing.otlp.endpoint: "collector" is not host:port`},
		{"sample ratio", endpointsBase + "tracing:\n  otlp: {sample_ratio: 1.5}\n",
			`line 12: tracing.otlp.sample_ratio: 1.5 is not in 0..1`},
		{"sample ratio type", endpointsBase + "tracing:\n  otlp: {sample_ratio: half}\n",
			`tracing.otlp.sample_ratio: invalid number "half"`},
		{"batch", endpointsBase + "tracing:\n  otlp: {max_queue: 10, batch_size: 20}\n",
			`tracing.otlp.batch_size: 20 is not in 1..max_queue (10)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}
