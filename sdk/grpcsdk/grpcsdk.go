// Package grpcsdk serves an sdk.Handler over gRPC: the
// zentinel.agent.v2.AgentProcessorV2 service of grpcagent/agent.proto, one
// long-lived ProcessStream per proxy connection, requests multiplexed on
// it and handled concurrently. It is a package of its own so that agents
// served over a Unix socket or a reverse connection do not link gRPC.
package grpcsdk

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/grpcagent/pb"
	"github.com/zentinelproxy/sidecar/handshake"
	"github.com/zentinelproxy/sidecar/internal/grpcwire"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// Options tune the gRPC service. The zero value is usable.
type Options struct {
	// Name is sent as agent_name in the capability answer ("agent" if
	// empty).
	Name string
	// NoClientRequest: the capability answer does not declare
	// supports_client_request (see sdk.Options.NoClientRequest).
	NoClientRequest bool
	// Logger receives stream events (default: none).
	Logger *zerolog.Logger
	// Limiter, when set, bounds how many handler calls run at once (see
	// sdk.Limiter); share one with the agent's other transports.
	Limiter *sdk.Limiter
}

func (o *Options) defaults() Options {
	r := Options{}
	if o != nil {
		r = *o
	}
	if r.Name == "" {
		r.Name = "agent"
	}
	if r.Logger == nil {
		nop := zerolog.Nop()
		r.Logger = &nop
	}
	return r
}

// HealthChecker may be implemented by an sdk.Handler to answer the proxy's
// HealthCheck over gRPC: a non-nil error reports NOT_SERVING with the
// error's text, and the proxy stops sending new requests on that
// connection. Handlers without it are SERVING while the server runs.
type HealthChecker interface {
	Healthy(ctx context.Context) error
}

