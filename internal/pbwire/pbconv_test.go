package pbwire_test

import (
	"fmt"

	"github.com/zentinelproxy/sidecar/grpcagent/pb"
	"github.com/zentinelproxy/sidecar/protocol"
)

// Conversions between the protocol package's messages and the generated
// protobuf messages of agent.proto: the reference the hand codec of wire.go
// is held to (the stream itself never builds the generated message graph).
//
// The …ToPB functions fill a caller-owned pb message and reuse whatever it
// already holds (header entries, nested messages) so that a message graph
// kept across calls costs no allocation; the byte fields alias the source
// and are valid only as long as it is. The …FromPB functions fill a
// protocol message (after its Reset, keeping its buffers) whose byte fields
// alias the pb message's.

// headersToPB fills dst with one entry per field line of src, reusing the
// entries dst already has.
func headersToPB(dst []*pb.Header, src protocol.Headers) []*pb.Header {
	dst = reuse(dst, len(src))
	for i := range src {
		dst[i].Name, dst[i].Value = src[i].Name, src[i].Value
	}
	return dst
}

// reuse returns dst with n entries: the messages it already has, then new
// ones.
func reuse[T any](dst []*T, n int) []*T {
	if cap(dst) < n {
		grown := make([]*T, n)
		copy(grown, dst[:cap(dst)])
		dst = grown
	}
	dst = dst[:n]
	for i := range dst {
		if dst[i] == nil {
			dst[i] = new(T)
		}
	}
	return dst
}

func headersFromPB(dst protocol.Headers, src []*pb.Header) protocol.Headers {
	for _, h := range src {
		if h != nil {
			dst = append(dst, protocol.Header{Name: h.Name, Value: h.Value})
		}
	}
	return dst
}

// RequestHeadersToPB fills dst from m.
func RequestHeadersToPB(dst *pb.RequestHeaders, m *protocol.RequestHeaders) {
	dst.Method = m.Method
	dst.Uri = m.URI
	dst.HasBody = m.HasBody
	dst.TimeoutMs = m.TimeoutMs
	dst.Headers = headersToPB(dst.Headers, m.Headers)
	md := dst.Metadata
	if md == nil {
		md = new(pb.RequestMetadata)
		dst.Metadata = md
	}
	src := &m.Metadata
	md.CorrelationId = src.CorrelationID
	md.ClientIp = src.ClientIP
	md.ClientPort = 0
	if src.ClientPort > 0 && src.ClientPort <= 0xFFFF {
		md.ClientPort = uint32(src.ClientPort)
	}
	md.Protocol = src.Protocol
	md.ServerName = src.ServerName
	md.RouteId = src.RouteID
	md.UpstreamId = src.UpstreamID
	md.Traceparent = src.Traceparent
	md.Timestamp = src.Timestamp
	md.TlsVersion = src.TLSVersion
	md.TlsCipher = src.TLSCipher
	md.TlsServerName = src.TLSServerName
	md.TlsClientSubject = src.TLSClientSubject
	md.TlsClientSan = src.TLSClientSAN
	md.ServerIp = src.ServerIP
	md.ServerPort = 0
	if src.ServerPort > 0 && src.ServerPort <= 0xFFFF {
		md.ServerPort = uint32(src.ServerPort)
	}
	md.ListenerId = src.ListenerID
	md.UpstreamHost = src.UpstreamHost
	md.ForwardedFor = src.ForwardedFor
	md.ForwardedProto = src.ForwardedProto
	md.ForwardedHost = src.ForwardedHost
	md.Path = src.Path
	dst.RequestTarget = m.RequestTarget
	if m.HasInlineBody {
		if dst.InlineBody == nil {
			dst.InlineBody = new(pb.RequestBodyChunk)
		}
		RequestBodyChunkToPB(dst.InlineBody, &m.InlineBody)
		dst.InlineBody.TimeoutMs = 0 // not sent in an inline body
	} else {
		dst.InlineBody = nil
	}
}

