// Package pbwire is the protobuf wire format of the agent protocol's
// stream messages (the AgentMessage envelope of agent.proto and its
// payloads), encoded and decoded by hand: no reflection, no generated
// message graph, no allocation per field. The gRPC transport sends these
// bytes as its stream messages; the UDS and reverse transports carry the
// same bytes as frame payloads when both ends negotiate
// protobuf_payloads (docs/protocol.md §2.7, "Protobuf payloads"). It depends on
// protowire alone, so that a UDS-only agent links no gRPC.
package pbwire

import (
	"errors"
	"fmt"
	"math"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/zentinelproxy/sidecar/protocol"
)

// The stream's hot path encodes protocol messages straight into the
// protobuf wire format of agent.proto and decodes it straight back,
// without the generated message graph: no reflection, no allocation per
// field. The generated types in pb/ remain the wire schema; wire_test.go
// holds the hand codec to them (through the conversions of pbconv_test.go)
// in both directions. Decoding is syntactic, as for the JSON codec: the
// protocol's rules for a Decision are protocol.Decision.Normalize's.

// Errors of the wire format. Wrapped with details; test with errors.Is.
var (
	// ErrMessageType: a message of a type the stream does not carry
	// (handshake and registration), or one that cannot be encoded.
	ErrMessageType = errors.New("agent protocol: unsupported message type")
	// ErrMalformed: bytes that are not a valid AgentMessage.
	ErrMalformed = errors.New("agent protocol: malformed protobuf message")
)

// Field numbers of agent.proto.
const (
	fEnvRequestID        = 1
	fEnvRequestHeaders   = 2
	fEnvRequestChunk     = 3
	fEnvResponseHeaders  = 4
	fEnvResponseChunk    = 5
	fEnvDecision         = 6
	fEnvCancel           = 7
	fEnvBodyMutation     = 8
	fEnvCancelAll        = 9
	fEnvPing             = 10
	fEnvPong             = 11
	fEnvAgentError       = 12
	fEnvMaxKnownPayload  = 12
	fHeaderName          = 1
	fHeaderValue         = 2
	fReqMethod           = 1
	fReqURI              = 2
	fReqHeaders          = 3
	fReqHasBody          = 4
	fReqMetadata         = 5
	fReqInlineBody       = 6
	fEventTimeout        = 15 // timeout_ms of every event an agent answers
	fReqRequestTarget    = 16
	fChunkIndex          = 1
	fChunkData           = 2
	fChunkIsLast         = 3
	fChunkTotal          = 4
	fChunkProgress       = 5
	fRespStatus          = 1
	fRespHeaders         = 2
	fRespHasBody         = 3
	fDecAllow            = 1
	fDecBlock            = 2
	fDecRedirect         = 3
	fDecNeedsMoreVerdict = 4
	fDecRequestOps       = 5
	fDecResponseOps      = 6
	fDecNeedsMore        = 7
	fDecRequestMutation  = 8
	fDecResponseMutation = 9
	fDecAudit            = 10
	fDecCache            = 11
	fCacheNoStore        = 1
	fCacheTTL            = 2
	fBlockStatus         = 1
	fBlockBody           = 2
	fBlockHeaders        = 3
	fRedirectURL         = 1
	fRedirectStatus      = 2
	fOpOperation         = 1
	fOpName              = 2
	fOpValue             = 3
	fAuditTags           = 1
	fAuditRuleIDs        = 2
	fAuditConfidence     = 3
	fAuditReasonCodes    = 4
	fAuditCustom         = 5
	fMutPhase            = 1
	fMutChunkIndex       = 2
	fMutData             = 3
	fReason              = 1 // CancelRequest, CancelAll, AgentError
	fPingSequence        = 1
	fPingTimestamp       = 2
)

// HeaderOp.Operation and Phase enum values.
const (
	opSet    = 1
	opAdd    = 2
	opRemove = 3
)

// ---------------------------------------------------------------------------
// Encoding. size* functions return the encoded size of a message body; the
// matching append* functions write exactly that many bytes.

func sizeTag(num protowire.Number) int { return protowire.SizeTag(num) }

func sizeBytesField(num protowire.Number, b []byte) int {
	if len(b) == 0 {
		return 0
	}
	return sizeTag(num) + protowire.SizeBytes(len(b))
}

func appendBytesField(dst []byte, num protowire.Number, b []byte) []byte {
	if len(b) == 0 {
		return dst
	}
	dst = protowire.AppendTag(dst, num, protowire.BytesType)
	return protowire.AppendBytes(dst, b)
}

// sizeBytesAlways and appendBytesAlways write the field even when empty
// (repeated and explicit-presence fields).
func sizeBytesAlways(num protowire.Number, b []byte) int {
	return sizeTag(num) + protowire.SizeBytes(len(b))
}

func appendBytesAlways(dst []byte, num protowire.Number, b []byte) []byte {
	dst = protowire.AppendTag(dst, num, protowire.BytesType)
	return protowire.AppendBytes(dst, b)
}

func sizeVarintField(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return sizeTag(num) + protowire.SizeVarint(v)
}

func appendVarintField(dst []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return dst
	}
	dst = protowire.AppendTag(dst, num, protowire.VarintType)
	return protowire.AppendVarint(dst, v)
}

func sizeBoolField(num protowire.Number, v bool) int {
	if !v {
		return 0
	}
	return sizeTag(num) + 1
}

func appendBoolField(dst []byte, num protowire.Number, v bool) []byte {
	if !v {
		return dst
	}
	dst = protowire.AppendTag(dst, num, protowire.VarintType)
	return append(dst, 1)
}

func sizeMessageField(num protowire.Number, n int) int { return sizeTag(num) + protowire.SizeBytes(n) }

func appendMessageHeader(dst []byte, num protowire.Number, n int) []byte {
	dst = protowire.AppendTag(dst, num, protowire.BytesType)
	return protowire.AppendVarint(dst, uint64(n))
}

// optional int64 fields: present when v >= 0 (negative means unknown).
func sizeOptInt64(num protowire.Number, v int64) int {
	if v < 0 {
		return 0
	}
	return sizeTag(num) + protowire.SizeVarint(uint64(v))
}

func appendOptInt64(dst []byte, num protowire.Number, v int64) []byte {
	if v < 0 {
		return dst
	}
	dst = protowire.AppendTag(dst, num, protowire.VarintType)
	return protowire.AppendVarint(dst, uint64(v))
}

func sizeHeader(h *protocol.Header) int {
	return sizeBytesField(fHeaderName, h.Name) + sizeBytesField(fHeaderValue, h.Value)
}

// smallHeader is the size of h's message body when it and both its
// fields fit one-byte lengths (the common case), else -1.
func smallHeader(h *protocol.Header) int {
	n, v := len(h.Name), len(h.Value)
	if n >= 0x80 || v >= 0x80 {
		return -1
	}
	size := 0
	if n > 0 {
		size += 2 + n
	}
	if v > 0 {
		size += 2 + v
	}
	if size >= 0x80 {
		return -1
	}
	return size
}

