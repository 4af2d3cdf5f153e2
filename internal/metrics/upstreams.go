package metrics

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/zentinelproxy/sidecar/internal/observe"
)

// Upstream endpoint metrics, read at scrape time from the dataplane's
// endpoint state (dataplane.Server.Upstreams).
var (
	descEPHealthy = prometheus.NewDesc(Namespace+"_upstream_endpoint_healthy",
		"1 when the endpoint's active health check passes (or there is none), else 0.", []string{"upstream", "endpoint"}, nil)
	descEPEjected = prometheus.NewDesc(Namespace+"_upstream_endpoint_ejected",
		"1 while the endpoint is ejected by the passive health check, else 0.", []string{"upstream", "endpoint"}, nil)
	descEPInFlight = prometheus.NewDesc(Namespace+"_upstream_endpoint_in_flight",
		"Requests in flight to the endpoint.", []string{"upstream", "endpoint"}, nil)
	descEPRequests = prometheus.NewDesc(Namespace+"_upstream_endpoint_requests_total",
		"Attempts sent to the endpoint (a request retried elsewhere counts once per endpoint).", []string{"upstream", "endpoint"}, nil)
	descEPFailures = prometheus.NewDesc(Namespace+"_upstream_endpoint_failures_total",
		"Endpoint failures by kind: error (connect failed, connection broken before the answer) or 5xx (answered 500–599).", []string{"upstream", "endpoint", "kind"}, nil)
	descEPEjections = prometheus.NewDesc(Namespace+"_upstream_endpoint_ejections_total",
		"Passive ejections of the endpoint (consecutive 5xx or connection errors).", []string{"upstream", "endpoint"}, nil)
	descEPChecks = prometheus.NewDesc(Namespace+"_upstream_endpoint_health_checks_total",
		"Active health checks of the endpoint by result (passed, failed).", []string{"upstream", "endpoint", "result"}, nil)
	descUpResolve = prometheus.NewDesc(Namespace+"_upstream_resolutions_total",
		"DNS re-resolutions of the upstream's endpoint names by result (success, failure).", []string{"upstream", "result"}, nil)
	descUpDropped = prometheus.NewDesc(Namespace+"_upstream_resolved_addresses_dropped_total",
		"Resolved addresses left out beyond resolve.max_addresses.", []string{"upstream"}, nil)
	descEPRetries = prometheus.NewDesc(Namespace+"_upstream_endpoint_retries_total",
		"Attempts moved to another upstream endpoint after a connection failure.", nil, nil)
	descTraceInvalid = prometheus.NewDesc(Namespace+"_trace_context_invalid_total",
		"Malformed trace context headers removed, by header (traceparent: with its tracestate; tracestate: alone).", []string{"header"}, nil)
	descTraceGenerated = prometheus.NewDesc(Namespace+"_trace_context_generated_total",
		"traceparent headers made for requests without a valid one.", nil, nil)
	descSpans = prometheus.NewDesc(Namespace+"_spans_total",
		"Trace spans by export result (exported, failed), and requests whose spans were dropped on a full queue (dropped).", []string{"result"}, nil)
)

type upstreamCollector struct {
	f       atomic.Pointer[func() []observe.UpstreamStatus]
	tracing atomic.Pointer[func() observe.TracingStats]
	stats   *atomic.Pointer[func() observe.Stats]
}

func (c *upstreamCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEPHealthy, descEPEjected, descEPInFlight, descEPRequests,
		descEPFailures, descEPEjections, descEPChecks, descUpResolve, descUpDropped,
		descEPRetries, descTraceInvalid, descTraceGenerated, descSpans} {
		ch <- d
	}
}

func (c *upstreamCollector) Collect(ch chan<- prometheus.Metric) {
	if c.stats != nil {
		if f := c.stats.Load(); f != nil {
			st := (*f)()
			ch <- prometheus.MustNewConstMetric(descEPRetries, prometheus.CounterValue, float64(st.EndpointRetries))
			ch <- prometheus.MustNewConstMetric(descTraceInvalid, prometheus.CounterValue, float64(st.TraceInvalid), "traceparent")
			ch <- prometheus.MustNewConstMetric(descTraceInvalid, prometheus.CounterValue, float64(st.TracestateInvalid), "tracestate")
			ch <- prometheus.MustNewConstMetric(descTraceGenerated, prometheus.CounterValue, float64(st.TraceGenerated))
		}
	}
	if f := c.tracing.Load(); f != nil {
		st := (*f)()
		ch <- prometheus.MustNewConstMetric(descSpans, prometheus.CounterValue, float64(st.Exported), "exported")
		ch <- prometheus.MustNewConstMetric(descSpans, prometheus.CounterValue, float64(st.Failed), "failed")
		ch <- prometheus.MustNewConstMetric(descSpans, prometheus.CounterValue, float64(st.Dropped), "dropped")
	}
	f := c.f.Load()
	if f == nil {
		return
	}
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	for _, u := range (*f)() {
		for _, e := range u.Endpoints {
			ch <- prometheus.MustNewConstMetric(descEPHealthy, prometheus.GaugeValue, b(e.Healthy), u.Name, e.Address)
			ch <- prometheus.MustNewConstMetric(descEPEjected, prometheus.GaugeValue, b(e.Ejected), u.Name, e.Address)
			ch <- prometheus.MustNewConstMetric(descEPInFlight, prometheus.GaugeValue, float64(e.InFlight), u.Name, e.Address)
			ch <- prometheus.MustNewConstMetric(descEPRequests, prometheus.CounterValue, float64(e.Requests), u.Name, e.Address)
			ch <- prometheus.MustNewConstMetric(descEPFailures, prometheus.CounterValue, float64(e.Errors), u.Name, e.Address, "error")
			ch <- prometheus.MustNewConstMetric(descEPFailures, prometheus.CounterValue, float64(e.Status5xx), u.Name, e.Address, "5xx")
			ch <- prometheus.MustNewConstMetric(descEPEjections, prometheus.CounterValue, float64(e.Ejections), u.Name, e.Address)
			ch <- prometheus.MustNewConstMetric(descEPChecks, prometheus.CounterValue, float64(e.Checks-e.ChecksFailed), u.Name, e.Address, "passed")
			ch <- prometheus.MustNewConstMetric(descEPChecks, prometheus.CounterValue, float64(e.ChecksFailed), u.Name, e.Address, "failed")
		}
		ch <- prometheus.MustNewConstMetric(descUpResolve, prometheus.CounterValue, float64(u.Resolutions-u.ResolveErrors), u.Name, "success")
		ch <- prometheus.MustNewConstMetric(descUpResolve, prometheus.CounterValue, float64(u.ResolveErrors), u.Name, "failure")
		ch <- prometheus.MustNewConstMetric(descUpDropped, prometheus.CounterValue, float64(u.AddressesDropped), u.Name)
	}
}

// SetUpstreams sets where scrapes read the upstream endpoints' state
// (dataplane.Server.Upstreams); nil stops those metrics.
func (m *Metrics) SetUpstreams(f func() []observe.UpstreamStatus) {
	if f == nil {
		m.ups.f.Store(nil)
		return
	}
	m.ups.f.Store(&f)
}

// SetTracing sets where scrapes read the span export counters
// (dataplane.Server.TracingStats); nil stops those metrics.
func (m *Metrics) SetTracing(f func() observe.TracingStats) {
	if f == nil {
		m.ups.tracing.Store(nil)
		return
	}
	m.ups.tracing.Store(&f)
}
