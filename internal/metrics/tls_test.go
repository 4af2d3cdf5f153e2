package metrics

import (
	"testing"

	"github.com/zentinelproxy/sidecar/internal/observe"
)

func TestTLSAndTunnelMetrics(t *testing.T) {
	m := newMetrics(t)
	m.SetStats(func() observe.Stats {
		return observe.Stats{
			TLS: observe.TLSStats{Handshakes: 10, HandshakeErrors: 3, PlainHTTP: 5, Reloads: 2, ReloadErrors: 1},
			Tunnels: observe.TunnelStats{Opened: 9, Closed: 7, Open: 2, Refused: 4, IdleClosed: 2, DrainClosed: 1,
				BytesIn: 1000, BytesOut: 5000},
		}
	})
	v := values(t, m.Registry())
	for name, want := range map[string]float64{
		`sidecar_tls_handshakes_total{result="ok"}`:             10,
		`sidecar_tls_handshakes_total{result="error"}`:          3,
		`sidecar_tls_handshakes_total{result="plain_http"}`:     5,
		`sidecar_tls_certificate_reloads_total{result="ok"}`:    2,
		`sidecar_tls_certificate_reloads_total{result="error"}`: 1,
		`sidecar_tunnels_opened_total`:                          9,
		`sidecar_tunnels_open`:                                  2,
		`sidecar_tunnels_refused_total`:                         4,
		`sidecar_tunnels_closed_total{reason="idle"}`:           2,
		`sidecar_tunnels_closed_total{reason="shutdown"}`:       1,
		`sidecar_tunnels_closed_total{reason="peer"}`:           4,
		`sidecar_tunnel_bytes_total{direction="in"}`:            1000,
		`sidecar_tunnel_bytes_total{direction="out"}`:           5000,
	} {
		expect(t, v, name, want)
	}
}