// The headers fields (RequestHeaders.headers, ResponseHeaders.headers,
// block headers) have numbers below 16: one-byte tags.
func sizeHeaders(num protowire.Number, hs protocol.Headers) int {
	n := 0
	for i := range hs {
		if m := smallHeader(&hs[i]); m >= 0 && num < 16 {
			n += 2 + m
			continue
		}
		n += sizeMessageField(num, sizeHeader(&hs[i]))
	}
	return n
}

func appendHeaders(dst []byte, num protowire.Number, hs protocol.Headers) []byte {
	for i := range hs {
		h := &hs[i]
		if m := smallHeader(h); m >= 0 && num < 16 {
			// tag, length, then name and value each as tag, length, bytes.
			dst = append(dst, byte(num)<<3|byte(protowire.BytesType), byte(m))
			if len(h.Name) > 0 {
				dst = append(dst, fHeaderName<<3|byte(protowire.BytesType), byte(len(h.Name)))
				dst = append(dst, h.Name...)
			}
			if len(h.Value) > 0 {
				dst = append(dst, fHeaderValue<<3|byte(protowire.BytesType), byte(len(h.Value)))
				dst = append(dst, h.Value...)
			}
			continue
		}
		dst = appendMessageHeader(dst, num, sizeHeader(h))
		dst = appendBytesField(dst, fHeaderName, h.Name)
		dst = appendBytesField(dst, fHeaderValue, h.Value)
	}
	return dst
}

func clientPort(p int) uint64 {
	if p > 0 && p <= 0xFFFF {
		return uint64(p)
	}
	return 0
}

func sizeMetadata(md *protocol.Metadata) int {
	return sizeBytesField(1, md.CorrelationID) + sizeBytesField(2, md.ClientIP) +
		sizeVarintField(3, clientPort(md.ClientPort)) + sizeBytesField(4, md.Protocol) +
		sizeBytesField(5, md.ServerName) + sizeBytesField(6, md.RouteID) +
		sizeBytesField(7, md.UpstreamID) + sizeBytesField(8, md.Traceparent) +
		sizeBytesField(9, md.Timestamp) + sizeBytesField(10, md.TLSVersion) +
		sizeBytesField(11, md.TLSCipher) + sizeBytesField(12, md.TLSServerName) +
		sizeBytesField(13, md.TLSClientSubject) + sizeBytesField(14, md.TLSClientSAN) +
		sizeBytesField(20, md.ServerIP) + sizeVarintField(21, clientPort(md.ServerPort)) +
		sizeBytesField(22, md.ListenerID) + sizeBytesField(23, md.UpstreamHost) +
		sizeBytesField(24, md.ForwardedFor) + sizeBytesField(25, md.ForwardedProto) +
		sizeBytesField(26, md.ForwardedHost) + sizeBytesField(27, md.Path)
}

func appendMetadata(dst []byte, md *protocol.Metadata) []byte {
	dst = appendBytesField(dst, 1, md.CorrelationID)
	dst = appendBytesField(dst, 2, md.ClientIP)
	dst = appendVarintField(dst, 3, clientPort(md.ClientPort))
	dst = appendBytesField(dst, 4, md.Protocol)
	dst = appendBytesField(dst, 5, md.ServerName)
	dst = appendBytesField(dst, 6, md.RouteID)
	dst = appendBytesField(dst, 7, md.UpstreamID)
	dst = appendBytesField(dst, 8, md.Traceparent)
	dst = appendBytesField(dst, 9, md.Timestamp)
	dst = appendBytesField(dst, 10, md.TLSVersion)
	dst = appendBytesField(dst, 11, md.TLSCipher)
	dst = appendBytesField(dst, 12, md.TLSServerName)
	dst = appendBytesField(dst, 13, md.TLSClientSubject)
	dst = appendBytesField(dst, 14, md.TLSClientSAN)
	dst = appendBytesField(dst, 20, md.ServerIP)
	dst = appendVarintField(dst, 21, clientPort(md.ServerPort))
	dst = appendBytesField(dst, 22, md.ListenerID)
	dst = appendBytesField(dst, 23, md.UpstreamHost)
	dst = appendBytesField(dst, 24, md.ForwardedFor)
	dst = appendBytesField(dst, 25, md.ForwardedProto)
	dst = appendBytesField(dst, 26, md.ForwardedHost)
	return appendBytesField(dst, 27, md.Path)
}

func sizeRequestHeaders(m *protocol.RequestHeaders) int {
	n := sizeBytesField(fReqMethod, m.Method) + sizeBytesField(fReqURI, m.URI) +
		sizeHeaders(fReqHeaders, m.Headers) + sizeBoolField(fReqHasBody, m.HasBody) +
		sizeMessageField(fReqMetadata, sizeMetadata(&m.Metadata)) +
		sizeBytesField(fReqRequestTarget, m.RequestTarget)
	if m.HasInlineBody {
		n += sizeMessageField(fReqInlineBody, sizeBodyChunk(&m.InlineBody))
	}
	return n + sizeVarintField(fEventTimeout, uint64(m.TimeoutMs))
}

func appendRequestHeaders(dst []byte, m *protocol.RequestHeaders) []byte {
	dst = appendBytesField(dst, fReqMethod, m.Method)
	dst = appendBytesField(dst, fReqURI, m.URI)
	dst = appendHeaders(dst, fReqHeaders, m.Headers)
	dst = appendBoolField(dst, fReqHasBody, m.HasBody)
	dst = appendMessageHeader(dst, fReqMetadata, sizeMetadata(&m.Metadata))
	dst = appendMetadata(dst, &m.Metadata)
	if m.HasInlineBody {
		// The inline body is a RequestBodyChunk message (field 6).
		dst = appendMessageHeader(dst, fReqInlineBody, sizeBodyChunk(&m.InlineBody))
		dst = appendBodyChunk(dst, &m.InlineBody)
	}
	dst = appendVarintField(dst, fEventTimeout, uint64(m.TimeoutMs))
	return appendBytesField(dst, fReqRequestTarget, m.RequestTarget)
}

// sizeBodyChunk and appendBodyChunk are a chunk's fields without its
// timeout_ms, which an inline body does not carry; sizeChunkEvent and
// appendChunkEvent add it for a chunk event.
func sizeBodyChunk(m *protocol.BodyChunk) int {
	return sizeVarintField(fChunkIndex, uint64(m.ChunkIndex)) + sizeBytesField(fChunkData, m.Data) +
		sizeBoolField(fChunkIsLast, m.IsLast) + sizeOptInt64(fChunkTotal, m.TotalSize) +
		sizeOptInt64(fChunkProgress, m.Progress)
}

