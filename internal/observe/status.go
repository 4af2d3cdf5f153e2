package observe

// Stats are the dataplane's own counters since New.
type Stats struct {
	Requests          uint64 `json:"requests"`           // requests handled
	Blocked           uint64 `json:"blocked"`            // answered by an agent's block or redirect
	FailOpen          uint64 `json:"fail_open"`          // agent failures that let a request pass
	FailClosed        uint64 `json:"fail_closed"`        // agent failures answered with 503/504
	MutationsRefused  uint64 `json:"mutations_refused"`  // header operations refused by the security rules
	InspectionSkipped uint64 `json:"inspection_skipped"` // bodies passed uninspected past a buffer limit
	UpstreamErrors    uint64 `json:"upstream_errors"`    // 502 answers
	UpstreamTimeouts  uint64 `json:"upstream_timeouts"`  // 504 answers for the upstream
	ClientGone        uint64 `json:"client_gone"`        // requests whose client went away mid-request
	ResponseAborted   uint64 `json:"response_aborted"`   // responses cut off after their headers were sent
	InFlight          int64  `json:"in_flight"`          // requests being handled or streamed now
	AcceptErrors      uint64 `json:"accept_errors"`      // accepts that failed for lack of descriptors or memory (retried)
	ListenersClamped  uint64 `json:"listeners_clamped"`  // listeners whose max_connections was lowered to the fd limit
	AbsoluteForm      uint64 `json:"absolute_form"`      // absolute-form targets rewritten to origin-form
	UpstreamStale     uint64 `json:"upstream_stale"`     // idle pools dropped after a stale keep-alive connection
	UpstreamRetries   uint64 `json:"upstream_retries"`   // requests replayed on another connection after a stale one
	// UpstreamDiscardedUnsolicited counts upstream connections closed
	// because the upstream sent bytes no request asked for (past the end
	// of a response, or while the connection sat in the pool).
	UpstreamDiscardedUnsolicited uint64 `json:"upstream_discarded_unsolicited"`
	// UpstreamDiscardedClosed counts pooled upstream connections found
	// closed (FIN or reset) before a request was written on them.
	UpstreamDiscardedClosed uint64 `json:"upstream_discarded_closed"`
	// RequestBodyReadsJoined and ResponseBodyReadsJoined count the reads
	// of a body's framing (a chunk of a chunked body, mostly) whose bytes
	// joined an earlier read's in one body chunk, because they were
	// already received.
	RequestBodyReadsJoined  uint64 `json:"request_body_reads_joined"`
	ResponseBodyReadsJoined uint64 `json:"response_body_reads_joined"`
	// RequestBodyTooSlow counts request bodies answered 408 for falling
	// behind their listener's body_min_rate.
	RequestBodyTooSlow uint64 `json:"request_body_too_slow"`
	EndpointRetries    uint64 `json:"endpoint_retries"`   // attempts moved to another upstream endpoint after a connection failure
	TraceInvalid       uint64 `json:"trace_invalid"`      // malformed traceparent headers removed (with their tracestate)
	TracestateInvalid  uint64 `json:"tracestate_invalid"` // malformed tracestate headers removed (valid traceparent kept)
	TraceGenerated     uint64 `json:"trace_generated"`    // traceparent headers made for requests without a valid one
	LimitsExceeded     uint64 `json:"limits_exceeded"`    // agent replies over their header limits (failure policy applied)
	InlineBodies       uint64 `json:"inline_bodies"`      // RequestHeaders events that carried chunk 0 of the request body (inline_body)
	// RateLimited counts requests answered 429 by a local rate limit.
	RateLimited uint64 `json:"rate_limited"`
	// RateLimitedBy splits the current limits' refusals by limit:
	// "route/NAME" or "listener/NAME" (a limit whose settings a reload
	// changed starts again from 0).
	RateLimitedBy map[string]uint64 `json:"rate_limited_by,omitempty"`
	// RateLimitKeysEvictedBy counts, per keyed limit ("route/NAME" or
	// "listener/NAME"), the keys dropped (least recently used first) to
	// keep the limit within its max_keys: a key flood shows here.
	RateLimitKeysEvictedBy map[string]uint64 `json:"rate_limit_keys_evicted_by,omitempty"`
	// RouteRetries counts retries made under routes' retry policies.
	RouteRetries uint64 `json:"route_retries"`
	// RetryBudgetExhausted counts retries a route's retry budget refused.
	RetryBudgetExhausted uint64 `json:"retry_budget_exhausted"`
	// RouteRetriesBy splits the current retry policies' counters by
	// route (a policy whose settings a reload changed starts again from
	// 0).
	RouteRetriesBy map[string]RouteRetryStats `json:"route_retries_by,omitempty"`
	// Trailers counts trailer fields forwarded, dropped and refused.
	Trailers TrailerStats `json:"trailers"`
	// GlobalRateLimited counts requests the rate limit service said were
	// over a limit (429).
	GlobalRateLimited uint64 `json:"global_rate_limited"`
	// GlobalRateLimitErrors counts calls to the rate limit service that
	// failed (the failure mode applied).
	GlobalRateLimitErrors uint64 `json:"global_rate_limit_errors"`
	// TLS counts the listeners' handshakes and certificate reloads.
	TLS TLSStats `json:"tls"`
	// Tunnels counts the Upgrade (WebSocket) tunnels and their bytes.
	Tunnels TunnelStats `json:"tunnels"`
	// Connections counts each listener's client connections,
	// in configuration order.
	Connections []ConnStats `json:"connections"`
	// Rejected counts request heads answered 400/408/414/431 by reason
	// (RejectReasons).
	Rejected map[string]uint64 `json:"rejected"`
	// HTTP2 counts the HTTP/2 connections and streams of every listener.
	HTTP2 HTTP2Stats `json:"http2"`
	// RequestsByProtocol counts requests by the client's protocol:
	// http1 (HTTP/1.x), h2 (HTTP/2 over TLS), h2c (cleartext HTTP/2).
	RequestsByProtocol map[string]uint64 `json:"requests_by_protocol"`
}

