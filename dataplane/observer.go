package dataplane

import (
	"sync/atomic"
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
)

// Outcome is how one event sent to an agent ended.
type Outcome uint8

// Outcomes of an agent event.
const (
	// OutcomeAllow: a final allow.
	OutcomeAllow Outcome = iota
	// OutcomeBlock: a block decision.
	OutcomeBlock
	// OutcomeRedirect: a redirect decision.
	OutcomeRedirect
	// OutcomeContinue: needs_more, or a BodyMutation for a chunk.
	OutcomeContinue
	// OutcomeTimeout: no reply within the message or request timeout.
	OutcomeTimeout
	// OutcomeUnavailable: no live connection to the agent.
	OutcomeUnavailable
	// OutcomeOverloaded: the agent's in-flight limit and queue were full.
	OutcomeOverloaded
	// OutcomeConnLost: the connection died during the event.
	OutcomeConnLost
	// OutcomeInvalid: a reply that breaks the protocol or the security
	// rules (bad status, bad redirect URL, unknown decision).
	OutcomeInvalid
	// OutcomeCanceled: the client went away.
	OutcomeCanceled
	numOutcomes
)

// String names the outcome for logs and metric labels.
func (o Outcome) String() string {
	switch o {
	case OutcomeAllow:
		return "allow"
	case OutcomeBlock:
		return "block"
	case OutcomeRedirect:
		return "redirect"
	case OutcomeContinue:
		return "continue"
	case OutcomeTimeout:
		return "timeout"
	case OutcomeUnavailable:
		return "unavailable"
	case OutcomeOverloaded:
		return "overloaded"
	case OutcomeConnLost:
		return "conn_lost"
	case OutcomeInvalid:
		return "invalid"
	case OutcomeCanceled:
		return "canceled"
	}
	return "unknown"
}

// Failed reports whether the outcome is an agent failure that the
// failure policy decides on.
func (o Outcome) Failed() bool { return o >= OutcomeTimeout && o != OutcomeCanceled }

// Observer receives the dataplane's events, for metrics. Route and agent
// are indices into the names given to Reset, so an implementation can
// keep pre-resolved counters in slices and count without allocating or
// hashing. Methods are called on the request's goroutine and must not
// block. Route is -1 for a request that matched no route.
type Observer interface {
	// Reset is called before a routing table takes effect (at New and at
	// every Swap) with the names its indices refer to. An index keeps its
	// name across swaps (names of earlier configurations stay in the
	// lists), so events of requests still running on a replaced table
	// count where they belong. The slices must not be modified.
	Reset(routes, agents []string)
	// Request is called once per request with the final status sent
	// (0 when the client went away first) and the time from the request's
	// arrival to the end of its response (including a streamed body).
	Request(route, status int, d time.Duration)
	// AgentEvent is called for every event sent to an agent (or that
	// could not be sent) with its outcome and wait time.
	AgentEvent(route, agent int, phase protocol.Phase, body bool, o Outcome, d time.Duration)
	// FailOpen is called when an agent's failure let a request pass.
	FailOpen(route, agent int)
	// MutationRefused is called for each header operation or block header
	// refused by the security rules.
	MutationRefused(route, agent int)
	// InspectionSkipped is called when a body exceeded an agent's buffer
	// limit and passed uninspected.
	InspectionSkipped(route, agent int, phase protocol.Phase)
	// Upstream is called for each upstream failure; timeout says 504.
	Upstream(route int, timeout bool)
}

// NopObserver ignores everything.
type NopObserver struct{}

// Reset implements Observer.
func (NopObserver) Reset([]string, []string) {}

// Request implements Observer.
func (NopObserver) Request(int, int, time.Duration) {}

// AgentEvent implements Observer.
func (NopObserver) AgentEvent(int, int, protocol.Phase, bool, Outcome, time.Duration) {}

// FailOpen implements Observer.
func (NopObserver) FailOpen(int, int) {}

// MutationRefused implements Observer.
func (NopObserver) MutationRefused(int, int) {}

// InspectionSkipped implements Observer.
func (NopObserver) InspectionSkipped(int, int, protocol.Phase) {}

// Upstream implements Observer.
func (NopObserver) Upstream(int, bool) {}

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
	// already received (coalesce.go).
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
	// TLS counts the listeners' handshakes and certificate reloads.
	TLS TLSStats `json:"tls"`
	// Tunnels counts the Upgrade (WebSocket) tunnels and their bytes.
	Tunnels TunnelStats `json:"tunnels"`
	// Connections counts each listener's client connections (conn.go),
	// in configuration order.
	Connections []ConnStats `json:"connections"`
	// Rejected counts request heads answered 400/408/414/431 by reason
	// (RejectReasons).
	Rejected map[string]uint64 `json:"rejected"`
}

type counters struct {
	requests, blocked, failOpen, failClosed, refused, skipped   atomic.Uint64
	upErrors, upTimeouts, clientGone, aborted                   atomic.Uint64
	acceptErrors, connClamped, absoluteForm, upStale, upRetries atomic.Uint64
	upEndpointRetries                                           atomic.Uint64
	upUnsolicited, upClosed                                     atomic.Uint64
	joined                                                      [2]atomic.Uint64 // per phase
	bodyTooSlow                                                 atomic.Uint64
	traceInvalid, tracestateInvalid, traceGenerated             atomic.Uint64
	limits, inlined                                             atomic.Uint64
	tls                                                         tlsCounters
	tun                                                         tunnelCounters
	rejected                                                    [numRejects]atomic.Uint64
	inflight                                                    atomic.Int64
}

func (c *counters) snapshot() Stats {
	st := Stats{
		Requests:                     c.requests.Load(),
		Blocked:                      c.blocked.Load(),
		FailOpen:                     c.failOpen.Load(),
		FailClosed:                   c.failClosed.Load(),
		MutationsRefused:             c.refused.Load(),
		InspectionSkipped:            c.skipped.Load(),
		UpstreamErrors:               c.upErrors.Load(),
		UpstreamTimeouts:             c.upTimeouts.Load(),
		ClientGone:                   c.clientGone.Load(),
		ResponseAborted:              c.aborted.Load(),
		InFlight:                     c.inflight.Load(),
		AcceptErrors:                 c.acceptErrors.Load(),
		ListenersClamped:             c.connClamped.Load(),
		AbsoluteForm:                 c.absoluteForm.Load(),
		UpstreamStale:                c.upStale.Load(),
		UpstreamRetries:              c.upRetries.Load(),
		UpstreamDiscardedUnsolicited: c.upUnsolicited.Load(),
		UpstreamDiscardedClosed:      c.upClosed.Load(),
		RequestBodyReadsJoined:       c.joined[0].Load(),
		ResponseBodyReadsJoined:      c.joined[1].Load(),
		RequestBodyTooSlow:           c.bodyTooSlow.Load(),
		EndpointRetries:              c.upEndpointRetries.Load(),
		TraceInvalid:                 c.traceInvalid.Load(),
		TracestateInvalid:            c.tracestateInvalid.Load(),
		TraceGenerated:               c.traceGenerated.Load(),
		LimitsExceeded:               c.limits.Load(),
		InlineBodies:                 c.inlined.Load(),
		TLS:                          c.tls.snapshot(),
		Tunnels:                      c.tun.snapshot(),
		Rejected:                     make(map[string]uint64, numRejects),
	}
	for i := range c.rejected {
		st.Rejected[RejectReasons[i]] = c.rejected[i].Load()
	}
	return st
}