func appendBodyChunk(dst []byte, m *protocol.BodyChunk) []byte {
	dst = appendVarintField(dst, fChunkIndex, uint64(m.ChunkIndex))
	dst = appendBytesField(dst, fChunkData, m.Data)
	dst = appendBoolField(dst, fChunkIsLast, m.IsLast)
	dst = appendOptInt64(dst, fChunkTotal, m.TotalSize)
	return appendOptInt64(dst, fChunkProgress, m.Progress)
}

func sizeChunkEvent(m *protocol.BodyChunk) int {
	return sizeBodyChunk(m) + sizeVarintField(fEventTimeout, uint64(m.TimeoutMs))
}

func appendChunkEvent(dst []byte, m *protocol.BodyChunk) []byte {
	dst = appendBodyChunk(dst, m)
	return appendVarintField(dst, fEventTimeout, uint64(m.TimeoutMs))
}

func statusField(s int) uint64 {
	if s > 0 && s <= math.MaxUint32 {
		return uint64(s)
	}
	return 0
}

func sizeResponseHeaders(m *protocol.ResponseHeaders) int {
	return sizeVarintField(fRespStatus, statusField(m.StatusCode)) + sizeHeaders(fRespHeaders, m.Headers) +
		sizeBoolField(fRespHasBody, m.HasBody) + sizeVarintField(fEventTimeout, uint64(m.TimeoutMs))
}

func appendResponseHeaders(dst []byte, m *protocol.ResponseHeaders) []byte {
	dst = appendVarintField(dst, fRespStatus, statusField(m.StatusCode))
	dst = appendHeaders(dst, fRespHeaders, m.Headers)
	dst = appendBoolField(dst, fRespHasBody, m.HasBody)
	return appendVarintField(dst, fEventTimeout, uint64(m.TimeoutMs))
}

func opCode(k protocol.HeaderOpKind) uint64 {
	switch k {
	case protocol.HeaderAdd:
		return opAdd
	case protocol.HeaderRemove:
		return opRemove
	}
	return opSet
}

func sizeHeaderOp(op *protocol.HeaderOp) int {
	n := sizeVarintField(fOpOperation, opCode(op.Op)) + sizeBytesField(fOpName, op.Name)
	if op.Op != protocol.HeaderRemove {
		n += sizeBytesField(fOpValue, op.Value)
	}
	return n
}

func sizeHeaderOps(num protowire.Number, ops []protocol.HeaderOp) int {
	n := 0
	for i := range ops {
		n += sizeMessageField(num, sizeHeaderOp(&ops[i]))
	}
	return n
}

func appendHeaderOps(dst []byte, num protowire.Number, ops []protocol.HeaderOp) []byte {
	for i := range ops {
		op := &ops[i]
		dst = appendMessageHeader(dst, num, sizeHeaderOp(op))
		dst = appendVarintField(dst, fOpOperation, opCode(op.Op))
		dst = appendBytesField(dst, fOpName, op.Name)
		if op.Op != protocol.HeaderRemove {
			dst = appendBytesField(dst, fOpValue, op.Value)
		}
	}
	return dst
}

// mutationData is the optional data field: nil (absent) for pass, empty
// for drop, the bytes for replace (an empty replacement is a drop).
func mutationData(m *protocol.BodyMutation) (data []byte, present bool) {
	switch m.Action {
	case protocol.MutationDrop:
		return nil, true
	case protocol.MutationReplace:
		return m.Data, true
	}
	return nil, false
}

func sizeBodyMutation(m *protocol.BodyMutation, phase protocol.Phase) int {
	n := sizeVarintField(fMutPhase, uint64(phase)) + sizeVarintField(fMutChunkIndex, uint64(m.ChunkIndex))
	if data, ok := mutationData(m); ok {
		n += sizeBytesAlways(fMutData, data)
	}
	return n
}

func appendBodyMutation(dst []byte, m *protocol.BodyMutation, phase protocol.Phase) []byte {
	dst = appendVarintField(dst, fMutPhase, uint64(phase))
	dst = appendVarintField(dst, fMutChunkIndex, uint64(m.ChunkIndex))
	if data, ok := mutationData(m); ok {
		dst = appendBytesAlways(dst, fMutData, data)
	}
	return dst
}

func sizeRepeatedBytes(num protowire.Number, l [][]byte) int {
	n := 0
	for _, b := range l {
		n += sizeBytesAlways(num, b)
	}
	return n
}

func appendRepeatedBytes(dst []byte, num protowire.Number, l [][]byte) []byte {
	for _, b := range l {
		dst = appendBytesAlways(dst, num, b)
	}
	return dst
}

func sizeAudit(a *protocol.Audit) int {
	n := sizeRepeatedBytes(fAuditTags, a.Tags) + sizeRepeatedBytes(fAuditRuleIDs, a.RuleIDs) +
		sizeRepeatedBytes(fAuditReasonCodes, a.ReasonCodes) + sizeBytesField(fAuditCustom, a.Custom)
	if a.HasConf {
		n += sizeTag(fAuditConfidence) + 8
	}
	return n
}

func appendAudit(dst []byte, a *protocol.Audit) []byte {
	dst = appendRepeatedBytes(dst, fAuditTags, a.Tags)
	dst = appendRepeatedBytes(dst, fAuditRuleIDs, a.RuleIDs)
	if a.HasConf {
		dst = protowire.AppendTag(dst, fAuditConfidence, protowire.Fixed64Type)
		dst = protowire.AppendFixed64(dst, math.Float64bits(a.Confidence))
	}
	dst = appendRepeatedBytes(dst, fAuditReasonCodes, a.ReasonCodes)
	return appendBytesField(dst, fAuditCustom, a.Custom)
}

func sizeBlock(m *protocol.Decision) int {
	return sizeVarintField(fBlockStatus, statusField(m.Status)) + sizeBytesField(fBlockBody, m.Body) +
		sizeHeaders(fBlockHeaders, m.BlockHeaders)
}

func sizeRedirect(m *protocol.Decision) int {
	return sizeBytesField(fRedirectURL, m.RedirectURL) + sizeVarintField(fRedirectStatus, statusField(m.Status))
}

func sizeDecision(m *protocol.Decision) int {
	n := 0
	switch m.Kind {
	case protocol.DecisionBlock:
		n += sizeMessageField(fDecBlock, sizeBlock(m))
	case protocol.DecisionRedirect:
		n += sizeMessageField(fDecRedirect, sizeRedirect(m))
	case protocol.DecisionNeedsMore:
		n += sizeMessageField(fDecNeedsMoreVerdict, 0)
	default:
		n += sizeMessageField(fDecAllow, 0)
	}
	n += sizeHeaderOps(fDecRequestOps, m.RequestHeaderOps) + sizeHeaderOps(fDecResponseOps, m.ResponseHeaderOps)
	n += sizeBoolField(fDecNeedsMore, m.NeedsMore || m.Kind == protocol.DecisionNeedsMore)
	if m.HasRequestBodyMutation {
		n += sizeMessageField(fDecRequestMutation, sizeBodyMutation(&m.RequestBodyMutation, protocol.PhaseRequest))
	}
	if m.HasResponseBodyMutation {
		n += sizeMessageField(fDecResponseMutation, sizeBodyMutation(&m.ResponseBodyMutation, protocol.PhaseResponse))
	}
	if !m.Audit.Empty() {
		n += sizeMessageField(fDecAudit, sizeAudit(&m.Audit))
	}
	if !m.Cache.Empty() {
		n += sizeMessageField(fDecCache, sizeCache(m.Cache))
	}
	return n
}

