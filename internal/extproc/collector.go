package extproc

import (
	"github.com/prometheus/client_golang/prometheus"
)

var descEvents = prometheus.NewDesc("sidecar_extproc_events_total",
	"Events of the ext_proc transport by agent: streams opened, immediate responses, "+
		"clear_route_cache flags ignored, mode overrides honoured and refused, response fields "+
		"ignored, unsupported responses, wrong-phase and unsolicited responses, streams closed "+
		"mid-request and bodies over buffer_limit.",
	[]string{"agent", "event"}, nil)

type collector struct{}

// Collector returns a Prometheus collector of the counters of every live
// ext_proc agent of the process (sidecar_extproc_events_total).
func Collector() prometheus.Collector { return collector{} }

// Describe implements prometheus.Collector.
func (collector) Describe(ch chan<- *prometheus.Desc) { ch <- descEvents }

// Collect implements prometheus.Collector.
func (collector) Collect(ch chan<- prometheus.Metric) {
	registry.Lock()
	cs := make([]*Client, 0, len(registry.clients))
	for c := range registry.clients {
		cs = append(cs, c)
	}
	registry.Unlock()
	// An agent being replaced by a reload has two instances for a moment:
	// one series per name.
	sums := map[string]*[numEvents]uint64{}
	for _, c := range cs {
		s := sums[c.cfg.Name]
		if s == nil {
			s = new([numEvents]uint64)
			sums[c.cfg.Name] = s
		}
		for i := range c.counts {
			s[i] += c.counts[i].Load()
		}
	}
	for name, s := range sums {
		for i, v := range s {
			ch <- prometheus.MustNewConstMetric(descEvents, prometheus.CounterValue, float64(v), name, EventNames[i])
		}
	}
}
