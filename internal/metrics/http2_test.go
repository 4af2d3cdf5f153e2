package metrics

import (
	"testing"

	"github.com/zentinelproxy/sidecar/internal/observe"
)

func TestHTTP2Metrics(t *testing.T) {
	m := newMetrics(t)
	m.SetStats(func() observe.Stats {
		return observe.Stats{
			RequestsByProtocol: map[string]uint64{"http1": 7, "h2": 5, "h2c": 3},
			HTTP2: observe.HTTP2Stats{Connections: 4, ConnectionsOpen: 2, Streams: 8, StreamsOpen: 1, RefusedStreams: 6,
				RapidResets: 1, HeaderListTooLarge: 2, ProtocolErrors: 9, GRPCAnswers: 11, ShutdownGoAways: 12, IdleClosed: 13,
				FrameTooLarge: 14, FrameSizeErrors: 15},
			Trailers: observe.TrailerStats{RequestForwarded: 16, RequestDropped: 17, RequestRefused: 18,
				ResponseForwarded: 19, ResponseDropped: 20, ResponseRefused: 21},
		}
	})
	v := values(t, m.Registry())
	for name, want := range map[string]float64{
		`sidecar_requests_by_protocol_total{protocol="http1"}`:             7,
		`sidecar_requests_by_protocol_total{protocol="h2"}`:                5,
		`sidecar_requests_by_protocol_total{protocol="h2c"}`:               3,
		`sidecar_http2_connections_total`:                                  4,
		`sidecar_http2_connections_open`:                                   2,
		`sidecar_http2_streams_open`:                                       1,
		`sidecar_http2_errors_total{kind="max_concurrent_streams"}`:        6,
		`sidecar_http2_errors_total{kind="rapid_reset"}`:                   1,
		`sidecar_http2_errors_total{kind="header_list_too_large"}`:         2,
		`sidecar_http2_errors_total{kind="protocol"}`:                      9,
		`sidecar_http2_errors_total{kind="frame_too_large"}`:               14,
		`sidecar_http2_errors_total{kind="frame_size"}`:                    15,
		`sidecar_trailers_total{direction="request",outcome="forwarded"}`:  16,
		`sidecar_trailers_total{direction="request",outcome="dropped"}`:    17,
		`sidecar_trailers_total{direction="request",outcome="refused"}`:    18,
		`sidecar_trailers_total{direction="response",outcome="forwarded"}`: 19,
		`sidecar_trailers_total{direction="response",outcome="dropped"}`:   20,
		`sidecar_trailers_total{direction="response",outcome="refused"}`:   21,
		`sidecar_http2_grpc_answers_total`:                                 11,
		`sidecar_http2_shutdown_goaways_total`:                             12,
	} {
		expect(t, v, name, want)
	}
}