func sizeCache(c protocol.CacheDirective) int {
	return sizeBoolField(fCacheNoStore, c.NoStore) + sizeVarintField(fCacheTTL, uint64(c.TTLMs))
}

func appendDecision(dst []byte, m *protocol.Decision) []byte {
	switch m.Kind {
	case protocol.DecisionBlock:
		dst = appendMessageHeader(dst, fDecBlock, sizeBlock(m))
		dst = appendVarintField(dst, fBlockStatus, statusField(m.Status))
		dst = appendBytesField(dst, fBlockBody, m.Body)
		dst = appendHeaders(dst, fBlockHeaders, m.BlockHeaders)
	case protocol.DecisionRedirect:
		dst = appendMessageHeader(dst, fDecRedirect, sizeRedirect(m))
		dst = appendBytesField(dst, fRedirectURL, m.RedirectURL)
		dst = appendVarintField(dst, fRedirectStatus, statusField(m.Status))
	case protocol.DecisionNeedsMore:
		dst = appendMessageHeader(dst, fDecNeedsMoreVerdict, 0)
	default:
		dst = appendMessageHeader(dst, fDecAllow, 0)
	}
	dst = appendHeaderOps(dst, fDecRequestOps, m.RequestHeaderOps)
	dst = appendHeaderOps(dst, fDecResponseOps, m.ResponseHeaderOps)
	dst = appendBoolField(dst, fDecNeedsMore, m.NeedsMore || m.Kind == protocol.DecisionNeedsMore)
	if m.HasRequestBodyMutation {
		dst = appendMessageHeader(dst, fDecRequestMutation, sizeBodyMutation(&m.RequestBodyMutation, protocol.PhaseRequest))
		dst = appendBodyMutation(dst, &m.RequestBodyMutation, protocol.PhaseRequest)
	}
	if m.HasResponseBodyMutation {
		dst = appendMessageHeader(dst, fDecResponseMutation, sizeBodyMutation(&m.ResponseBodyMutation, protocol.PhaseResponse))
		dst = appendBodyMutation(dst, &m.ResponseBodyMutation, protocol.PhaseResponse)
	}
	if !m.Audit.Empty() {
		dst = appendMessageHeader(dst, fDecAudit, sizeAudit(&m.Audit))
		dst = appendAudit(dst, &m.Audit)
	}
	if !m.Cache.Empty() {
		dst = appendMessageHeader(dst, fDecCache, sizeCache(m.Cache))
		dst = appendBoolField(dst, fCacheNoStore, m.Cache.NoStore)
		dst = appendVarintField(dst, fCacheTTL, uint64(m.Cache.TTLMs))
	}
	return dst
}

func sizePing(m *protocol.Ping) int {
	return sizeVarintField(fPingSequence, m.Sequence) + sizeVarintField(fPingTimestamp, uint64(m.TimestampMs))
}

func appendPing(dst []byte, m *protocol.Ping) []byte {
	dst = appendVarintField(dst, fPingSequence, m.Sequence)
	return appendVarintField(dst, fPingTimestamp, uint64(m.TimestampMs))
}

// Resolved is a protocol message resolved to its envelope field and sized:
// Size bytes, written by Append.
type Resolved struct {
	field protowire.Number
	id    uint64
	body  int // encoded size of the payload message
	t     protocol.MsgType
	msg   protocol.Message
	text  []byte // reason / agent error message (proto3 string)
}

// Resolve maps msg to its envelope field (by msg's own type) and sizes it.
func Resolve(msg protocol.Message) (Resolved, error) {
	if msg == nil {
		return Resolved{}, fmt.Errorf("%w: nil message", ErrMessageType)
	}
	t := msg.MsgType()
	w := Resolved{t: t, msg: msg}
	switch m := msg.(type) {
	case *protocol.RequestHeaders:
		w.field, w.id, w.body = fEnvRequestHeaders, m.RequestID, sizeRequestHeaders(m)
	case *protocol.RequestBodyChunk:
		w.field, w.id, w.body = fEnvRequestChunk, m.RequestID, sizeChunkEvent((*protocol.BodyChunk)(m))
	case *protocol.ResponseBodyChunk:
		w.field, w.id, w.body = fEnvResponseChunk, m.RequestID, sizeChunkEvent((*protocol.BodyChunk)(m))
	case *protocol.ResponseHeaders:
		w.field, w.id, w.body = fEnvResponseHeaders, m.RequestID, sizeResponseHeaders(m)
	case *protocol.Decision:
		w.field, w.id, w.body = fEnvDecision, m.RequestID, sizeDecision(m)
	case *protocol.BodyMutation:
		w.field, w.id, w.body = fEnvBodyMutation, m.RequestID, sizeBodyMutation(m, m.Phase)
	case *protocol.CancelRequest:
		w.field, w.id, w.text = fEnvCancel, m.RequestID, m.Reason
		w.body = sizeBytesField(fReason, m.Reason)
	case *protocol.CancelAll:
		w.field, w.text = fEnvCancelAll, m.Reason
		w.body = sizeBytesField(fReason, m.Reason)
	case *protocol.Ping:
		w.field, w.body = fEnvPing, sizePing(m)
	case *protocol.Pong:
		w.field, w.body = fEnvPong, sizePing((*protocol.Ping)(m))
	default:
		// Handshake and registration do not travel on the stream.
		return w, fmt.Errorf("%w: %s", ErrMessageType, t)
	}
	if w.text != nil && !utf8.Valid(w.text) {
		return w, fmt.Errorf("%w: %s reason is not valid UTF-8", ErrMessageType, t)
	}
	return w, nil
}

// Type is the message's type.
func (w *Resolved) Type() protocol.MsgType { return w.t }

// Size is the encoded size of the AgentMessage.
func (w *Resolved) Size() int {
	return sizeVarintField(fEnvRequestID, w.id) + sizeMessageField(w.field, w.body)
}