// Serve serves h as an AgentProcessorV2 on ln until ctx ends, then
// stops the server (in-flight handlers see their contexts canceled) and
// waits for the handlers to return. sopts add to or override the defaults
// of NewServer (pass grpc.Creds for TLS or mTLS).
func Serve(ctx context.Context, ln net.Listener, h sdk.Handler, opts *Options, sopts ...grpc.ServerOption) error {
	srv, svc := newGRPCServer(h, opts, sopts...)
	stop := context.AfterFunc(ctx, func() {
		svc.stopping.Store(true)
		srv.Stop()
	})
	defer stop()
	err := srv.Serve(ln)
	srv.Stop() // waits for the handlers (grpc.WaitForHandlers)
	if ctx.Err() != nil || errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// NewServer returns a gRPC server with h registered as its
// AgentProcessorV2, for embedding next to other services. Its defaults:
// 10 MiB messages both ways, keepalive, and the codec of package
// internal/grpcwire (a superset of the protobuf codec, so other protobuf
// services work unchanged). sopts add to or override them.
func NewServer(h sdk.Handler, opts *Options, sopts ...grpc.ServerOption) *grpc.Server {
	srv, _ := newGRPCServer(h, opts, sopts...)
	return srv
}

func newGRPCServer(h sdk.Handler, opts *Options, sopts ...grpc.ServerOption) (*grpc.Server, *grpcService) {
	o := opts.defaults()
	base := []grpc.ServerOption{
		grpc.ForceServerCodecV2(grpcwire.Codec()),
		grpc.MaxRecvMsgSize(grpcwire.MaxMessageSize),
		grpc.MaxSendMsgSize(grpcwire.MaxMessageSize),
		// Proxies ping idle connections every 30s by default; allow down
		// to 10s (gRPC's client floor) without a GOAWAY.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		// Stop returns only once every stream's handlers have returned.
		grpc.WaitForHandlers(true),
		// Fixed flow-control windows (see grpcwire.WindowSize).
		grpc.InitialWindowSize(grpcwire.WindowSize),
		grpc.InitialConnWindowSize(grpcwire.WindowSize),
	}
	srv := grpc.NewServer(append(base, sopts...)...)
	svc := &grpcService{h: h, o: o}
	pb.RegisterAgentProcessorV2Server(srv, svc)
	return srv, svc
}

// grpcService implements pb.AgentProcessorV2Server over a Handler.
type grpcService struct {
	pb.UnimplementedAgentProcessorV2Server
	h        sdk.Handler
	o        Options
	stopping atomic.Bool
}

// GetCapabilities answers the proxy's negotiation like the UDS handshake.
func (s *grpcService) GetCapabilities(_ context.Context, req *pb.CapabilityRequest) (*pb.CapabilityResponse, error) {
	hr := grpcwire.CapabilityRequestFromPB(req)
	caps := sdk.DeclaredCapabilities(s.h)
	if s.o.NoClientRequest {
		caps.SupportsClientRequest = false
	}
	resp, err := handshake.Answer(&hr, s.o.Name, caps)
	if err != nil {
		s.o.Logger.Warn().Err(err).Str("client", hr.ClientName).Msg("refused proxy")
	}
	return grpcwire.CapabilityResponseToPB(&resp), nil
}

// HealthCheck reports SERVING unless the server is stopping or the
// handler's HealthChecker says otherwise.
func (s *grpcService) HealthCheck(ctx context.Context, _ *pb.HealthRequest) (*pb.HealthResponse, error) {
	if s.stopping.Load() {
		return &pb.HealthResponse{Status: pb.HealthResponse_NOT_SERVING, Message: "shutting down"}, nil
	}
	if hc, ok := s.h.(HealthChecker); ok {
		if err := hc.Healthy(ctx); err != nil {
			return &pb.HealthResponse{Status: pb.HealthResponse_NOT_SERVING, Message: err.Error()}, nil
		}
	}
	return &pb.HealthResponse{Status: pb.HealthResponse_SERVING}, nil
}

// grpcSender answers through a stream's Outbox.
type grpcSender struct{ out *grpcwire.Outbox }

// Send implements sdk.Sender. A reply that finds nothing queued or being
// sent goes to the stream from the handler's goroutine, without the
// hand-off to the Outbox's sender (grpcwire.Outbox.PutDirect); otherwise
// it is queued. It only waits when gRPC's write quota for the stream is
// used up, which takes a proxy that stopped reading behind a full
// flow-control window: then until the stream ends, which is when ctx
// ends too unless that proxy still sends CancelRequest.
func (s grpcSender) Send(_ context.Context, m protocol.Message) error { return s.out.PutDirect(m) }

func (s grpcSender) SendError(id uint64, reason string) error {
	return s.out.PutAgentError(id, reason)
}

// ProcessStream serves one proxy stream: its events go to a Dispatcher
// (requests handled concurrently, events of one request in order), its
// replies to a single sender goroutine.
func (s *grpcService) ProcessStream(stream pb.AgentProcessorV2_ProcessStreamServer) error {
	log := s.o.Logger
	// The proxy bounds what is in flight; the queue only needs to hold it.
	out := grpcwire.NewOutbox(stream.SendMsg, 0, 16384)
	sendDone := make(chan error, 1)
	go func() { sendDone <- out.Run() }()
	d := sdk.NewDispatcher(stream.Context(), s.h, grpcSender{out: out})
	d.SetLimiter(s.o.Limiter)
	// Each message is received into the buffer of a pooled Event (the
	// decoded event aliases it), so receiving allocates nothing of ours; a
	// message that is not an event leaves the Event spare for the next.
	var f grpcwire.FrameInto
	var spare *sdk.Event
	defer func() {
		if spare != nil {
			sdk.ReleaseEvent(spare)
		}
	}()
	// The read loop: Serve dispatches the events next returns and may run
	// a lone request's handler in the reading goroutine (see sdk's
	// Dispatcher.Serve). gRPC does not tell whether more messages are
	// already received: only an event of an otherwise idle stream is
	// handled that way.
	next := func() (*sdk.Event, error) {
		for {
			if spare == nil {
				spare = sdk.AcquireEvent()
			}
			buf := spare.Buffer()
			f.Buf = (*buf)[:0]
			err := stream.RecvMsg(&f)
			*buf = f.Buf
			if err != nil {
				return nil, err
			}
			id := f.RequestID
			if f.Err != nil {
				log.Warn().Err(f.Err).Uint64("request_id", id).Msg("undecodable message from proxy")
				if id != 0 {
					_ = out.PutAgentError(id, "undecodable event")
				}
				continue
			}
			ev := spare
			var derr error
			switch f.Payload {
			case grpcwire.PayloadRequestHeaders:
				ev.Type = protocol.TypeRequestHeaders
				derr = f.DecodeRequestHeaders(&ev.RequestHeaders)
			case grpcwire.PayloadRequestBodyChunk:
				ev.Type = protocol.TypeRequestBodyChunk
				derr = f.DecodeBodyChunk(&ev.Chunk)
			case grpcwire.PayloadResponseHeaders:
				ev.Type = protocol.TypeResponseHeaders
				derr = f.DecodeResponseHeaders(&ev.ResponseHeaders)
			case grpcwire.PayloadResponseBodyChunk:
				ev.Type = protocol.TypeResponseBodyChunk
				derr = f.DecodeBodyChunk(&ev.Chunk)
			default:
				ev = nil
				switch f.Payload {
				case grpcwire.PayloadCancel:
					d.Cancel(id)
				case grpcwire.PayloadCancelAll:
					d.CancelAll()
				case grpcwire.PayloadPing:
					var p protocol.Pong
					if f.DecodePing((*protocol.Ping)(&p)) == nil {
						_ = out.Put(&p)
					}
				case grpcwire.PayloadPong:
				default:
					log.Debug().Uint64("request_id", id).Uint8("payload", uint8(f.Payload)).Msg("skipping stream message of unexpected type")
				}
			}
			if ev == nil {
				continue
			}
			if derr != nil {
				log.Warn().Err(derr).Uint64("request_id", id).Msg("undecodable event from proxy")
				_ = out.PutAgentError(id, "undecodable event")
				continue // the spare is reused
			}
			spare = nil
			return ev, nil
		}
	}
	err := d.Serve(next, nil)
	// The proxy is gone or the server stops: cancel the handlers, let them
	// return, then stop the sender.
	d.Close()
	out.Close(nil)
	<-sendDone
	if s.stopping.Load() || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}
