package agentcheck

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	"github.com/zentinelproxy/sidecar/grpcagent/pb"
	"github.com/zentinelproxy/sidecar/internal/grpcwire"
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
func openGRPC(ctx context.Context, addr string, d time.Duration) (*grpcLink, *pb.CapabilityResponse, error) {
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
	l := &grpcLink{inbox: newInbox(), cc: cc, stream: st, cancel: cancel, caps: grpcwire.CapabilitiesFromPB(cr.GetCapabilities())}
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
		select {
		case l.ch <- fromPB(m):
		default:
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

func pbHeaders(h protocol.Headers) []*pb.Header {
	out := make([]*pb.Header, len(h))
	for i, x := range h {
		out[i] = &pb.Header{Name: x.Name, Value: x.Value}
	}
	return out
}

func optInt(v int64) *int64 {
	if v < 0 {
		return nil
	}
	return &v
}

func pbReqChunk(c *protocol.BodyChunk) *pb.RequestBodyChunk {
	return &pb.RequestBodyChunk{ChunkIndex: c.ChunkIndex, Data: c.Data, IsLast: c.IsLast, TotalSize: optInt(c.TotalSize), BytesReceived: optInt(c.Progress)}
}

// toPB maps the events the checker sends to their gRPC form
// (docs/protocol.md §10.3).
func toPB(m protocol.Message) (*pb.AgentMessage, error) {
	switch m := m.(type) {
	case *protocol.RequestHeaders:
		md := &pb.RequestMetadata{CorrelationId: m.Metadata.CorrelationID, ClientIp: m.Metadata.ClientIP,
			ClientPort: uint32(m.Metadata.ClientPort), Protocol: m.Metadata.Protocol, ServerName: m.Metadata.ServerName,
			RouteId: m.Metadata.RouteID, UpstreamId: m.Metadata.UpstreamID}
		rh := &pb.RequestHeaders{Method: m.Method, Uri: m.URI, Headers: pbHeaders(m.Headers), HasBody: m.HasBody, Metadata: md}
		if m.HasInlineBody {
			rh.InlineBody = pbReqChunk(&m.InlineBody)
		}
		return &pb.AgentMessage{RequestId: m.RequestID, Payload: &pb.AgentMessage_RequestHeaders{RequestHeaders: rh}}, nil
	case *protocol.RequestBodyChunk:
		c := (*protocol.BodyChunk)(m)
		return &pb.AgentMessage{RequestId: c.RequestID, Payload: &pb.AgentMessage_RequestBodyChunk{RequestBodyChunk: pbReqChunk(c)}}, nil
	case *protocol.ResponseHeaders:
		return &pb.AgentMessage{RequestId: m.RequestID, Payload: &pb.AgentMessage_ResponseHeaders{ResponseHeaders: &pb.ResponseHeaders{
			StatusCode: uint32(m.StatusCode), Headers: pbHeaders(m.Headers), HasBody: m.HasBody}}}, nil
	case *protocol.ResponseBodyChunk:
		c := (*protocol.BodyChunk)(m)
		return &pb.AgentMessage{RequestId: c.RequestID, Payload: &pb.AgentMessage_ResponseBodyChunk{ResponseBodyChunk: &pb.ResponseBodyChunk{
			ChunkIndex: c.ChunkIndex, Data: c.Data, IsLast: c.IsLast, TotalSize: optInt(c.TotalSize), BytesSent: optInt(c.Progress)}}}, nil
	case *protocol.CancelRequest:
		return &pb.AgentMessage{RequestId: m.RequestID, Payload: &pb.AgentMessage_Cancel{Cancel: &pb.CancelRequest{Reason: string(m.Reason)}}}, nil
	case *protocol.CancelAll:
		return &pb.AgentMessage{Payload: &pb.AgentMessage_CancelAll{CancelAll: &pb.CancelAll{Reason: string(m.Reason)}}}, nil
	case *protocol.Ping:
		return &pb.AgentMessage{Payload: &pb.AgentMessage_Ping{Ping: &pb.Ping{Sequence: m.Sequence, TimestampMs: m.TimestampMs}}}, nil
	}
	return nil, fmt.Errorf("agentcheck: no gRPC form for %s", m.MsgType())
}

var errGRPCNoVerdict = errors.New("agentcheck: AgentDecision without a verdict")

func fromPBHeaderOps(ops []*pb.HeaderOp) ([]protocol.HeaderOp, error) {
	out := make([]protocol.HeaderOp, 0, len(ops))
	for _, o := range ops {
		var k protocol.HeaderOpKind
		switch o.GetOperation() {
		case pb.HeaderOp_SET:
			k = protocol.HeaderSet
		case pb.HeaderOp_ADD:
			k = protocol.HeaderAdd
		case pb.HeaderOp_REMOVE:
			k = protocol.HeaderRemove
		default:
			return nil, fmt.Errorf("agentcheck: header operation %v", o.GetOperation())
		}
		if len(o.GetName()) == 0 {
			return nil, errors.New("agentcheck: header operation without a name")
		}
		out = append(out, protocol.HeaderOp{Op: k, Name: o.GetName(), Value: o.GetValue()})
	}
	return out, nil
}

func fromPBMutation(m *pb.BodyMutation) (*protocol.BodyMutation, error) {
	bm := &protocol.BodyMutation{ChunkIndex: m.GetChunkIndex()}
	switch m.GetPhase() {
	case pb.Phase_PHASE_REQUEST:
		bm.Phase = protocol.PhaseRequest
	case pb.Phase_PHASE_RESPONSE:
		bm.Phase = protocol.PhaseResponse
	default:
		return nil, fmt.Errorf("agentcheck: unknown phase %v", m.GetPhase())
	}
	switch {
	case m.Data == nil:
		bm.Action = protocol.MutationPass
	case len(m.Data) == 0:
		bm.Action = protocol.MutationDrop
	default:
		bm.Action, bm.Data = protocol.MutationReplace, m.Data
	}
	return bm, nil
}

// fromPB decodes what the agent sent over gRPC into the reply the checks
// judge, with the same rules as the proxy (docs/protocol.md §9.3).
func fromPB(m *pb.AgentMessage) *reply {
	r := &reply{ID: m.GetRequestId(), At: time.Now(), pbm: m}
	switch p := m.GetPayload().(type) {
	case *pb.AgentMessage_Decision:
		r.Type = protocol.TypeDecision
		d := &protocol.Decision{RequestID: r.ID, Kind: protocol.DecisionUnset}
		ad := p.Decision
		switch v := ad.GetDecision().(type) {
		case *pb.AgentDecision_Allow:
			d.Kind = protocol.DecisionAllow
		case *pb.AgentDecision_Block:
			d.Kind, d.Status, d.Body = protocol.DecisionBlock, int(v.Block.GetStatus()), v.Block.GetBody()
			for _, h := range v.Block.GetHeaders() {
				d.BlockHeaders = d.BlockHeaders.Add(h.GetName(), h.GetValue())
			}
		case *pb.AgentDecision_Redirect:
			d.Kind, d.Status, d.RedirectURL = protocol.DecisionRedirect, int(v.Redirect.GetStatus()), v.Redirect.GetUrl()
		case *pb.AgentDecision_NeedsMoreDecision:
			d.Kind = protocol.DecisionNeedsMore
		default:
			r.Err = errGRPCNoVerdict
		}
		d.NeedsMore = ad.GetNeedsMore()
		var err error
		if d.RequestHeaderOps, err = fromPBHeaderOps(ad.GetRequestHeaders()); err != nil && r.Err == nil {
			r.Err = err
		}
		if d.ResponseHeaderOps, err = fromPBHeaderOps(ad.GetResponseHeaders()); err != nil && r.Err == nil {
			r.Err = err
		}
		if bm := ad.GetRequestBodyMutation(); bm != nil {
			if x, err := fromPBMutation(bm); err == nil {
				d.HasRequestBodyMutation, d.RequestBodyMutation = true, *x
			}
		}
		if bm := ad.GetResponseBodyMutation(); bm != nil {
			if x, err := fromPBMutation(bm); err == nil {
				d.HasResponseBodyMutation, d.ResponseBodyMutation = true, *x
			}
		}
		if r.Err == nil {
			r.Err = d.Normalize()
		}
		r.Dec = d
	case *pb.AgentMessage_BodyMutation:
		r.Type = protocol.TypeBodyMutation
		bm, err := fromPBMutation(p.BodyMutation)
		if err != nil {
			r.Err = err
		} else {
			bm.RequestID = r.ID
			r.Mut = bm
		}
	case *pb.AgentMessage_Pong:
		r.Type = protocol.TypePong
		r.Ping = &protocol.Ping{Sequence: p.Pong.GetSequence(), TimestampMs: p.Pong.GetTimestampMs()}
	case *pb.AgentMessage_Ping:
		r.Type = protocol.TypePing
		r.Ping = &protocol.Ping{Sequence: p.Ping.GetSequence(), TimestampMs: p.Ping.GetTimestampMs()}
	case *pb.AgentMessage_AgentError:
		// The gRPC agent error stands for the UDS error decision.
		r.Type = protocol.TypeDecision
		r.AgentError = p.AgentError.GetMessage()
		r.Err = fmt.Errorf("%w: %q", errAgentError, r.AgentError)
	default:
		r.Type = 0
	}
	return r
}