// Append appends the AgentMessage, exactly Size bytes.
func (w *Resolved) Append(dst []byte) []byte {
	dst = appendVarintField(dst, fEnvRequestID, w.id)
	dst = appendMessageHeader(dst, w.field, w.body)
	switch m := w.msg.(type) {
	case *protocol.RequestHeaders:
		return appendRequestHeaders(dst, m)
	case *protocol.RequestBodyChunk:
		return appendChunkEvent(dst, (*protocol.BodyChunk)(m))
	case *protocol.ResponseBodyChunk:
		return appendChunkEvent(dst, (*protocol.BodyChunk)(m))
	case *protocol.ResponseHeaders:
		return appendResponseHeaders(dst, m)
	case *protocol.Decision:
		return appendDecision(dst, m)
	case *protocol.BodyMutation:
		return appendBodyMutation(dst, m, m.Phase)
	case *protocol.Ping:
		return appendPing(dst, m)
	case *protocol.Pong:
		return appendPing(dst, (*protocol.Ping)(m))
	}
	return appendBytesField(dst, fReason, w.text) // cancel, cancel all
}

// AppendMessage appends the AgentMessage carrying msg in protobuf wire
// format; the payload field follows from msg's type.
func AppendMessage(dst []byte, msg protocol.Message) ([]byte, error) {
	w, err := Resolve(msg)
	if err != nil {
		return dst, err
	}
	return w.Append(dst), nil
}

func agentErrorText(reason string) string {
	if len(reason) > 1024 {
		reason = reason[:1024]
	}
	if !utf8.ValidString(reason) {
		return "agent error"
	}
	return reason
}

// AppendAgentError appends the AgentMessage of an agent error for request id.
func AppendAgentError(dst []byte, id uint64, reason string) []byte {
	reason = agentErrorText(reason)
	body := 0
	if len(reason) > 0 {
		body = sizeTag(fReason) + protowire.SizeBytes(len(reason))
	}
	dst = appendVarintField(dst, fEnvRequestID, id)
	dst = appendMessageHeader(dst, fEnvAgentError, body)
	if len(reason) > 0 {
		dst = protowire.AppendTag(dst, fReason, protowire.BytesType)
		dst = protowire.AppendString(dst, reason)
	}
	return dst
}

// ---------------------------------------------------------------------------
// Decoding.

// Payload names the payload of a received AgentMessage.
type Payload uint8

// Payloads, in the order of their field numbers.
const (
	PayloadNone Payload = iota
	PayloadRequestHeaders
	PayloadRequestBodyChunk
	PayloadResponseHeaders
	PayloadResponseBodyChunk
	PayloadDecision
	PayloadCancel
	PayloadBodyMutation
	PayloadCancelAll
	PayloadPing
	PayloadPong
	PayloadAgentError
	// PayloadUnknown is a payload field this implementation does not know
	// (from a newer peer).
	PayloadUnknown
)

var payloadNames = [...]string{"none", "request_headers", "request_body_chunk", "response_headers", "response_body_chunk",
	"decision", "cancel", "body_mutation", "cancel_all", "ping", "pong", "agent_error", "unknown"}

// String is the payload's field name in agent.proto ("none" for an
// envelope without one, "unknown" for a field of a newer peer).
func (p Payload) String() string {
	if int(p) < len(payloadNames) {
		return payloadNames[p]
	}
	return "unknown"
}

// Field is the payload's field number in the AgentMessage (0 for
// PayloadNone and PayloadUnknown).
func (p Payload) Field() protowire.Number {
	if p == PayloadNone || p >= PayloadUnknown {
		return 0
	}
	return protowire.Number(p) + 1
}

// MsgType is the frame type that carries p: TypeDecision for an agent
// error, 0 for PayloadNone and PayloadUnknown (the inverse of PayloadOf).
func (p Payload) MsgType() protocol.MsgType {
	switch p {
	case PayloadRequestHeaders:
		return protocol.TypeRequestHeaders
	case PayloadRequestBodyChunk:
		return protocol.TypeRequestBodyChunk
	case PayloadResponseHeaders:
		return protocol.TypeResponseHeaders
	case PayloadResponseBodyChunk:
		return protocol.TypeResponseBodyChunk
	case PayloadDecision, PayloadAgentError:
		return protocol.TypeDecision
	case PayloadBodyMutation:
		return protocol.TypeBodyMutation
	case PayloadCancel:
		return protocol.TypeCancelRequest
	case PayloadCancelAll:
		return protocol.TypeCancelAll
	case PayloadPing:
		return protocol.TypePing
	case PayloadPong:
		return protocol.TypePong
	}
	return 0
}

// PayloadOf is the payload a frame of type t carries with protobuf
// payloads (docs/protocol.md §2.7); PayloadNone for the types that have no
// AgentMessage form (handshake, registration, unknown types). An agent
// error is the exception: it travels in a Decision frame
// (PayloadAgentError).
func PayloadOf(t protocol.MsgType) Payload {
	switch t {
	case protocol.TypeRequestHeaders:
		return PayloadRequestHeaders
	case protocol.TypeRequestBodyChunk:
		return PayloadRequestBodyChunk
	case protocol.TypeResponseHeaders:
		return PayloadResponseHeaders
	case protocol.TypeResponseBodyChunk:
		return PayloadResponseBodyChunk
	case protocol.TypeDecision:
		return PayloadDecision
	case protocol.TypeBodyMutation:
		return PayloadBodyMutation
	case protocol.TypeCancelRequest:
		return PayloadCancel
	case protocol.TypeCancelAll:
		return PayloadCancelAll
	case protocol.TypePing:
		return PayloadPing
	case protocol.TypePong:
		return PayloadPong
	}
	return PayloadNone
}

// ParseAs parses b as the payload of a frame of type t: Err is also set
// (wrapping ErrMalformed) when the envelope's payload is not the one t
// carries. A Decision frame may carry an agent_error.
func (f *Frame) ParseAs(t protocol.MsgType, b []byte) {
	f.Parse(b)
	if f.Err != nil {
		return
	}
	want := PayloadOf(t)
	if f.Payload != want && !(t == protocol.TypeDecision && f.Payload == PayloadAgentError) {
		f.Err = fmt.Errorf("%w: a %s frame carries AgentMessage payload %s, not %s", ErrMalformed, t, f.Payload, want)
	}
}

// Frame is one received AgentMessage: the envelope is parsed, the payload
// is decoded on demand into protocol messages whose byte fields alias the
// buffer it was parsed from. That buffer must outlive them: the gRPC
// transport receives each message into a buffer kept with the reply or
// event it decodes into, the UDS transports copy each payload into one.
type Frame struct {
	// RequestID of the envelope (as far as it was read when Err is set).
	RequestID uint64
	// Payload says which payload the message carries.
	Payload Payload
	// Err wraps ErrMalformed when the envelope did not parse.
	Err error

	body []byte
}

func malformed(what string) error { return fmt.Errorf("%w: %s", ErrMalformed, what) }