// RouteRetryStats is one route's retry policy's counters.
type RouteRetryStats struct {
	// Retries counts the retries made, by the retry_on kind that
	// triggered them (every kind the policy lists).
	Retries map[string]uint64 `json:"retries"`
	// BudgetExhausted counts retries the route's retry budget refused.
	BudgetExhausted uint64 `json:"budget_exhausted"`
	// NotReplayable counts retries not made because the request could not
	// be sent again: its body was consumed by the try, or it is not
	// idempotent and the try ended in a reset or timeout.
	NotReplayable uint64 `json:"not_replayable"`
}

// TrailerStats counts trailer fields by direction: forwarded, dropped
// (the far side's framing cannot carry them: a body with a
// Content-Length, an HTTP/1.0 client) and refused (a field RFC 9110
// §6.5.1 keeps out of trailers, or a bad value).
type TrailerStats struct {
	RequestForwarded  uint64 `json:"request_forwarded"`
	RequestDropped    uint64 `json:"request_dropped"`
	RequestRefused    uint64 `json:"request_refused"`
	ResponseForwarded uint64 `json:"response_forwarded"`
	ResponseDropped   uint64 `json:"response_dropped"`
	ResponseRefused   uint64 `json:"response_refused"`
}

// HTTP2Stats counts the HTTP/2 front end's connections and streams.
type HTTP2Stats struct {
	Connections     uint64 `json:"connections"`      // HTTP/2 connections served
	ConnectionsOpen int64  `json:"connections_open"` // HTTP/2 connections open now
	Streams         uint64 `json:"streams"`          // request streams served
	StreamsOpen     int64  `json:"streams_open"`     // request streams being served now
	// RefusedStreams counts streams refused past max_concurrent_streams.
	RefusedStreams uint64 `json:"refused_streams"`
	// RapidResets counts connections closed for resetting too many
	// streams before their response (CVE-2023-44487).
	RapidResets uint64 `json:"rapid_resets"`
	// HeaderListTooLarge counts requests answered 431 past
	// max_header_list_size.
	HeaderListTooLarge uint64 `json:"header_list_too_large"`
	// ProtocolErrors counts the other protocol errors the server
	// answered with a stream or connection error.
	ProtocolErrors uint64 `json:"protocol_errors"`
	// GRPCAnswers counts the sidecar's own answers (blocks, failures)
	// sent to gRPC requests as a gRPC status.
	GRPCAnswers uint64 `json:"grpc_answers"`
	// ShutdownGoAways counts connections sent a GOAWAY by a shutdown.
	ShutdownGoAways uint64 `json:"shutdown_goaways"`
	// IdleClosed counts connections closed after idle_timeout with no
	// stream open.
	IdleClosed uint64 `json:"idle_closed"`
	// FrameTooLarge counts connections closed (GOAWAY FRAME_SIZE_ERROR)
	// for a frame longer than max_read_frame_size.
	FrameTooLarge uint64 `json:"frame_too_large"`
	// FrameSizeErrors counts frames refused for a length their type does
	// not allow (a PING not 8 bytes long, …).
	FrameSizeErrors uint64 `json:"frame_size_errors"`
}

