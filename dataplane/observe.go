package dataplane

import (
	"github.com/zentinelproxy/sidecar/internal/observe"
	"github.com/zentinelproxy/sidecar/protocol"
)

// The observer vocabulary and the status snapshots are defined in
// internal/observe, which the metrics and the access log import without
// the proxy; they are re-exported here under their names.

// Observer receives the dataplane's events, for metrics (observe.Observer).
type Observer = observe.Observer

// RequestRecorder is an Observer that also wants one summary per finished
// request (observe.RequestRecorder).
type RequestRecorder = observe.RequestRecorder

// NopObserver ignores everything.
type NopObserver = observe.NopObserver

// Outcome is how one event sent to an agent ended.
type Outcome = observe.Outcome

// RequestOutcome is how the sidecar ended one request.
type RequestOutcome = observe.RequestOutcome

// RequestSummary describes one finished request; valid only during the
// RecordRequest call.
type RequestSummary = observe.RequestSummary

// Status snapshots (observe).
type (
	// Stats are the dataplane's own counters since New.
	Stats = observe.Stats
	// ConnStats count one listener's client connections.
	ConnStats = observe.ConnStats
	// TLSStats are the TLS counters of the listeners.
	TLSStats = observe.TLSStats
	// TunnelStats count the Upgrade tunnels.
	TunnelStats = observe.TunnelStats
	// PolicyStatus is the state of the policy features.
	PolicyStatus = observe.PolicyStatus
	// BreakerStatus is a point-in-time view of one agent's circuit.
	BreakerStatus = observe.BreakerStatus
	// ShadowStatus counts what one shadow agent saw and would have done.
	ShadowStatus = observe.ShadowStatus
	// CacheStatus counts one agent's decision cache.
	CacheStatus = observe.CacheStatus
	// FailoverStatus counts one agent's failovers.
	FailoverStatus = observe.FailoverStatus
	// BodyStatus counts one agent's over-limit bodies.
	BodyStatus = observe.BodyStatus
	// UpstreamStatus is a snapshot of one upstream.
	UpstreamStatus = observe.UpstreamStatus
	// EndpointStatus is a snapshot of one upstream endpoint.
	EndpointStatus = observe.EndpointStatus
	// TracingStats counts span export.
	TracingStats = observe.TracingStats
)

// Outcomes of an agent event (observe).
const (
	OutcomeAllow       = observe.OutcomeAllow
	OutcomeBlock       = observe.OutcomeBlock
	OutcomeRedirect    = observe.OutcomeRedirect
	OutcomeContinue    = observe.OutcomeContinue
	OutcomeTimeout     = observe.OutcomeTimeout
	OutcomeUnavailable = observe.OutcomeUnavailable
	OutcomeOverloaded  = observe.OutcomeOverloaded
	OutcomeConnLost    = observe.OutcomeConnLost
	OutcomeInvalid     = observe.OutcomeInvalid
	OutcomeCanceled    = observe.OutcomeCanceled
	numOutcomes        = observe.NumOutcomes
)

// Request outcomes (observe).
const (
	RequestAllowed       = observe.RequestAllowed
	RequestBlocked       = observe.RequestBlocked
	RequestRedirected    = observe.RequestRedirected
	RequestClientGone    = observe.RequestClientGone
	RequestFailedClosed  = observe.RequestFailedClosed
	RequestUpstreamError = observe.RequestUpstreamError
	RequestFailedOpen    = observe.RequestFailedOpen
	RequestRejected      = observe.RequestRejected
	NumRequestOutcomes   = observe.NumRequestOutcomes
)

// Agent event phases as indices (observe).
const (
	PhaseRequestHeaders  = observe.PhaseRequestHeaders
	PhaseRequestBody     = observe.PhaseRequestBody
	PhaseResponseHeaders = observe.PhaseResponseHeaders
	PhaseResponseBody    = observe.PhaseResponseBody
	NumPhases            = observe.NumPhases
)

// Circuit states as reported by BreakerStatus (observe).
const (
	CircuitClosed   = observe.CircuitClosed
	CircuitOpen     = observe.CircuitOpen
	CircuitHalfOpen = observe.CircuitHalfOpen
)

// PhaseNames names the phase indices (metric labels, log fields).
var PhaseNames = observe.PhaseNames

// RejectReasons names the reasons of Stats.Rejected, in order.
var RejectReasons = observe.RejectReasons

// PhaseIndex maps an agent event's phase and body flag to its index.
func PhaseIndex(p protocol.Phase, body bool) int { return observe.PhaseIndex(p, body) }

// Observers returns an Observer that passes every event to each of obs in
// order (observe.Observers).
func Observers(obs ...Observer) Observer { return observe.Observers(obs...) }
