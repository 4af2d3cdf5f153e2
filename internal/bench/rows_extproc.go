package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// The ext_proc row: an Envoy External Processing server that lets every
// request through, sent only the request headers, so that it compares
// with the headers-only rows of the other transports.
func init() {
	Register(Row{
		Name:  "sidecar + ext_proc agent (headers)",
		Order: 45,
		Setup: func(env *Env) (string, error) {
			a, err := env.StartExtProcAgent("allow")
			if err != nil {
				return "", err
			}
			a.Options = map[string]string{"processing_mode": "request_header_mode=SEND,response_header_mode=SKIP"}
			return env.StartSidecar(env.Config(a), nil)
		},
	})
}

// continueProcessor answers every message of a stream with CONTINUE.
type continueProcessor struct {
	extprocsvc.UnimplementedExternalProcessorServer
}

// Process implements extprocsvc.ExternalProcessorServer.
func (continueProcessor) Process(s extprocsvc.ExternalProcessor_ProcessServer) error {
	for {
		req, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		r := &extprocsvc.ProcessingResponse{}
		switch req.GetRequest().(type) {
		case *extprocsvc.ProcessingRequest_RequestHeaders:
			r.Response = &extprocsvc.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocsvc.HeadersResponse{}}
		case *extprocsvc.ProcessingRequest_ResponseHeaders:
			r.Response = &extprocsvc.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocsvc.HeadersResponse{}}
		case *extprocsvc.ProcessingRequest_RequestBody:
			r.Response = &extprocsvc.ProcessingResponse_RequestBody{RequestBody: &extprocsvc.BodyResponse{}}
		case *extprocsvc.ProcessingRequest_ResponseBody:
			r.Response = &extprocsvc.ProcessingResponse_ResponseBody{ResponseBody: &extprocsvc.BodyResponse{}}
		default:
			continue
		}
		if err := s.Send(r); err != nil {
			return err
		}
	}
}

// StartExtProcAgent serves an ext_proc processor that continues every
// request on a loopback port until the row ends, and returns its
// configuration entry (transport ext_proc; the sidecar builds its client
// with the transport's factory).
func (e *Env) StartExtProcAgent(name string) (config.Agent, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return config.Agent{}, fmt.Errorf("%w: agent %s: %v", ErrBenchSetup, name, err)
	}
	srv := grpc.NewServer()
	extprocsvc.RegisterExternalProcessorServer(srv, continueProcessor{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	stop := context.AfterFunc(e.ctx, srv.Stop)
	e.Defer(func() { stop(); srv.Stop(); <-done })
	return config.Agent{Name: name, Transport: config.TransportExtProc, Address: ln.Addr().String()}, nil
}
