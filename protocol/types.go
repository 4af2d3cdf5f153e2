// Package protocol holds the messages of agent protocol v2 shared by every
// transport (UDS, reverse connections, gRPC) and their JSON wire codec.
//
// The hot messages (RequestHeaders, BodyChunk, ResponseHeaders, Decision,
// BodyMutation) use []byte fields so that a decoder can point them into a
// buffer owned by the message itself and reuse it frame after frame without
// allocating. A decoded message is valid until the next Decode into it or
// its Reset. See docs/protocol.md for where this implementation decides what
// the wire contract leaves open.
package protocol

import "errors"

// Version is the only protocol version this implementation speaks.
const Version = 2

// Size limits from the wire contract.
const (
	// MaxFrameSize is the largest UDS frame length (type byte + payload).
	MaxFrameSize = 16 << 20
	// MaxGRPCMessageSize is the largest gRPC message in either direction.
	MaxGRPCMessageSize = 10 << 20
	// MaxListEntries caps every list of one message — headers, header
	// operations, audit tags, rule ids and reason codes — in every decoder.
	// An entry can cost 2 bytes on the wire and 56 in memory, so without
	// it one 16 MiB frame of empty entries would decode into ~0.5 GB
	// before any per-reply limit (agents[].limits.header_ops, at most
	// 100000) could refuse it.
	MaxListEntries = 100000
)

// MsgType is the type byte of a frame.
type MsgType uint8

// Frame types of docs/protocol.md section 2.5 (Frame types).
const (
	TypeHandshakeRequest     MsgType = 0x01
	TypeHandshakeResponse    MsgType = 0x02
	TypeRegistrationRequest  MsgType = 0x03
	TypeRegistrationResponse MsgType = 0x04
	TypeRequestHeaders       MsgType = 0x10
	TypeRequestBodyChunk     MsgType = 0x11
	TypeResponseHeaders      MsgType = 0x12
	TypeResponseBodyChunk    MsgType = 0x13
	TypeDecision             MsgType = 0x20
	TypeBodyMutation         MsgType = 0x21
	TypeCancelRequest        MsgType = 0x30
	TypeCancelAll            MsgType = 0x31
	TypePing                 MsgType = 0xF0
	TypePong                 MsgType = 0xF1
)

// String names the type for logs.
func (t MsgType) String() string {
	switch t {
	case TypeHandshakeRequest:
		return "HandshakeRequest"
	case TypeHandshakeResponse:
		return "HandshakeResponse"
	case TypeRegistrationRequest:
		return "RegistrationRequest"
	case TypeRegistrationResponse:
		return "RegistrationResponse"
	case TypeRequestHeaders:
		return "RequestHeaders"
	case TypeRequestBodyChunk:
		return "RequestBodyChunk"
	case TypeResponseHeaders:
		return "ResponseHeaders"
	case TypeResponseBodyChunk:
		return "ResponseBodyChunk"
	case TypeDecision:
		return "Decision"
	case TypeBodyMutation:
		return "BodyMutation"
	case TypeCancelRequest:
		return "CancelRequest"
	case TypeCancelAll:
		return "CancelAll"
	case TypePing:
		return "Ping"
	case TypePong:
		return "Pong"
	}
	return "Unknown"
}

// Sentinel errors. Decoders wrap them with the offending field; callers
// test with errors.Is.
var (
	// ErrProtocolSyntax: the payload is not a valid UTF-8 JSON object.
	ErrProtocolSyntax = errors.New("protocol: payload is not a valid JSON object")
	// ErrProtocolField: a field has the wrong JSON type or an invalid value.
	ErrProtocolField = errors.New("protocol: invalid field")
	// ErrProtocolVersion: the peer speaks another protocol version.
	ErrProtocolVersion = errors.New("protocol: unsupported protocol version")
	// ErrProtocolDecision: the decision kind is unknown or its parameters are invalid.
	ErrProtocolDecision = errors.New("protocol: invalid decision")
)

// Phase says which side of the exchange a body or header operation belongs to.
type Phase uint8

// Phases.
const (
	PhaseRequest Phase = iota
	PhaseResponse
)