// RequestHeadersFromPB fills dst (reset first) from src with request id id.
func RequestHeadersFromPB(dst *protocol.RequestHeaders, id uint64, src *pb.RequestHeaders) {
	dst.Reset()
	dst.RequestID = id
	dst.Method = src.GetMethod()
	dst.URI = src.GetUri()
	dst.HasBody = src.GetHasBody()
	dst.TimeoutMs = src.GetTimeoutMs()
	dst.Headers = headersFromPB(dst.Headers, src.GetHeaders())
	if md := src.GetMetadata(); md != nil {
		dst.Metadata = protocol.Metadata{
			CorrelationID: md.CorrelationId,
			ClientIP:      md.ClientIp,
			ClientPort:    int(md.ClientPort),
			Protocol:      md.Protocol,
			ServerName:    md.ServerName,
			RouteID:       md.RouteId,
			UpstreamID:    md.UpstreamId,
			Traceparent:   md.Traceparent,
			Timestamp:     md.Timestamp,

			TLSVersion:       md.TlsVersion,
			TLSCipher:        md.TlsCipher,
			TLSServerName:    md.TlsServerName,
			TLSClientSubject: md.TlsClientSubject,
			TLSClientSAN:     md.TlsClientSan,

			ServerIP:       md.ServerIp,
			ServerPort:     int(md.ServerPort),
			ListenerID:     md.ListenerId,
			UpstreamHost:   md.UpstreamHost,
			ForwardedFor:   md.ForwardedFor,
			ForwardedProto: md.ForwardedProto,
			ForwardedHost:  md.ForwardedHost,
			Path:           md.Path,
		}
	}
	dst.RequestTarget = src.GetRequestTarget()
	if ib := src.GetInlineBody(); ib != nil {
		dst.HasInlineBody = true
		bodyChunkFromPB(&dst.InlineBody, 0, ib.GetChunkIndex(), ib.GetData(), ib.GetIsLast(), ib.TotalSize, ib.BytesReceived)
	}
}

// optInt64 points *slot at v, or sets it to nil when v is negative
// (unknown). An existing pointer is reused.
func optInt64(slot **int64, v int64) {
	if v < 0 {
		*slot = nil
		return
	}
	if *slot == nil {
		*slot = new(int64)
	}
	**slot = v
}

func fromOptInt64(p *int64) int64 {
	if p == nil || *p < 0 {
		return -1
	}
	return *p
}

// RequestBodyChunkToPB fills dst from m.
func RequestBodyChunkToPB(dst *pb.RequestBodyChunk, m *protocol.BodyChunk) {
	dst.ChunkIndex, dst.Data, dst.IsLast, dst.TimeoutMs = m.ChunkIndex, m.Data, m.IsLast, m.TimeoutMs
	optInt64(&dst.TotalSize, m.TotalSize)
	optInt64(&dst.BytesReceived, m.Progress)
}

// ResponseBodyChunkToPB fills dst from m.
func ResponseBodyChunkToPB(dst *pb.ResponseBodyChunk, m *protocol.BodyChunk) {
	dst.ChunkIndex, dst.Data, dst.IsLast, dst.TimeoutMs = m.ChunkIndex, m.Data, m.IsLast, m.TimeoutMs
	optInt64(&dst.TotalSize, m.TotalSize)
	optInt64(&dst.BytesSent, m.Progress)
}

// RequestBodyChunkFromPB fills dst (reset first) from src.
func RequestBodyChunkFromPB(dst *protocol.BodyChunk, id uint64, src *pb.RequestBodyChunk) {
	bodyChunkFromPB(dst, id, src.GetChunkIndex(), src.GetData(), src.GetIsLast(), src.TotalSize, src.BytesReceived)
	dst.TimeoutMs = src.GetTimeoutMs()
}

// ResponseBodyChunkFromPB fills dst (reset first) from src.
func ResponseBodyChunkFromPB(dst *protocol.BodyChunk, id uint64, src *pb.ResponseBodyChunk) {
	bodyChunkFromPB(dst, id, src.GetChunkIndex(), src.GetData(), src.GetIsLast(), src.TotalSize, src.BytesSent)
	dst.TimeoutMs = src.GetTimeoutMs()
}

