package bench

import (
	"context"
	"net"
	"sync/atomic"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	"github.com/zentinelproxy/sidecar/examples/allowagent"
	"github.com/zentinelproxy/sidecar/internal/config"
)

// Rows that price W3C trace context on the UDS headers row: without
// tracing, with a traceparent made for every request (tracing.generate),
// and with every request's spans exported over OTLP/gRPC to an
// in-process collector. Compare both with "tracing off".
func init() {
	const off = "sidecar + UDS agent (headers), tracing off"
	Register(Row{
		Name:  off,
		Order: 130,
		Setup: func(env *Env) (string, error) { return tracingRow(env, false, false) },
	})
	Register(Row{
		Name:   "sidecar + UDS agent (headers), traceparent generated",
		Order:  131,
		Versus: off,
		Setup:  func(env *Env) (string, error) { return tracingRow(env, true, false) },
	})
	Register(Row{
		Name:   "sidecar + UDS agent (headers), spans exported (OTLP)",
		Order:  132,
		Versus: off,
		Setup:  func(env *Env) (string, error) { return tracingRow(env, false, true) },
	})
}

// spanSink is an OTLP trace collector that counts and drops what it gets.
type spanSink struct {
	collectortrace.UnimplementedTraceServiceServer
	spans atomic.Int64
}

func (s *spanSink) Export(_ context.Context, r *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	for _, rs := range r.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			s.spans.Add(int64(len(ss.Spans)))
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func tracingRow(env *Env, generate, export bool) (string, error) {
	a, err := env.StartUDSAgent("allow", allowagent.New(false))
	if err != nil {
		return "", err
	}
	cfg := env.Config(a)
	cfg.Tracing = config.Tracing{Generate: generate}
	if export {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		srv := grpc.NewServer()
		collectortrace.RegisterTraceServiceServer(srv, &spanSink{})
		go func() { _ = srv.Serve(ln) }()
		env.Defer(srv.Stop)
		cfg.Tracing.OTLP = config.OTLP{Endpoint: ln.Addr().String(), Insecure: true}
	}
	return env.StartSidecar(cfg, nil)
}
