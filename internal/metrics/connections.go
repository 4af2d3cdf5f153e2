package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/zentinelproxy/sidecar/internal/observe"
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
	descLingering = prometheus.NewDesc(Namespace+"_connections_lingering_closes_total",
		"Closes that shut the connection down for writing and discarded what the client still sent, per listener and end (client: its end of stream or reset, timeout: lingering_timeout, max_bytes: max_lingering_bytes).", []string{"listener", "end"}, nil)
	descLingeringBytes = prometheus.NewDesc(Namespace+"_connections_lingering_bytes_total",
		"Bytes discarded by lingering closes, per listener.", []string{"listener"}, nil)
)

var connDescs = []*prometheus.Desc{descConnsOpen, descConnsAccepted, descConnsRefused, descConnsIdle, descLingering, descLingeringBytes}

func collectConnections(ch chan<- prometheus.Metric, st *observe.Stats) {
	for _, c := range st.Connections {
		l := c.Listener
		ch <- prometheus.MustNewConstMetric(descConnsOpen, prometheus.GaugeValue, float64(c.Open), l)
		ch <- prometheus.MustNewConstMetric(descConnsAccepted, prometheus.CounterValue, float64(c.Accepted), l)
		ch <- prometheus.MustNewConstMetric(descConnsRefused, prometheus.CounterValue, float64(c.RefusedMaxConnections), l, "max_connections")
		ch <- prometheus.MustNewConstMetric(descConnsIdle, prometheus.CounterValue, float64(c.IdleClosed), l)
		client := c.LingeringCloses - min(c.LingeringCloses, c.LingeringTimeouts+c.LingeringCapped)
		ch <- prometheus.MustNewConstMetric(descLingering, prometheus.CounterValue, float64(client), l, "client")
		ch <- prometheus.MustNewConstMetric(descLingering, prometheus.CounterValue, float64(c.LingeringTimeouts), l, "timeout")
		ch <- prometheus.MustNewConstMetric(descLingering, prometheus.CounterValue, float64(c.LingeringCapped), l, "max_bytes")
		ch <- prometheus.MustNewConstMetric(descLingeringBytes, prometheus.CounterValue, float64(c.LingeringBytes), l)
	}
}