func bodyChunkFromPB(dst *protocol.BodyChunk, id uint64, index uint32, data []byte, last bool, total, progress *int64) {
	dst.Reset()
	dst.RequestID, dst.ChunkIndex, dst.Data, dst.IsLast = id, index, data, last
	dst.TotalSize, dst.Progress = fromOptInt64(total), fromOptInt64(progress)
}

// ResponseHeadersToPB fills dst from m.
func ResponseHeadersToPB(dst *pb.ResponseHeaders, m *protocol.ResponseHeaders) {
	dst.StatusCode = 0
	if m.StatusCode > 0 {
		dst.StatusCode = uint32(m.StatusCode)
	}
	dst.Headers = headersToPB(dst.Headers, m.Headers)
	dst.HasBody = m.HasBody
	dst.TimeoutMs = m.TimeoutMs
}

// ResponseHeadersFromPB fills dst (reset first) from src.
func ResponseHeadersFromPB(dst *protocol.ResponseHeaders, id uint64, src *pb.ResponseHeaders) {
	dst.Reset()
	dst.RequestID = id
	dst.StatusCode = int(src.GetStatusCode())
	dst.Headers = headersFromPB(dst.Headers, src.GetHeaders())
	dst.HasBody = src.GetHasBody()
	dst.TimeoutMs = src.GetTimeoutMs()
}

func headerOpsToPB(dst []*pb.HeaderOp, src []protocol.HeaderOp) []*pb.HeaderOp {
	dst = reuse(dst, len(src))
	for i := range src {
		op := dst[i]
		switch src[i].Op {
		case protocol.HeaderAdd:
			op.Operation = pb.HeaderOp_ADD
		case protocol.HeaderRemove:
			op.Operation = pb.HeaderOp_REMOVE
		default:
			op.Operation = pb.HeaderOp_SET
		}
		op.Name = src[i].Name
		op.Value = src[i].Value
		if src[i].Op == protocol.HeaderRemove {
			op.Value = nil
		}
	}
	return dst
}

func headerOpsFromPB(dst []protocol.HeaderOp, src []*pb.HeaderOp) ([]protocol.HeaderOp, error) {
	for _, op := range src {
		if op == nil {
			continue
		}
		var k protocol.HeaderOpKind
		switch op.Operation {
		case pb.HeaderOp_OPERATION_UNSPECIFIED:
			k = protocol.HeaderOpUnset
		case pb.HeaderOp_SET:
			k = protocol.HeaderSet
		case pb.HeaderOp_ADD:
			k = protocol.HeaderAdd
		case pb.HeaderOp_REMOVE:
			k = protocol.HeaderRemove
		default:
			return dst, fmt.Errorf("%w: header operation %d", protocol.ErrProtocolField, int32(op.Operation))
		}
		dst = append(dst, protocol.HeaderOp{Op: k, Name: op.Name, Value: op.Value})
	}
	return dst, nil
}

// BodyMutationToPB fills dst from m.
func BodyMutationToPB(dst *pb.BodyMutation, m *protocol.BodyMutation) {
	dst.Phase = pb.Phase_PHASE_REQUEST
	if m.Phase == protocol.PhaseResponse {
		dst.Phase = pb.Phase_PHASE_RESPONSE
	}
	dst.ChunkIndex = m.ChunkIndex
	switch {
	case m.Action == protocol.MutationDrop:
		dst.Data = []byte{}
	case m.Action == protocol.MutationReplace && len(m.Data) > 0:
		dst.Data = m.Data
	case m.Action == protocol.MutationReplace:
		dst.Data = []byte{} // replacing with nothing is a drop
	default:
		dst.Data = nil
	}
}

