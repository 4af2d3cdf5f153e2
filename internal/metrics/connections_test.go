package metrics

import (
	"testing"

	"github.com/zentinelproxy/sidecar/internal/observe"
)

func TestConnectionMetrics(t *testing.T) {
	m := newMetrics(t)
	m.SetStats(func() observe.Stats {
		return observe.Stats{Connections: []observe.ConnStats{
			{Listener: "edge", Open: 3, Accepted: 200, RefusedMaxConnections: 171, IdleClosed: 5,
				LingeringCloses: 10, LingeringTimeouts: 2, LingeringCapped: 1, LingeringBytes: 65536},
			{Listener: "tls", Open: 1, Accepted: 1},
		}}
	})
	v := values(t, m.Registry())
	for name, want := range map[string]float64{
		`sidecar_connections_open{listener="edge"}`:                                   3,
		`sidecar_connections_open{listener="tls"}`:                                    1,
		`sidecar_connections_accepted_total{listener="edge"}`:                         200,
		`sidecar_connections_refused_total{listener="edge",reason="max_connections"}`: 171,
		`sidecar_connections_refused_total{listener="tls",reason="max_connections"}`:  0,
		`sidecar_connections_idle_closed_total{listener="edge"}`:                      5,
		`sidecar_connections_lingering_closes_total{end="client",listener="edge"}`:    7,
		`sidecar_connections_lingering_closes_total{end="timeout",listener="edge"}`:   2,
		`sidecar_connections_lingering_closes_total{end="max_bytes",listener="edge"}`: 1,
		`sidecar_connections_lingering_bytes_total{listener="edge"}`:                  65536,
	} {
		expect(t, v, name, want)
	}
}