// Parse reads the envelope of b into f. The payload is decoded on demand
// (DecodeRequestHeaders, ...) and aliases b, which must stay unchanged
// while f or what it decoded is in use. A malformed envelope sets Err.
func (f *Frame) Parse(b []byte) {
	*f = Frame{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			f.Err = malformed("bad tag")
			return
		}
		b = b[n:]
		switch {
		case num == fEnvRequestID && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				f.Err = malformed("bad request_id")
				return
			}
			f.RequestID, b = v, b[n:]
			continue
		case num >= fEnvRequestHeaders && num <= fEnvMaxKnownPayload && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				f.Err = malformed("bad payload length")
				return
			}
			f.Payload, f.body, b = Payload(num-1), v, b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			f.Err = malformed("bad field")
			return
		}
		// A payload field of a newer peer. Only when no known payload came:
		// the generated decoder keeps the known one and ignores the field,
		// and so must this one (an unknown field never fails a message).
		if num > fEnvMaxKnownPayload && typ == protowire.BytesType && f.Payload == PayloadNone {
			f.Payload, f.body = PayloadUnknown, nil
		}
		b = b[n:]
	}
}

// field is one field of a message body.
type field struct {
	num protowire.Number
	typ protowire.Type
	u   uint64 // varint or fixed64 value
	b   []byte // bytes value
}

// nextField reads one field off *b; ok is false at the end, err on garbage.
func nextField(b *[]byte, f *field) (ok bool, err error) {
	s := *b
	if len(s) == 0 {
		return false, nil
	}
	// Fast paths for the shapes nearly every field has: a one-byte tag
	// and a one-byte length or varint (field numbers below 16, values
	// and lengths below 128). Same results as the general path below,
	// about half its cost on header-heavy messages.
	if len(s) >= 2 && s[0] < 0x80 && s[0] >= 8 && s[1] < 0x80 {
		switch protowire.Type(s[0] & 7) {
		case protowire.BytesType:
			if n := int(s[1]); n <= len(s)-2 {
				f.num, f.typ, f.b = protowire.Number(s[0]>>3), protowire.BytesType, s[2:2+n:2+n]
				*b = s[2+n:]
				return true, nil
			}
		case protowire.VarintType:
			f.num, f.typ, f.u = protowire.Number(s[0]>>3), protowire.VarintType, uint64(s[1])
			*b = s[2:]
			return true, nil
		}
	}
	num, typ, n := protowire.ConsumeTag(s)
	if n < 0 {
		return false, malformed("bad tag")
	}
	s = s[n:]
	f.num, f.typ = num, typ
	switch typ {
	case protowire.VarintType:
		f.u, n = protowire.ConsumeVarint(s)
	case protowire.BytesType:
		f.b, n = protowire.ConsumeBytes(s)
		// Capped, as the JSON decoder's are: appending to a decoded
		// value never overwrites what follows it.
		f.b = f.b[:len(f.b):len(f.b)]
	case protowire.Fixed64Type:
		f.u, n = protowire.ConsumeFixed64(s)
	default:
		n = protowire.ConsumeFieldValue(num, typ, s)
	}
	if n < 0 {
		return false, malformed(fmt.Sprintf("bad field %d", num))
	}
	*b = s[n:]
	return true, nil
}

// fieldReader walks the fields of one message body:
//
//	f := fields(b)
//	for f.next() {
//		// f.num, f.typ, f.u, f.b
//	}
//	return f.err // garbage in b, or nil at its end
type fieldReader struct {
	field
	rest []byte
	err  error
}

func fields(b []byte) fieldReader { return fieldReader{rest: b} }

// next reads the next field; false at the end or on garbage (f.err).
func (f *fieldReader) next() bool {
	ok, err := nextField(&f.rest, &f.field)
	f.err = err
	return ok
}

// emptyData is a present, empty bytes field.
var emptyData = []byte{}

// bytesOf keeps a non-nil empty slice for present-but-empty bytes, as
// generated code does.
func bytesOf(b []byte) []byte {
	if b == nil {
		return emptyData
	}
	return b
}

func decodeHeader(b []byte) (h protocol.Header, err error) {
	// Fast path: the canonical shape (name, then value, one-byte lengths,
	// nothing else), which is what every encoder writes; anything else
	// goes through the general reader with the same result.
	if len(b) >= 2 && b[0] == fHeaderName<<3|byte(protowire.BytesType) && b[1] < 0x80 && int(b[1]) <= len(b)-2 {
		n := 2 + int(b[1])
		rest := b[n:]
		switch {
		case len(rest) == 0:
			h.Name = b[2:n:n]
			return h, nil
		case len(rest) >= 2 && rest[0] == fHeaderValue<<3|byte(protowire.BytesType) && rest[1] < 0x80 && int(rest[1]) == len(rest)-2:
			h.Name, h.Value = b[2:n:n], rest[2:len(rest):len(rest)]
			return h, nil
		}
	}
	f := fields(b)
	for f.next() {
		switch {
		case f.typ != protowire.BytesType:
		case f.num == fHeaderName:
			h.Name = f.b
		case f.num == fHeaderValue:
			h.Value = f.b
		}
	}
	return h, f.err
}

// decodeHeaders appends the header in b to h.
func decodeHeaders(h protocol.Headers, b []byte) (protocol.Headers, error) {
	hdr, err := decodeHeader(b)
	if err == nil {
		err = checkList(len(h), "headers")
	}
	if err != nil {
		return h, err
	}
	return append(h, hdr), nil
}

// checkList refuses an entry past protocol.MaxListEntries in a list that
// holds n, before it is allocated.
func checkList(n int, what string) error {
	if n >= protocol.MaxListEntries {
		return fmt.Errorf("%w: more than %d %s", protocol.ErrProtocolField, protocol.MaxListEntries, what)
	}
	return nil
}

func decodeMetadata(b []byte, md *protocol.Metadata) error {
	f := fields(b)
	for f.next() {
		if f.num == 3 || f.num == 21 {
			if f.typ == protowire.VarintType {
				p := int(uint32(f.u))
				if f.num == 3 {
					md.ClientPort = p
				} else {
					md.ServerPort = p
				}
			}
			continue
		}
		if f.typ != protowire.BytesType {
			continue
		}
		switch f.num {
		case 1:
			md.CorrelationID = f.b
		case 2:
			md.ClientIP = f.b
		case 4:
			md.Protocol = f.b
		case 5:
			md.ServerName = f.b
		case 6:
			md.RouteID = f.b
		case 7:
			md.UpstreamID = f.b
		case 8:
			md.Traceparent = f.b
		case 9:
			md.Timestamp = f.b
		case 10:
			md.TLSVersion = f.b
		case 11:
			md.TLSCipher = f.b
		case 12:
			md.TLSServerName = f.b
		case 13:
			md.TLSClientSubject = f.b
		case 14:
			md.TLSClientSAN = f.b
		case 20:
			md.ServerIP = f.b
		case 22:
			md.ListenerID = f.b
		case 23:
			md.UpstreamHost = f.b
		case 24:
			md.ForwardedFor = f.b
		case 25:
			md.ForwardedProto = f.b
		case 26:
			md.ForwardedHost = f.b
		case 27:
			md.Path = f.b
		}
	}
	return f.err
}

