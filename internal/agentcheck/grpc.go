package agentcheck

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	"github.com/zentinelproxy/sidecar/grpcagent/pb"
	"github.com/zentinelproxy/sidecar/internal/grpcwire"
	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/protocol"
)

// grpcLink is one ProcessStream on its own client connection.
type grpcLink struct {
	inbox
	cc     *grpc.ClientConn
	stream grpc.BidiStreamingClient[pb.AgentMessage, pb.AgentMessage]
	cancel context.CancelFunc
	caps   protocol.Capabilities
	once   sync.Once
	smu    sync.Mutex
}

// grpcTarget turns a Unix socket path into a gRPC target.
func grpcTarget(addr string) string {
	if len(addr) > 0 && addr[0] == '/' {
		return "unix://" + addr
	}
	return addr
}

func dialGRPC(addr string) (*grpc.ClientConn, pb.AgentProcessorV2Client, error) {
	cc, err := grpc.NewClient(grpcTarget(addr),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(grpcwire.MaxMessageSize), grpc.MaxCallSendMsgSize(grpcwire.MaxMessageSize)))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrConnect, err)
	}
	return cc, pb.NewAgentProcessorV2Client(cc), nil
}

// capsRequest is what the checker offers: everything this proxy offers.
func capsRequest(version uint32) *pb.CapabilityRequest {
	return &pb.CapabilityRequest{ProtocolVersion: version, ClientName: "sidecar-agent-check",
		SupportedFeatures: []string{protocol.FeatureCancellation, protocol.FeatureBodyMutation, protocol.FeatureStreaming, protocol.FeatureInlineBody}}
}

// openGRPC does what the proxy does before its stream: GetCapabilities,
// HealthCheck, then ProcessStream.
func openGRPC(ctx context.Context, addr string, d time.Duration, s *strays) (*grpcLink, *pb.CapabilityResponse, error) {
	cc, cl, err := dialGRPC(addr)
	if err != nil {
		return nil, nil, err
	}
	cctx, ccancel := context.WithTimeout(ctx, d)
	defer ccancel()
	cr, err := cl.GetCapabilities(cctx, capsRequest(protocol.Version))
	if err != nil {
		_ = cc.Close()
		return nil, nil, fmt.Errorf("%w: GetCapabilities: %v", ErrConnect, err)
	}
	hr, err := cl.HealthCheck(cctx, &pb.HealthRequest{})
	if err != nil {
		_ = cc.Close()
		return nil, cr, fmt.Errorf("%w: HealthCheck: %v", ErrConnect, err)
	}
	if hr.GetStatus() != pb.HealthResponse_SERVING {
		_ = cc.Close()
		return nil, cr, fmt.Errorf("%w: HealthCheck answered %v", ErrConnect, hr.GetStatus())
	}
	sctx, cancel := context.WithCancel(ctx)
	st, err := cl.ProcessStream(sctx)
	if err != nil {
		cancel()
		_ = cc.Close()
		return nil, cr, fmt.Errorf("%w: ProcessStream: %v", ErrConnect, err)
	}
	l := &grpcLink{inbox: newInbox(s), cc: cc, stream: st, cancel: cancel, caps: grpcwire.CapabilitiesFromPB(cr.GetCapabilities())}
	go l.read()
	return l, cr, nil
}

func (l *grpcLink) read() {
	defer close(l.done)
	for {
		m, err := l.stream.Recv()
		if err != nil {
			l.err = fmt.Errorf("%w: %v", ErrClosed, err)
			return
		}
		if !l.deliver(fromPB(m)) {
			l.err = fmt.Errorf("agentcheck: more than %d unread messages from the agent", cap(l.ch))
			l.cancel()
			return
		}
	}
}

func (l *grpcLink) Caps() protocol.Capabilities { return l.caps }
func (l *grpcLink) Raw() bool                   { return false }
func (l *grpcLink) SendRaw([]byte) error        { return errNoRaw }

func (l *grpcLink) Send(msgs ...protocol.Message) ([]string, error) {
	l.smu.Lock()
	defer l.smu.Unlock()
	ev := make([]string, 0, len(msgs))
	for _, m := range msgs {
		pm, err := toPB(m)
		if err != nil {
			return ev, err
		}
		ev = append(ev, "gRPC "+shortText(pm))
		if err := l.stream.Send(pm); err != nil {
			return ev, fmt.Errorf("%w: %v", ErrClosed, err)
		}
	}
	return ev, nil
}

func (l *grpcLink) Close() {
	l.once.Do(func() {
		l.smu.Lock()
		_ = l.stream.CloseSend()
		l.smu.Unlock()
		l.cancel()
		_ = l.cc.Close()
	})
}

func shortText(m proto.Message) string {
	b, _ := prototext.MarshalOptions{}.Marshal(m)
	if len(b) > maxEvidence {
		return string(b[:maxEvidence]) + "…"
	}
	return string(b)
}

// toPB maps the events the checker sends to their gRPC form
// (docs/protocol.md §10.3), through the proxy's own encoder.
func toPB(m protocol.Message) (*pb.AgentMessage, error) {
	b, err := pbwire.AppendMessage(nil, m)
	if err != nil {
		return nil, fmt.Errorf("agentcheck: no gRPC form for %s: %w", m.MsgType(), err)
	}
	var pm pb.AgentMessage
	if err := proto.Unmarshal(b, &pm); err != nil {
		return nil, err
	}
	return &pm, nil
}

// fromPB decodes what the agent sent over gRPC into the reply the checks
// judge with the proxy's own decoder and rules (docs/protocol.md §9.3):
// the message as it came off the stream, decoded as a protobuf payload of
// the frame type its payload field stands for.
func fromPB(m *pb.AgentMessage) *reply {
	b, err := proto.Marshal(m)
	if err != nil {
		return &reply{ID: m.GetRequestId(), At: time.Now(), pbm: m, Err: err}
	}
	var f pbwire.Frame
	f.Parse(b)
	r := decodeProtobufFrame(f.Payload.MsgType(), b)
	r.pbm, r.proto = m, false
	return r
}
