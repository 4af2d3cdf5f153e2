package corazawaf

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/zentinelproxy/sidecar/sdk"
)

// Collector returns the agent's counters as Prometheus metrics, read at
// scrape time: register it with a registry the agent's process serves.
func (h *Handler) Collector() prometheus.Collector { return collector{h} }

var (
	descRequests = prometheus.NewDesc("corazawaf_requests_total",
		"Transactions opened (one per request).", nil, nil)
	descFlagged = prometheus.NewDesc("corazawaf_flagged_total",
		"Requests or responses the rules flagged, by action: blocked, or detected (let through).", []string{"action"}, nil)
	descClosed = prometheus.NewDesc("corazawaf_transactions_closed_early_total",
		"Transactions closed before their last event, by reason: canceled (the proxy canceled the request), timeout (the event's deadline passed while the rules ran), expired (pending_ttl), evicted (max_pending).", []string{"reason"}, nil)
	descUnmatched = prometheus.NewDesc("corazawaf_responses_uninspected_total",
		"Response headers whose request's transaction was gone (expired or evicted), passed uninspected.", nil, nil)
	descLogDropped = prometheus.NewDesc("corazawaf_log_lines_dropped_total",
		"Request log lines dropped by the log rate limit.", nil, nil)
	descOpen = prometheus.NewDesc("corazawaf_transactions_open",
		"Transactions open now.", nil, nil)
	descPending = prometheus.NewDesc("corazawaf_transactions_pending",
		"Transactions waiting for their request's next event (bounded by max_pending).", nil, nil)
	descDropped = prometheus.NewDesc("corazawaf_events_dropped_total",
		"Events the agent never started on, by reason: canceled (the proxy canceled the request first) or deadline (its timeout passed while it waited for a handler slot). Counted by the agent SDK for the whole process.", []string{"reason"}, nil)
)

type collector struct{ h *Handler }

func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRequests, descFlagged, descClosed, descUnmatched, descLogDropped, descOpen, descPending, descDropped} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.h.Stats()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(descRequests, s.Requests)
	counter(descFlagged, s.Blocked, "blocked")
	counter(descFlagged, s.Detected, "detected")
	counter(descClosed, s.Canceled, "canceled")
	counter(descClosed, s.TimedOut, "timeout")
	counter(descClosed, s.Expired, "expired")
	counter(descClosed, s.Evicted, "evicted")
	counter(descUnmatched, s.Unmatched)
	counter(descLogDropped, s.LogSuppressed)
	ch <- prometheus.MustNewConstMetric(descOpen, prometheus.GaugeValue, float64(s.Open))
	ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(c.h.Pending()))
	ds := sdk.ReadStats()
	counter(descDropped, ds.DroppedCanceled, "canceled")
	counter(descDropped, ds.DroppedExpired, "deadline")
}
