package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/zentinelproxy/sidecar/internal/observe"
)

// HTTP/2 front end metrics and requests by client protocol, read from
// the dataplane's counters at scrape time.
var (
	descRequestsByProto = prometheus.NewDesc(Namespace+"_requests_by_protocol_total",
		"Requests by the client's protocol (http1: HTTP/1.x, h2: HTTP/2 over TLS, h2c: cleartext HTTP/2).", []string{"protocol"}, nil)
	descH2Conns = prometheus.NewDesc(Namespace+"_http2_connections_total",
		"HTTP/2 client connections served.", nil, nil)
	descH2ConnsOpen = prometheus.NewDesc(Namespace+"_http2_connections_open",
		"HTTP/2 client connections open now.", nil, nil)
	descH2StreamsOpen = prometheus.NewDesc(Namespace+"_http2_streams_open",
		"HTTP/2 request streams being served now.", nil, nil)
	descH2Refused = prometheus.NewDesc(Namespace+"_http2_errors_total",
		"HTTP/2 streams and connections refused, by kind (max_concurrent_streams: a stream past the listener's limit; rapid_reset: a connection closed for resetting too many streams before their response; header_list_too_large: answered 431; frame_too_large: a connection closed for a frame over max_read_frame_size; frame_size: a frame whose length its type does not allow; protocol: every other protocol error).", []string{"kind"}, nil)
	descH2GRPC = prometheus.NewDesc(Namespace+"_http2_grpc_answers_total",
		"The sidecar's own answers (blocks, failures) sent to gRPC requests as a gRPC status.", nil, nil)
	descH2GoAway = prometheus.NewDesc(Namespace+"_http2_shutdown_goaways_total",
		"HTTP/2 connections sent a GOAWAY by a shutdown.", nil, nil)
	descH2Idle = prometheus.NewDesc(Namespace+"_http2_connections_idle_closed_total",
		"HTTP/2 connections closed after the listener's idle_timeout with no stream open.", nil, nil)
)

// descTrailers counts trailer fields: a request's (client to upstream)
// and a response's (upstream to client).
var descTrailers = prometheus.NewDesc(Namespace+"_trailers_total",
	"Trailer fields by direction (request, response) and outcome (forwarded; dropped: the far side's framing cannot carry them, as a body with a Content-Length; refused: a field RFC 9110 §6.5.1 keeps out of trailers).", []string{"direction", "outcome"}, nil)

var http2Descs = []*prometheus.Desc{descRequestsByProto, descH2Conns, descH2ConnsOpen, descH2StreamsOpen,
	descH2Refused, descH2GRPC, descH2GoAway, descH2Idle, descTrailers}

func collectHTTP2(ch chan<- prometheus.Metric, st *observe.Stats) {
	for _, p := range [...]string{"http1", "h2", "h2c"} {
		ch <- prometheus.MustNewConstMetric(descRequestsByProto, prometheus.CounterValue, float64(st.RequestsByProtocol[p]), p)
	}
	h := st.HTTP2
	ch <- prometheus.MustNewConstMetric(descH2Conns, prometheus.CounterValue, float64(h.Connections))
	ch <- prometheus.MustNewConstMetric(descH2ConnsOpen, prometheus.GaugeValue, float64(h.ConnectionsOpen))
	ch <- prometheus.MustNewConstMetric(descH2StreamsOpen, prometheus.GaugeValue, float64(h.StreamsOpen))
	ch <- prometheus.MustNewConstMetric(descH2Refused, prometheus.CounterValue, float64(h.RefusedStreams), "max_concurrent_streams")
	ch <- prometheus.MustNewConstMetric(descH2Refused, prometheus.CounterValue, float64(h.RapidResets), "rapid_reset")
	ch <- prometheus.MustNewConstMetric(descH2Refused, prometheus.CounterValue, float64(h.HeaderListTooLarge), "header_list_too_large")
	ch <- prometheus.MustNewConstMetric(descH2Refused, prometheus.CounterValue, float64(h.FrameTooLarge), "frame_too_large")
	ch <- prometheus.MustNewConstMetric(descH2Refused, prometheus.CounterValue, float64(h.FrameSizeErrors), "frame_size")
	ch <- prometheus.MustNewConstMetric(descH2Refused, prometheus.CounterValue, float64(h.ProtocolErrors), "protocol")
	ch <- prometheus.MustNewConstMetric(descH2GRPC, prometheus.CounterValue, float64(h.GRPCAnswers))
	ch <- prometheus.MustNewConstMetric(descH2GoAway, prometheus.CounterValue, float64(h.ShutdownGoAways))
	ch <- prometheus.MustNewConstMetric(descH2Idle, prometheus.CounterValue, float64(h.IdleClosed))
	t := st.Trailers
	for _, c := range [...]struct {
		dir, outcome string
		n            uint64
	}{
		{"request", "forwarded", t.RequestForwarded}, {"request", "dropped", t.RequestDropped}, {"request", "refused", t.RequestRefused},
		{"response", "forwarded", t.ResponseForwarded}, {"response", "dropped", t.ResponseDropped}, {"response", "refused", t.ResponseRefused},
	} {
		ch <- prometheus.MustNewConstMetric(descTrailers, prometheus.CounterValue, float64(c.n), c.dir, c.outcome)
	}
}