// DecodeRequestHeaders decodes a PayloadRequestHeaders frame into m
// (reset first).
func (f *Frame) DecodeRequestHeaders(m *protocol.RequestHeaders) error {
	m.Reset()
	m.RequestID = f.RequestID
	fl := fields(f.body)
	for fl.next() {
		var err error
		switch {
		case fl.num == fReqHasBody && fl.typ == protowire.VarintType:
			m.HasBody = fl.u != 0
		case fl.num == fEventTimeout && fl.typ == protowire.VarintType:
			m.TimeoutMs = uint32(fl.u)
		case fl.typ != protowire.BytesType:
		case fl.num == fReqMethod:
			m.Method = fl.b
		case fl.num == fReqURI:
			m.URI = fl.b
		case fl.num == fReqRequestTarget:
			m.RequestTarget = fl.b
		case fl.num == fReqHeaders:
			m.Headers, err = decodeHeaders(m.Headers, fl.b)
		case fl.num == fReqMetadata:
			err = decodeMetadata(fl.b, &m.Metadata)
		case fl.num == fReqInlineBody:
			// Another occurrence merges into the message, as protobuf does.
			if !m.HasInlineBody {
				m.HasInlineBody, m.InlineBody = true, protocol.BodyChunk{TotalSize: -1, Progress: -1}
			}
			err = decodeBodyChunk(fl.b, &m.InlineBody)
			m.InlineBody.TimeoutMs = 0 // the event's own counts
		}
		if err != nil {
			return err
		}
	}
	return fl.err
}

// DecodeBodyChunk decodes a request or response body chunk frame into m
// (reset first).
func (f *Frame) DecodeBodyChunk(m *protocol.BodyChunk) error {
	m.Reset()
	m.RequestID = f.RequestID
	return decodeBodyChunk(f.body, m)
}

// decodeBodyChunk reads the fields of a RequestBodyChunk or
// ResponseBodyChunk message body into m (a chunk event's payload, or the
// inline body of a RequestHeaders).
func decodeBodyChunk(b []byte, m *protocol.BodyChunk) error {
	fl := fields(b)
	for fl.next() {
		switch {
		case fl.num == fChunkData && fl.typ == protowire.BytesType:
			m.Data = fl.b
		case fl.typ != protowire.VarintType:
		case fl.num == fChunkIndex:
			m.ChunkIndex = uint32(fl.u)
		case fl.num == fChunkIsLast:
			m.IsLast = fl.u != 0
		case fl.num == fChunkTotal:
			m.TotalSize = max(int64(fl.u), -1)
		case fl.num == fChunkProgress:
			m.Progress = max(int64(fl.u), -1)
		case fl.num == fEventTimeout:
			m.TimeoutMs = uint32(fl.u)
		}
	}
	return fl.err
}

// DecodeResponseHeaders decodes a PayloadResponseHeaders frame into m
// (reset first).
func (f *Frame) DecodeResponseHeaders(m *protocol.ResponseHeaders) error {
	m.Reset()
	m.RequestID = f.RequestID
	fl := fields(f.body)
	for fl.next() {
		switch {
		case fl.num == fRespStatus && fl.typ == protowire.VarintType:
			m.StatusCode = int(uint32(fl.u))
		case fl.num == fRespHasBody && fl.typ == protowire.VarintType:
			m.HasBody = fl.u != 0
		case fl.num == fEventTimeout && fl.typ == protowire.VarintType:
			m.TimeoutMs = uint32(fl.u)
		case fl.num == fRespHeaders && fl.typ == protowire.BytesType:
			var err error
			if m.Headers, err = decodeHeaders(m.Headers, fl.b); err != nil {
				return err
			}
		}
	}
	return fl.err
}

// decodeHeaderOp decodes one HeaderOp. OPERATION_UNSPECIFIED (or no
// operation) reads as protocol.HeaderOpUnset; an operation number the enum
// does not have is an error.
func decodeHeaderOp(b []byte) (protocol.HeaderOp, error) {
	var op protocol.HeaderOp
	var code uint64
	f := fields(b)
	for f.next() {
		switch {
		case f.num == fOpOperation && f.typ == protowire.VarintType:
			code = uint64(int32(f.u)) // enums are int32 on the wire
		case f.typ != protowire.BytesType:
		case f.num == fOpName:
			op.Name = f.b
		case f.num == fOpValue:
			op.Value = f.b
		}
	}
	if f.err != nil {
		return op, f.err
	}
	switch code {
	case 0:
		op.Op = protocol.HeaderOpUnset
	case opSet:
		op.Op = protocol.HeaderSet
	case opAdd:
		op.Op = protocol.HeaderAdd
	case opRemove:
		op.Op = protocol.HeaderRemove
	default:
		return op, fmt.Errorf("%w: header operation %d", protocol.ErrProtocolField, int32(code))
	}
	return op, nil
}

func decodeBodyMutation(b []byte, m *protocol.BodyMutation) error {
	// Start from what m holds (zero for a first occurrence): a repeated
	// occurrence of an embedded mutation merges into it, as protobuf
	// merges a repeated message field.
	phase := uint64(m.Phase)
	data, present := mutationData(m)
	f := fields(b)
	for f.next() {
		switch {
		case f.num == fMutData && f.typ == protowire.BytesType:
			data, present = f.b, true
		case f.typ != protowire.VarintType:
		case f.num == fMutPhase:
			phase = uint64(int32(f.u))
		case f.num == fMutChunkIndex:
			m.ChunkIndex = uint32(f.u)
		}
	}
	if f.err != nil {
		return f.err
	}
	switch phase {
	case 0:
		m.Phase = protocol.PhaseRequest
	case 1:
		m.Phase = protocol.PhaseResponse
	default:
		return fmt.Errorf("%w: body mutation phase %d", protocol.ErrProtocolField, int32(phase))
	}
	// Data is set for a replace only: a merged occurrence that ends empty
	// (protobuf merges repeated messages) must not keep an earlier one's.
	switch {
	case !present:
		m.Action, m.Data = protocol.MutationPass, nil
	case len(data) == 0:
		m.Action, m.Data = protocol.MutationDrop, nil
	default:
		m.Action, m.Data = protocol.MutationReplace, data
	}
	return nil
}

// DecodeBodyMutation decodes a PayloadBodyMutation frame into m (reset first).
func (f *Frame) DecodeBodyMutation(m *protocol.BodyMutation) error {
	m.Reset()
	m.RequestID = f.RequestID
	return decodeBodyMutation(f.body, m)
}

