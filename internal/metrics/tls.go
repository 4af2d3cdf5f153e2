package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/zentinelproxy/sidecar/internal/observe"
)

// TLS listener and Upgrade tunnel metrics, read from the dataplane's
// counters at scrape time.
var (
	descTLSHandshakes = prometheus.NewDesc(Namespace+"_tls_handshakes_total",
		"TLS handshakes on the listeners by result (ok, error; refused client certificates are errors; plain_http: a plain HTTP request, answered 400).", []string{"result"}, nil)
	descTLSReloads = prometheus.NewDesc(Namespace+"_tls_certificate_reloads_total",
		"Listener certificate sets loaded (at start, reload or file change) by result (ok, error: the previous certificates stay).", []string{"result"}, nil)
	descTunnelsOpened = prometheus.NewDesc(Namespace+"_tunnels_opened_total",
		"Upgrade (WebSocket) tunnels opened after a 101 from the upstream.", nil, nil)
	descTunnelsClosed = prometheus.NewDesc(Namespace+"_tunnels_closed_total",
		"Upgrade tunnels closed, by reason (idle: tunnel_idle_timeout, shutdown: grace period over, peer: either side closed).", []string{"reason"}, nil)
	descTunnelsOpen = prometheus.NewDesc(Namespace+"_tunnels_open",
		"Upgrade tunnels open now.", nil, nil)
	descTunnelsRefused = prometheus.NewDesc(Namespace+"_tunnels_refused_total",
		"Upgrade requests answered 503 because the listener had max_tunnels open.", nil, nil)
	descTunnelBytes = prometheus.NewDesc(Namespace+"_tunnel_bytes_total",
		"Bytes relayed through Upgrade tunnels, by direction (in: client to upstream, out: upstream to client).", []string{"direction"}, nil)
)

var tlsTunnelDescs = []*prometheus.Desc{descTLSHandshakes, descTLSReloads, descTunnelsOpened,
	descTunnelsClosed, descTunnelsOpen, descTunnelsRefused, descTunnelBytes}

func collectTLSTunnels(ch chan<- prometheus.Metric, st *observe.Stats) {
	t, u := st.TLS, st.Tunnels
	ch <- prometheus.MustNewConstMetric(descTLSHandshakes, prometheus.CounterValue, float64(t.Handshakes), "ok")
	ch <- prometheus.MustNewConstMetric(descTLSHandshakes, prometheus.CounterValue, float64(t.HandshakeErrors), "error")
	ch <- prometheus.MustNewConstMetric(descTLSHandshakes, prometheus.CounterValue, float64(t.PlainHTTP), "plain_http")
	ch <- prometheus.MustNewConstMetric(descTLSReloads, prometheus.CounterValue, float64(t.Reloads), "ok")
	ch <- prometheus.MustNewConstMetric(descTLSReloads, prometheus.CounterValue, float64(t.ReloadErrors), "error")
	ch <- prometheus.MustNewConstMetric(descTunnelsOpened, prometheus.CounterValue, float64(u.Opened))
	peer := u.Closed - min(u.Closed, u.IdleClosed+u.DrainClosed)
	ch <- prometheus.MustNewConstMetric(descTunnelsClosed, prometheus.CounterValue, float64(u.IdleClosed), "idle")
	ch <- prometheus.MustNewConstMetric(descTunnelsClosed, prometheus.CounterValue, float64(u.DrainClosed), "shutdown")
	ch <- prometheus.MustNewConstMetric(descTunnelsClosed, prometheus.CounterValue, float64(peer), "peer")
	ch <- prometheus.MustNewConstMetric(descTunnelsOpen, prometheus.GaugeValue, float64(u.Open))
	ch <- prometheus.MustNewConstMetric(descTunnelsRefused, prometheus.CounterValue, float64(u.Refused))
	ch <- prometheus.MustNewConstMetric(descTunnelBytes, prometheus.CounterValue, float64(u.BytesIn), "in")
	ch <- prometheus.MustNewConstMetric(descTunnelBytes, prometheus.CounterValue, float64(u.BytesOut), "out")
}