// BodyMutationFromPB fills dst (reset first) from src. A nil src is a
// protocol error.
func BodyMutationFromPB(dst *protocol.BodyMutation, id uint64, src *pb.BodyMutation) error {
	dst.Reset()
	dst.RequestID = id
	if src == nil {
		return fmt.Errorf("%w: empty body mutation", protocol.ErrProtocolField)
	}
	return bodyMutationFromPB(dst, src)
}

// bodyMutationFromPB fills the fields src carries into dst.
func bodyMutationFromPB(dst *protocol.BodyMutation, src *pb.BodyMutation) error {
	switch src.Phase {
	case pb.Phase_PHASE_REQUEST:
		dst.Phase = protocol.PhaseRequest
	case pb.Phase_PHASE_RESPONSE:
		dst.Phase = protocol.PhaseResponse
	default:
		return fmt.Errorf("%w: body mutation phase %d", protocol.ErrProtocolField, int32(src.Phase))
	}
	dst.ChunkIndex = src.ChunkIndex
	switch {
	case src.Data == nil:
		dst.Action = protocol.MutationPass
	case len(src.Data) == 0:
		dst.Action = protocol.MutationDrop
	default:
		dst.Action = protocol.MutationReplace
		dst.Data = src.Data
	}
	return nil
}

// DecisionToPB fills dst from m. Verdict messages already in dst are reused.
func DecisionToPB(dst *pb.AgentDecision, m *protocol.Decision) {
	dst.NeedsMore = m.NeedsMore
	switch m.Kind {
	case protocol.DecisionBlock:
		w, _ := dst.Decision.(*pb.AgentDecision_Block)
		if w == nil || w.Block == nil {
			w = &pb.AgentDecision_Block{Block: new(pb.Block)}
		}
		b := w.Block
		b.Status = 0
		if m.Status > 0 {
			b.Status = uint32(m.Status)
		}
		b.Body = m.Body
		b.Headers = headersToPB(b.Headers, m.BlockHeaders)
		dst.Decision = w
	case protocol.DecisionRedirect:
		w, _ := dst.Decision.(*pb.AgentDecision_Redirect)
		if w == nil || w.Redirect == nil {
			w = &pb.AgentDecision_Redirect{Redirect: new(pb.Redirect)}
		}
		w.Redirect.Url = m.RedirectURL
		w.Redirect.Status = 0
		if m.Status > 0 {
			w.Redirect.Status = uint32(m.Status)
		}
		dst.Decision = w
	case protocol.DecisionNeedsMore:
		dst.NeedsMore = true
		if _, ok := dst.Decision.(*pb.AgentDecision_NeedsMoreDecision); !ok {
			dst.Decision = &pb.AgentDecision_NeedsMoreDecision{NeedsMoreDecision: new(pb.NeedsMore)}
		}
	default:
		if _, ok := dst.Decision.(*pb.AgentDecision_Allow); !ok {
			dst.Decision = &pb.AgentDecision_Allow{Allow: new(pb.Allow)}
		}
	}
	dst.RequestHeaders = headerOpsToPB(dst.RequestHeaders, m.RequestHeaderOps)
	dst.ResponseHeaders = headerOpsToPB(dst.ResponseHeaders, m.ResponseHeaderOps)
	dst.RequestBodyMutation = bodyMutationSlot(dst.RequestBodyMutation, m.HasRequestBodyMutation, &m.RequestBodyMutation, protocol.PhaseRequest)
	dst.ResponseBodyMutation = bodyMutationSlot(dst.ResponseBodyMutation, m.HasResponseBodyMutation, &m.ResponseBodyMutation, protocol.PhaseResponse)
	if m.Cache.Empty() {
		dst.Cache = nil
	} else {
		if dst.Cache == nil {
			dst.Cache = new(pb.CacheDirective)
		}
		dst.Cache.NoStore, dst.Cache.TtlMs = m.Cache.NoStore, m.Cache.TTLMs
	}
	if m.Audit.Empty() {
		dst.Audit = nil
		return
	}
	a := dst.Audit
	if a == nil {
		a = new(pb.AuditMetadata)
		dst.Audit = a
	}
	a.Tags = append(a.Tags[:0], m.Audit.Tags...)
	a.RuleIds = append(a.RuleIds[:0], m.Audit.RuleIDs...)
	a.ReasonCodes = append(a.ReasonCodes[:0], m.Audit.ReasonCodes...)
	a.Custom = m.Audit.Custom
	if m.Audit.HasConf {
		if a.Confidence == nil {
			a.Confidence = new(float64)
		}
		*a.Confidence = m.Audit.Confidence
	} else {
		a.Confidence = nil
	}
}