// decodeCache merges a CacheDirective into c (a repeated message field
// merges, as in protobuf); a TTL above 32 bits is cut as uint32 would.
func decodeCache(b []byte, c *protocol.CacheDirective) error {
	f := fields(b)
	for f.next() {
		if f.typ != protowire.VarintType {
			continue
		}
		switch f.num {
		case fCacheNoStore:
			c.NoStore = f.u != 0
		case fCacheTTL:
			c.TTLMs = uint32(f.u)
		}
	}
	return f.err
}

func decodeAudit(b []byte, a *protocol.Audit) error {
	f := fields(b)
	for f.next() {
		switch {
		case f.num == fAuditConfidence && f.typ == protowire.Fixed64Type:
			a.Confidence, a.HasConf = math.Float64frombits(f.u), true
		case f.typ != protowire.BytesType:
		case f.num == fAuditTags:
			if err := checkList(len(a.Tags), "audit tags"); err != nil {
				return err
			}
			a.Tags = append(a.Tags, bytesOf(f.b))
		case f.num == fAuditRuleIDs:
			if err := checkList(len(a.RuleIDs), "audit rule ids"); err != nil {
				return err
			}
			a.RuleIDs = append(a.RuleIDs, bytesOf(f.b))
		case f.num == fAuditReasonCodes:
			if err := checkList(len(a.ReasonCodes), "audit reason codes"); err != nil {
				return err
			}
			a.ReasonCodes = append(a.ReasonCodes, bytesOf(f.b))
		case f.num == fAuditCustom:
			a.Custom = f.b
		}
	}
	return f.err
}

// decodeBlock reads the fields of a Block into m; a status is kept as
// sent, 0 (unset) included.
func decodeBlock(b []byte, m *protocol.Decision) error {
	f := fields(b)
	for f.next() {
		switch {
		case f.num == fBlockStatus && f.typ == protowire.VarintType:
			m.Status = int(uint32(f.u))
		case f.num == fBlockBody && f.typ == protowire.BytesType:
			m.Body = f.b
		case f.num == fBlockHeaders && f.typ == protowire.BytesType:
			var err error
			if m.BlockHeaders, err = decodeHeaders(m.BlockHeaders, f.b); err != nil {
				return err
			}
		}
	}
	return f.err
}

// decodeRedirect reads the fields of a Redirect into m; a status is kept
// as sent, 0 (unset) included.
func decodeRedirect(b []byte, m *protocol.Decision) error {
	f := fields(b)
	for f.next() {
		switch {
		case f.num == fRedirectStatus && f.typ == protowire.VarintType:
			m.Status = int(uint32(f.u))
		case f.num == fRedirectURL && f.typ == protowire.BytesType:
			m.RedirectURL = f.b
		}
	}
	return f.err
}

// DecodeDecision decodes a PayloadDecision frame into m (reset first);
// m.RequestID is set even on error. Like the JSON decoder it is syntactic:
// no verdict leaves Kind protocol.DecisionUnset, a status absent or 0
// stays 0, NeedsMore is the needs_more field as sent and an embedded
// mutation keeps what it carries; protocol.Decision.Normalize applies the
// schema to that.
func (f *Frame) DecodeDecision(m *protocol.Decision) error {
	m.Reset()
	m.RequestID = f.RequestID
	m.Kind = protocol.DecisionUnset
	var last protowire.Number // the oneof member seen last
	fl := fields(f.body)
	for fl.next() {
		if fl.typ == protowire.VarintType {
			if fl.num == fDecNeedsMore {
				m.NeedsMore = fl.u != 0
			}
			continue
		}
		if fl.typ != protowire.BytesType {
			continue
		}
		if fl.num >= fDecAllow && fl.num <= fDecNeedsMoreVerdict && fl.num != last {
			// As in a protobuf oneof: another member replaces the verdict,
			// the same member again merges into it.
			m.Status, m.Body, m.BlockHeaders, m.RedirectURL = 0, nil, m.BlockHeaders[:0], nil
			last = fl.num
		}
		var err error
		switch fl.num {
		case fDecAllow:
			m.Kind = protocol.DecisionAllow
		case fDecBlock:
			m.Kind = protocol.DecisionBlock
			err = decodeBlock(fl.b, m)
		case fDecRedirect:
			m.Kind = protocol.DecisionRedirect
			err = decodeRedirect(fl.b, m)
		case fDecNeedsMoreVerdict:
			m.Kind = protocol.DecisionNeedsMore
		case fDecRequestOps, fDecResponseOps:
			var op protocol.HeaderOp
			if op, err = decodeHeaderOp(fl.b); err == nil {
				ops := &m.RequestHeaderOps
				if fl.num == fDecResponseOps {
					ops = &m.ResponseHeaderOps
				}
				if err = checkList(len(*ops), "header operations"); err == nil {
					*ops = append(*ops, op)
				}
			}
		case fDecRequestMutation:
			m.HasRequestBodyMutation = true
			err = decodeBodyMutation(fl.b, &m.RequestBodyMutation)
		case fDecResponseMutation:
			m.HasResponseBodyMutation = true
			err = decodeBodyMutation(fl.b, &m.ResponseBodyMutation)
		case fDecAudit:
			err = decodeAudit(fl.b, &m.Audit)
		case fDecCache:
			err = decodeCache(fl.b, &m.Cache)
		}
		if err != nil {
			return err
		}
	}
	return fl.err
}

// decodeText reads field 1 (a proto3 string) of a cancel or agent error.
func decodeText(b []byte) ([]byte, error) {
	var text []byte
	f := fields(b)
	for f.next() {
		if f.num == fReason && f.typ == protowire.BytesType {
			text = f.b
		}
	}
	if f.err != nil {
		return nil, f.err
	}
	if !utf8.Valid(text) {
		return nil, malformed("string field is not valid UTF-8")
	}
	return text, nil
}

// DecodeCancel decodes a PayloadCancel frame.
func (f *Frame) DecodeCancel(m *protocol.CancelRequest) error {
	reason, err := decodeText(f.body)
	m.RequestID, m.Reason = f.RequestID, reason
	return err
}

// DecodeCancelAll decodes a PayloadCancelAll frame.
func (f *Frame) DecodeCancelAll(m *protocol.CancelAll) error {
	reason, err := decodeText(f.body)
	m.Reason = reason
	return err
}

// AgentError returns the message of a PayloadAgentError frame.
func (f *Frame) AgentError() (string, error) {
	text, err := decodeText(f.body)
	return string(text), err
}

// DecodePing decodes a PayloadPing or PayloadPong frame.
func (f *Frame) DecodePing(m *protocol.Ping) error {
	*m = protocol.Ping{}
	fl := fields(f.body)
	for fl.next() {
		switch {
		case fl.typ != protowire.VarintType:
		case fl.num == fPingSequence:
			m.Sequence = fl.u
		case fl.num == fPingTimestamp:
			m.TimestampMs = int64(fl.u)
		}
	}
	return fl.err
}
