package metrics

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// omCollision is the Go collector's gauge whose name is that of the
// counter go_memstats_alloc_bytes_total in OpenMetrics, where a counter's
// family drops the _total: a body with both declares one family twice,
// which strict OpenMetrics parsers refuse. It is left out: the gauge
// equals go_memstats_heap_alloc_bytes, which stays.
const omCollision = "go_memstats_alloc_bytes"

// withoutFamily wraps c, leaving out the metrics of the family name.
type withoutFamily struct {
	prometheus.Collector
	// match is how the family's name appears in a Desc's String (the
	// only accessor of its name client_golang offers).
	match string
}

func newWithoutFamily(c prometheus.Collector, name string) prometheus.Collector {
	return withoutFamily{Collector: c, match: `fqName: "` + name + `"`}
}

// Describe implements prometheus.Collector.
func (w withoutFamily) Describe(ch chan<- *prometheus.Desc) {
	all := make(chan *prometheus.Desc)
	go func() { w.Collector.Describe(all); close(all) }()
	for d := range all {
		if !strings.Contains(d.String(), w.match) {
			ch <- d
		}
	}
}

// Collect implements prometheus.Collector.
func (w withoutFamily) Collect(ch chan<- prometheus.Metric) {
	all := make(chan prometheus.Metric)
	go func() { w.Collector.Collect(all); close(all) }()
	for m := range all {
		if !strings.Contains(m.Desc().String(), w.match) {
			ch <- m
		}
	}
}