// String is the wire name of the phase.
func (p Phase) String() string {
	if p == PhaseResponse {
		return "response"
	}
	return "request"
}

// Header is one header field. A name with several values appears as several
// Header entries in order; the JSON codec groups them into name → list.
type Header struct {
	Name  []byte
	Value []byte
}

// Headers is an ordered list of header fields.
type Headers []Header

// Get returns the first value of name (compared case-insensitively) or nil.
func (h Headers) Get(name string) []byte {
	for i := range h {
		if equalFold(h[i].Name, name) {
			return h[i].Value
		}
	}
	return nil
}

// Add appends a field. The slices are kept, not copied.
func (h Headers) Add(name, value []byte) Headers {
	return append(h, Header{Name: name, Value: value})
}

func equalFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(b); i++ {
		x, y := b[i], s[i]
		if x == y {
			continue
		}
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// Metadata describes the request beyond its headers. Empty fields are
// unknown and are omitted on the wire; ClientPort 0 is unknown.
type Metadata struct {
	CorrelationID []byte
	ClientIP      []byte
	ClientPort    int
	Protocol      []byte
	ServerName    []byte
	RouteID       []byte
	UpstreamID    []byte
	Traceparent   []byte
	Timestamp     []byte // RFC 3339
	// TLS facts of the client connection, empty for plain HTTP.
	TLSVersion    []byte // "TLS1.2" or "TLS1.3"
	TLSCipher     []byte // the cipher suite's IANA name
	TLSServerName []byte // the SNI the client sent
	// TLSClientSubject and TLSClientSAN describe the client certificate
	// the listener verified (mTLS): its subject (RFC 2253) and its
	// subject alternative names as "DNS:a,URI:b,IP:c,email:d".
	TLSClientSubject []byte
	TLSClientSAN     []byte
	// The listener the request arrived on: the local address of the
	// client's connection and the listener's name. Sent to every agent.
	ServerIP   []byte
	ServerPort int // 0: unknown
	ListenerID []byte
	// What the upstream receives where it differs from the client's view
	// (FeatureClientRequest only): the Host header and the
	// X-Forwarded-For, X-Forwarded-Proto and X-Forwarded-Host values.
	UpstreamHost   []byte
	ForwardedFor   []byte
	ForwardedProto []byte
	ForwardedHost  []byte
	// Path is the request's path decoded and normalised as the proxy
	// routed it: percent-escapes decoded, dot segments resolved, repeated
	// slashes merged, no query. Policies on paths match it, not URI, which
	// carries the target as forwarded ("/a/../private" routes, and is
	// served by most servers, as "/private"). Sent to every agent.
	Path []byte
}

// RequestHeaders (0x10) opens a request.
type RequestHeaders struct {
	RequestID uint64
	// TimeoutMs is how long the proxy waits for the answer to this event,
	// in milliseconds from when it sent it ("timeout_ms"); 0: unknown (an
	// older proxy, or no bound). See docs/protocol.md §7.7.
	TimeoutMs uint32
	Method    []byte
	URI       []byte
	// RequestTarget is the request-target exactly as the client sent it
	// (origin-form, absolute-form or "*"); sent only to an agent that
	// negotiated FeatureClientRequest, whose Headers are then the
	// client's header block (docs/protocol.md §4.5). URI stays the
	// origin-form target the upstream gets.
	RequestTarget []byte
	HasBody       bool
	Headers       Headers
	Metadata      Metadata
	// HasInlineBody says the event carries chunk 0 of the request body in
	// InlineBody ("inline_body", sent only to an agent that negotiated
	// FeatureInlineBody); the Decision to the event answers that chunk too.
	HasInlineBody bool
	// InlineBody is chunk 0 of the request body when HasInlineBody. Its
	// RequestID is not on the wire (the event's is); a decoder leaves it 0.
	InlineBody BodyChunk

	raw []byte // decoder-owned backing store
}

// Reset clears m, keeping its buffers for reuse.
func (m *RequestHeaders) Reset() {
	raw, hdr := m.raw[:0], m.Headers[:0]
	*m = RequestHeaders{raw: raw, Headers: hdr}
}

// BodyChunk is a RequestBodyChunk (0x11) or ResponseBodyChunk (0x13); the
// frame type says which. Data holds the decoded bytes (base64 on the wire).
type BodyChunk struct {
	RequestID uint64
	// TimeoutMs is the event's answer timeout, as in RequestHeaders. It is
	// not on the wire for the inline body of a RequestHeaders (the
	// event's own counts).
	TimeoutMs  uint32
	ChunkIndex uint32
	Data       []byte
	IsLast     bool
	// TotalSize is the whole body size when known (Content-Length), else -1.
	TotalSize int64
	// Progress is bytes_received (request) or bytes_sent (response) so far,
	// -1 when not sent.
	Progress int64

	raw []byte
}

// Reset clears m, keeping its buffers for reuse.
func (m *BodyChunk) Reset() {
	raw := m.raw[:0]
	*m = BodyChunk{raw: raw, TotalSize: -1, Progress: -1}
}

// ResponseHeaders (0x12) carries the upstream response's status and headers.
type ResponseHeaders struct {
	RequestID uint64
	// TimeoutMs is the event's answer timeout, as in RequestHeaders.
	TimeoutMs  uint32
	StatusCode int
	Headers    Headers
	HasBody    bool

	raw []byte
}

// Reset clears m, keeping its buffers for reuse.
func (m *ResponseHeaders) Reset() {
	raw, hdr := m.raw[:0], m.Headers[:0]
	*m = ResponseHeaders{raw: raw, Headers: hdr}
}

// DecisionKind is the verdict of a Decision.
type DecisionKind uint8

// Decision kinds. NeedsMore is "no verdict yet, send the next chunk".
const (
	DecisionAllow DecisionKind = iota
	DecisionBlock
	DecisionRedirect
	DecisionNeedsMore
)

// String names the kind.
func (k DecisionKind) String() string {
	switch k {
	case DecisionAllow:
		return "allow"
	case DecisionBlock:
		return "block"
	case DecisionRedirect:
		return "redirect"
	case DecisionNeedsMore:
		return "needs_more"
	case DecisionUnset:
		return "unset"
	}
	return "unknown"
}

// HeaderOpKind is the operation of a HeaderOp.
type HeaderOpKind uint8

// Header operations.
const (
	HeaderSet HeaderOpKind = iota
	HeaderAdd
	HeaderRemove
)

// String is the wire name of the operation.
func (k HeaderOpKind) String() string {
	switch k {
	case HeaderAdd:
		return "add"
	case HeaderRemove:
		return "remove"
	case HeaderOpUnset:
		return "unset"
	}
	return "set"
}

// HeaderOp is one header change requested by an agent.
type HeaderOp struct {
	Op    HeaderOpKind
	Name  []byte
	Value []byte // unused for HeaderRemove
}

// Audit is the optional audit record of a Decision.
type Audit struct {
	Tags        [][]byte
	RuleIDs     [][]byte
	Confidence  float64
	HasConf     bool
	ReasonCodes [][]byte
	// Custom is the raw JSON of "custom", kept verbatim (nil when absent).
	Custom []byte
}

// Empty reports whether no audit field is set.
func (a *Audit) Empty() bool {
	return len(a.Tags) == 0 && len(a.RuleIDs) == 0 && !a.HasConf && len(a.ReasonCodes) == 0 && len(a.Custom) == 0
}

// MutationAction says what to do with one body chunk.
type MutationAction uint8

// Mutation actions: data absent/null → pass, "" → drop, bytes → replace.
const (
	MutationPass MutationAction = iota
	MutationDrop
	MutationReplace
)

// BodyMutation (0x21) tells the proxy what to forward for one chunk.
type BodyMutation struct {
	RequestID  uint64
	Phase      Phase
	ChunkIndex uint32
	Action     MutationAction
	Data       []byte // only for MutationReplace

	raw []byte
}

// Reset clears m, keeping its buffers for reuse.
func (m *BodyMutation) Reset() {
	raw := m.raw[:0]
	*m = BodyMutation{raw: raw}
}

// Decision (0x20) is an agent's answer to one event.
type Decision struct {
	RequestID uint64
	Kind      DecisionKind
	// NeedsMore is set for DecisionNeedsMore and for an allow that carries
	// the top-level "needs_more": true; both mean "send the next chunk".
	// (A decoder keeps the flag as sent; Normalize makes this hold.)
	NeedsMore bool

	// Block parameters.
	Status       int // block: 100–599 (0: 403); redirect: 3xx (0: 302), applied by Normalize
	Body         []byte
	BlockHeaders Headers
	// Redirect parameter.
	RedirectURL []byte

	RequestHeaderOps  []HeaderOp
	ResponseHeaderOps []HeaderOp

	// Body mutations carried inside a Decision (optional).
	HasRequestBodyMutation  bool
	RequestBodyMutation     BodyMutation
	HasResponseBodyMutation bool
	ResponseBodyMutation    BodyMutation

	Audit Audit

	// Cache is the agent's say over the proxy's decision cache for this
	// answer ("cache" on the wire; optional, ignored where no cache is
	// configured).
	Cache CacheDirective

	// SetQuery replaces the query of the upstream request's target with
	// Query (without the '?'; empty: the target has no query), in an
	// allow of the request phase. It is not on the wire: only in-process
	// transports set it (ext_authz, for its query_parameters_to_set and
	// _remove), and the dataplane holds it to its rules and limits as a
	// header operation.
	SetQuery bool
	Query    []byte

	raw []byte
}

// CacheDirective lets an agent set or forbid caching of one header
// decision by the proxy's decision cache. The zero value leaves it to the
// proxy's configuration.
type CacheDirective struct {
	// NoStore forbids caching this decision ("cache": "no_store").
	NoStore bool
	// TTLMs caches it for this many milliseconds ("cache": {"ttl_ms": N});
	// 0 leaves the TTL to the configuration. The proxy caps it at its
	// configured maximum.
	TTLMs uint32
}

// Empty reports whether the directive says nothing.
func (c CacheDirective) Empty() bool { return !c.NoStore && c.TTLMs == 0 }

// Reset clears m, keeping its buffers for reuse.
func (m *Decision) Reset() {
	raw := m.raw[:0]
	bh, rq, rs := m.BlockHeaders[:0], m.RequestHeaderOps[:0], m.ResponseHeaderOps[:0]
	tags, rules, codes := m.Audit.Tags[:0], m.Audit.RuleIDs[:0], m.Audit.ReasonCodes[:0]
	*m = Decision{raw: raw, BlockHeaders: bh, RequestHeaderOps: rq, ResponseHeaderOps: rs, Query: m.Query[:0]}
	m.Audit.Tags, m.Audit.RuleIDs, m.Audit.ReasonCodes = tags, rules, codes
}

// Final reports whether the decision ends the agent's say over the phase.
func (m *Decision) Final() bool { return !m.NeedsMore && m.Kind != DecisionNeedsMore }

// CancelRequest (0x30) tells the agent to stop work on one request.
type CancelRequest struct {
	RequestID uint64
	Reason    []byte

	raw []byte
}

// CancelAll (0x31) tells the agent to stop work on every request.
type CancelAll struct {
	Reason []byte

	raw []byte
}

// Ping (0xF0) and Pong (0xF1) share this payload; a Pong echoes the Ping.
type Ping struct {
	Sequence    uint64
	TimestampMs int64
}

// Capabilities are what an agent declares in its handshake or registration.
type Capabilities struct {
	HandlesRequestHeaders  bool `json:"handles_request_headers"`
	HandlesRequestBody     bool `json:"handles_request_body"`
	HandlesResponseHeaders bool `json:"handles_response_headers"`
	HandlesResponseBody    bool `json:"handles_response_body"`
	SupportsStreaming      bool `json:"supports_streaming"`
	SupportsCancellation   bool `json:"supports_cancellation"`
	// SupportsInlineBody: the agent takes chunk 0 of a buffered request
	// body inside RequestHeaders (FeatureInlineBody). Written only when true.
	SupportsInlineBody bool `json:"supports_inline_body,omitempty"`
	// SupportsProtobufPayloads: after the handshake (or registration) the
	// agent takes and sends frame payloads in the protobuf encoding of
	// agent.proto instead of JSON (FeatureProtobufPayloads). Written only
	// when true.
	SupportsProtobufPayloads bool `json:"supports_protobuf_payloads,omitempty"`
	// SupportsClientRequest: the agent takes the request as the client
	// sent it in RequestHeaders (FeatureClientRequest) instead of the
	// request the proxy forwards. Written only when true.
	SupportsClientRequest bool `json:"supports_client_request,omitempty"`
	// MaxConcurrentRequests of 0 means the agent sets no limit.
	MaxConcurrentRequests uint32 `json:"max_concurrent_requests,omitempty"`
}

// Handles reports whether the agent wants events of the given phase and kind.
func (c Capabilities) Handles(phase Phase, body bool) bool {
	switch {
	case phase == PhaseRequest && !body:
		return c.HandlesRequestHeaders
	case phase == PhaseRequest && body:
		return c.HandlesRequestBody
	case phase == PhaseResponse && !body:
		return c.HandlesResponseHeaders
	default:
		return c.HandlesResponseBody
	}
}

// Features a proxy may offer in its handshake.
const (
	FeatureCancellation = "cancellation"
	FeatureBodyMutation = "body_mutation"
	FeatureStreaming    = "streaming"
	// FeatureInlineBody: the proxy can send chunk 0 of a buffered request
	// body inside RequestHeaders to an agent that declares
	// supports_inline_body, and take one Decision for both.
	FeatureInlineBody = "inline_body"
	// FeatureProtobufPayloads: the proxy can exchange the frames after the
	// handshake with protobuf payloads (the AgentMessage of agent.proto,
	// the gRPC transport's stream message) with an agent that declares
	// supports_protobuf_payloads. JSON stays the default.
	FeatureProtobufPayloads = "protobuf_payloads"
	// FeatureClientRequest: the proxy can show an agent that declares
	// supports_client_request the request as the client sent it: the
	// client's header block (hop-by-hop headers, framing headers and
	// forwarding claims included), request_target, and what the
	// upstream receives instead in metadata (upstream_host,
	// forwarded_for, forwarded_proto, forwarded_host).
	FeatureClientRequest = "client_request"
)

// Payload encodings of the frames after a handshake or registration.
const (
	// EncodingJSON is the default: UTF-8 JSON objects.
	EncodingJSON = "json"
	// EncodingProtobuf: each payload is one AgentMessage of agent.proto.
	EncodingProtobuf = "protobuf"
)

// HandshakeRequest (0x01) is the first frame on a proxy-initiated connection.
type HandshakeRequest struct {
	ProtocolVersion   int      `json:"protocol_version"`
	ClientName        string   `json:"client_name"`
	SupportedFeatures []string `json:"supported_features"`
}

// HandshakeResponse (0x02) is the agent's answer. A response without
// "accepted" is an acceptance (the seed's shape); Accepted is then true.
type HandshakeResponse struct {
	ProtocolVersion int          `json:"protocol_version"`
	AgentName       string       `json:"agent_name"`
	Accepted        bool         `json:"accepted"`
	Error           string       `json:"error,omitempty"`
	Capabilities    Capabilities `json:"capabilities"`
}

// RegistrationRequest (0x03) is the first frame on a reverse connection.
type RegistrationRequest struct {
	ProtocolVersion int          `json:"protocol_version"`
	AgentID         string       `json:"agent_id"`
	Capabilities    Capabilities `json:"capabilities"`
	AuthToken       string       `json:"auth_token,omitempty"`
	// Metadata is kept as raw JSON (nil when absent).
	Metadata []byte `json:"-"`
}

// RegistrationResponse (0x04) answers a registration.
type RegistrationResponse struct {
	Accepted   bool   `json:"accepted"`
	Error      string `json:"error,omitempty"`
	AssignedID string `json:"assigned_id,omitempty"`
	// PayloadEncoding is the encoding of the frames that follow:
	// EncodingProtobuf when the agent declared supports_protobuf_payloads
	// and the proxy takes it; empty (absent on the wire) means
	// EncodingJSON.
	PayloadEncoding string `json:"payload_encoding,omitempty"`
	// Config is pushed configuration as raw JSON (nil when absent).
	Config []byte `json:"-"`
}