// ConnStats count one listener's client connections.
type ConnStats struct {
	Listener string `json:"listener"`
	// Open is the connections open now, tunnels excepted (they count as
	// tunnels), lingering closes included.
	Open     int64  `json:"open"`
	Accepted uint64 `json:"accepted"` // connections accepted (refused ones included)
	// RefusedMaxConnections: connections closed unanswered right after
	// accept because max_connections were open.
	RefusedMaxConnections uint64 `json:"refused_max_connections"`
	// IdleClosed: connections closed unanswered at read_timeout because
	// no byte of a first request arrived (kept-alive connections close
	// silently at idle_timeout and are not counted).
	IdleClosed uint64 `json:"idle_closed"`
	// LingeringCloses: closes that shut the connection down for writing
	// and discarded what the client still sent; LingeringTimeouts and
	// LingeringCapped of them ended at lingering_timeout and at
	// max_lingering_bytes instead of at the client's end of stream.
	LingeringCloses   uint64 `json:"lingering_closes"`
	LingeringTimeouts uint64 `json:"lingering_timeouts"`
	LingeringCapped   uint64 `json:"lingering_capped"`
	LingeringBytes    uint64 `json:"lingering_bytes"` // bytes discarded by lingering closes
}

// TLSStats are the TLS counters of the listeners.
type TLSStats struct {
	Handshakes      uint64 `json:"handshakes"`       // completed client handshakes
	HandshakeErrors uint64 `json:"handshake_errors"` // failed client handshakes (refused client certificates included)
	Reloads         uint64 `json:"reloads"`          // certificate sets (re)loaded after a change or a reload
	ReloadErrors    uint64 `json:"reload_errors"`    // rotations that failed (the old certificates stay)
	PlainHTTP       uint64 `json:"plain_http"`       // plain HTTP requests answered 400 instead of a handshake (not in HandshakeErrors)
}

// TunnelStats count the Upgrade tunnels.
type TunnelStats struct {
	Opened      uint64 `json:"opened"`       // tunnels started (101 relayed)
	Closed      uint64 `json:"closed"`       // tunnels ended
	Open        int64  `json:"open"`         // tunnels open now
	Refused     uint64 `json:"refused"`      // upgrade requests refused at max_tunnels (503)
	IdleClosed  uint64 `json:"idle_closed"`  // tunnels ended by tunnel_idle_timeout
	DrainClosed uint64 `json:"drain_closed"` // tunnels cut at the end of the shutdown grace period
	BytesIn     uint64 `json:"bytes_in"`     // client to upstream
	BytesOut    uint64 `json:"bytes_out"`    // upstream to client
}

// PolicyStatus is the state of the policy features (circuit breakers,
// shadow agents, decision caches, failover, over-limit bodies) for status
// pages and metrics.
type PolicyStatus struct {
	// Circuits lists the agents with a circuit breaker.
	Circuits []BreakerStatus `json:"circuits,omitempty"`
	// Shadows lists the shadow agents.
	Shadows []ShadowStatus `json:"shadows,omitempty"`
	// Caches lists the agents with a decision cache.
	Caches []CacheStatus `json:"decision_caches,omitempty"`
	// Failovers lists the agents with several members or retries.
	Failovers []FailoverStatus `json:"failovers,omitempty"`
	// Bodies lists the agents with an over_limit of prefix or stream.
	Bodies []BodyStatus `json:"over_limit_bodies,omitempty"`
}

// Circuit states as reported by BreakerStatus.
const (
	CircuitClosed   = "closed"
	CircuitOpen     = "open"
	CircuitHalfOpen = "half_open"
)

// BreakerStatus is a point-in-time view of one agent's circuit.
type BreakerStatus struct {
	Agent string `json:"agent"`
	// State is closed, open or half_open (a probe request is out).
	State string `json:"state"`
	// Failures is the current run of consecutive failures.
	Failures uint32 `json:"consecutive_failures"`
	// Opens counts transitions to open (a failed probe included).
	Opens uint64 `json:"opens"`
	// Closes counts transitions back to closed.
	Closes uint64 `json:"closes"`
	// Rejected counts exchanges not opened because the circuit was open.
	Rejected uint64 `json:"rejected"`
	// Probes counts probe requests let through after a cool-down.
	Probes uint64 `json:"probes"`
}