func bodyMutationSlot(slot *pb.BodyMutation, has bool, m *protocol.BodyMutation, phase protocol.Phase) *pb.BodyMutation {
	if !has {
		return nil
	}
	if slot == nil {
		slot = new(pb.BodyMutation)
	}
	mm := *m
	mm.Phase = phase
	BodyMutationToPB(slot, &mm)
	return slot
}

// DecisionFromPB fills dst (reset first) from src, syntactically like
// pbwire.Frame.DecodeDecision: no verdict leaves protocol.DecisionUnset, statuses
// stay as sent (0 included), needs_more is the field as sent, an
// unspecified header operation is protocol.HeaderOpUnset and embedded
// mutations keep what they carry; protocol.Decision.Normalize applies the
// schema. An unknown header operation or mutation phase is an error
// wrapping protocol.ErrProtocolField; dst.RequestID is set even then.
func DecisionFromPB(dst *protocol.Decision, id uint64, src *pb.AgentDecision) error {
	dst.Reset()
	dst.RequestID = id
	dst.Kind = protocol.DecisionUnset
	if src == nil {
		return nil
	}
	dst.NeedsMore = src.NeedsMore
	switch v := src.Decision.(type) {
	case *pb.AgentDecision_Allow:
		dst.Kind = protocol.DecisionAllow
	case *pb.AgentDecision_Block:
		dst.Kind = protocol.DecisionBlock
		if b := v.Block; b != nil {
			dst.Status = int(b.Status)
			dst.Body = b.Body
			dst.BlockHeaders = headersFromPB(dst.BlockHeaders, b.Headers)
		}
	case *pb.AgentDecision_Redirect:
		dst.Kind = protocol.DecisionRedirect
		if r := v.Redirect; r != nil {
			dst.Status = int(r.Status)
			dst.RedirectURL = r.Url
		}
	case *pb.AgentDecision_NeedsMoreDecision:
		dst.Kind = protocol.DecisionNeedsMore
	}
	var err error
	if dst.RequestHeaderOps, err = headerOpsFromPB(dst.RequestHeaderOps, src.RequestHeaders); err != nil {
		return err
	}
	if dst.ResponseHeaderOps, err = headerOpsFromPB(dst.ResponseHeaderOps, src.ResponseHeaders); err != nil {
		return err
	}
	if src.RequestBodyMutation != nil {
		dst.HasRequestBodyMutation = true
		if err := bodyMutationFromPB(&dst.RequestBodyMutation, src.RequestBodyMutation); err != nil {
			return err
		}
	}
	if src.ResponseBodyMutation != nil {
		dst.HasResponseBodyMutation = true
		if err := bodyMutationFromPB(&dst.ResponseBodyMutation, src.ResponseBodyMutation); err != nil {
			return err
		}
	}
	if c := src.Cache; c != nil {
		dst.Cache = protocol.CacheDirective{NoStore: c.NoStore, TTLMs: c.TtlMs}
	}
	if a := src.Audit; a != nil {
		dst.Audit.Tags = append(dst.Audit.Tags, a.Tags...)
		dst.Audit.RuleIDs = append(dst.Audit.RuleIDs, a.RuleIds...)
		dst.Audit.ReasonCodes = append(dst.Audit.ReasonCodes, a.ReasonCodes...)
		if a.Confidence != nil {
			dst.Audit.Confidence, dst.Audit.HasConf = *a.Confidence, true
		}
		if len(a.Custom) > 0 {
			dst.Audit.Custom = a.Custom
		}
	}
	return nil
}
