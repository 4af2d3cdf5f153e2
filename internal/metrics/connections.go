package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/zentinelproxy/sidecar/internal/dataplane"
)

// Client connection metrics per listener, read from the dataplane's
// counters at scrape time.
var (
	descConnsOpen = prometheus.NewDesc(Namespace+"_connections_open",
		"Client connections open now per listener (counted against max_connections; tunnels count as tunnels).", []string{"listener"}, nil)
	descConnsAccepted = prometheus.NewDesc(Namespace+"_connections_accepted_total",
		"Client connections accepted per listener, refused ones included.", []string{"listener"}, nil)
	descConnsRefused = prometheus.NewDesc(Namespace+"_connections_refused_total",
		"Client connections closed unanswered right after accept, per listener and reason (max_connections: that many were open).", []string{"listener", "reason"}, nil)
	descConnsIdle = prometheus.NewDesc(Namespace+"_connections_idle_closed_total",
		"Client connections closed unanswered at read_timeout because no byte of a first request arrived, per listener.", []string{"listener"}, nil)
)

var connDescs = []*prometheus.Desc{descConnsOpen, descConnsAccepted, descConnsRefused, descConnsIdle}

func collectConnections(ch chan<- prometheus.Metric, st *dataplane.Stats) {
	for _, c := range st.Connections {
		l := c.Listener
		ch <- prometheus.MustNewConstMetric(descConnsOpen, prometheus.GaugeValue, float64(c.Open), l)
		ch <- prometheus.MustNewConstMetric(descConnsAccepted, prometheus.CounterValue, float64(c.Accepted), l)
		ch <- prometheus.MustNewConstMetric(descConnsRefused, prometheus.CounterValue, float64(c.RefusedMaxConnections), l, "max_connections")
		ch <- prometheus.MustNewConstMetric(descConnsIdle, prometheus.CounterValue, float64(c.IdleClosed), l)
	}
}