// ShadowStatus counts what one shadow agent saw and would have done.
type ShadowStatus struct {
	Agent string `json:"agent"`
	// Queued events were accepted into the queue. Dropped counts the
	// conversations (requests) abandoned because one of their events did
	// not fit the queue (shadow_queue events, shadow_queue_bytes of body
	// data): their later events were not sent.
	Queued  uint64 `json:"queued"`
	Dropped uint64 `json:"dropped"`
	// Failed conversations got no answer (timeout, connection, overload).
	Failed uint64 `json:"failed"`
	// Allowed, WouldBlock and WouldRedirect are the answers, of every
	// phase; WouldMutate counts the answers that would have changed a
	// body chunk (never applied).
	Allowed       uint64 `json:"allowed"`
	WouldBlock    uint64 `json:"would_block"`
	WouldRedirect uint64 `json:"would_redirect"`
	WouldMutate   uint64 `json:"would_mutate"`
	// ByStatus counts blocks and redirects by status; ByRule counts them
	// by the audit rule ids of the decision (at most 64, then "(other)").
	ByStatus map[string]uint64 `json:"by_status,omitempty"`
	ByRule   map[string]uint64 `json:"by_rule,omitempty"`
	// Waiting is the number of events queued now, WaitingBytes their body
	// bytes; PeakWaitingBytes is the most body bytes ever queued at once
	// (never above shadow_queue_bytes).
	Waiting          int   `json:"waiting"`
	WaitingBytes     int64 `json:"waiting_bytes"`
	PeakWaitingBytes int64 `json:"peak_waiting_bytes"`
}

// CacheStatus counts one agent's decision cache.
type CacheStatus struct {
	Agent     string `json:"agent"`
	Entries   int    `json:"entries"`
	Hits      uint64 `json:"hits"`
	Misses    uint64 `json:"misses"`
	Stores    uint64 `json:"stores"`
	Evictions uint64 `json:"evictions"`
	Expired   uint64 `json:"expired"`
	Flushes   uint64 `json:"flushes"`
	// Skipped counts lookups not attempted: an agent that handles more
	// than request headers, or a key over max_key_bytes.
	Skipped uint64 `json:"skipped"`
}

// FailoverStatus counts one agent's failovers.
type FailoverStatus struct {
	Agent string `json:"agent"`
	// Retried counts request-header events sent again after their
	// connection was lost; Recovered those the retry answered.
	Retried   uint64 `json:"retried"`
	Recovered uint64 `json:"recovered"`
	// Members counts exchanges opened on another member because the
	// first choice could not open one (agents with addresses).
	Members uint64 `json:"member_failovers"`
}

// BodyStatus counts one agent's request bodies over its buffer limit
// that its over_limit action let it inspect in part or streamed.
type BodyStatus struct {
	Agent  string `json:"agent"`
	Prefix uint64 `json:"prefix"`
	Stream uint64 `json:"stream"`
}

// EndpointStatus is a snapshot of one upstream endpoint.
type EndpointStatus struct {
	Upstream string
	Address  string
	// Healthy is the active health check's verdict (true without checks).
	Healthy bool
	// Ejected is true while the passive health check keeps it out.
	Ejected  bool
	InFlight int64
	// Requests counts attempts sent to the endpoint; Errors those that
	// failed on the connection; Status5xx the 5xx answers.
	Requests, Errors, Status5xx uint64
	// Ejections counts passive ejections.
	Ejections uint64
	// Checks and ChecksFailed count active health checks.
	Checks, ChecksFailed uint64
}

// UpstreamStatus is a snapshot of one upstream: its endpoints and its
// DNS re-resolution counters.
type UpstreamStatus struct {
	Name      string
	Endpoints []EndpointStatus
	// Resolutions counts DNS resolutions, ResolveErrors the failed ones
	// (the endpoints found before stay), AddressesDropped the addresses
	// beyond resolve.max_addresses.
	Resolutions, ResolveErrors, AddressesDropped uint64
}

// TracingStats counts span export.
type TracingStats struct {
	// Exported counts spans handed to the collector, Failed those whose
	// export failed, Dropped the requests whose spans did not fit the
	// queue (tracing.otlp.max_queue).
	Exported, Failed, Dropped uint64
}

// Reasons a request head is refused before any agent sees it, the
// indices of RejectReasons (Stats.Rejected is keyed by their names).
const (
	RejectTarget         = iota // bad or unsupported request-target (400)
	RejectHost                  // invalid Host (400)
	RejectFraming               // Transfer-Encoding with Content-Length (400)
	RejectParse                 // the head could not be parsed (400)
	RejectURITooLong            // request line over read_buffer_size (414)
	RejectHeaderTooLarge        // header block over read_buffer_size (431)
	RejectHeadTimeout           // head not complete within read_timeout (408)
	RejectObsFold               // a header line folded onto the previous one (400)
	// NumRejects is the number of reasons.
	NumRejects
)

// RejectReasons names the reasons of Stats.Rejected, in order.
var RejectReasons = [NumRejects]string{"target", "host", "framing", "parse", "uri_too_long", "headers_too_large", "timeout", "obs_fold"}
