package observe

import (
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
)

// RequestOutcome is how the sidecar ended one request, for access logs and
// per-outcome counters.
type RequestOutcome uint8

// Request outcomes. When several apply, the first in this list wins
// (a request whose agent failed open and that another agent then blocked
// is blocked).
const (
	// RequestAllowed: every agent allowed; the upstream answered.
	RequestAllowed RequestOutcome = iota
	// RequestBlocked: an agent's block decision answered the request (or
	// cut off a response that had started).
	RequestBlocked
	// RequestRedirected: an agent's redirect decision answered the request.
	RequestRedirected
	// RequestClientGone: the client went away before the response was
	// complete.
	RequestClientGone
	// RequestFailedClosed: an agent failed and its fail-closed policy
	// answered 503/504 (or cut off a response that had started).
	RequestFailedClosed
	// RequestUpstreamError: the upstream was unreachable, busy, timed out
	// or broke off its response.
	RequestUpstreamError
	// RequestFailedOpen: an agent failed and its fail-open policy let the
	// request pass; the upstream answered.
	RequestFailedOpen
	// RequestRejected: the sidecar answered by itself before the agents
	// decided: no route, a body over a limit, an unreadable request.
	RequestRejected

	// NumRequestOutcomes is the number of request outcomes.
	NumRequestOutcomes = int(RequestRejected) + 1
)

// String names the outcome for logs and metric labels.
func (o RequestOutcome) String() string {
	switch o {
	case RequestAllowed:
		return "allowed"
	case RequestBlocked:
		return "blocked"
	case RequestRedirected:
		return "redirected"
	case RequestClientGone:
		return "client_gone"
	case RequestFailedClosed:
		return "failed_closed"
	case RequestUpstreamError:
		return "upstream_error"
	case RequestFailedOpen:
		return "failed_open"
	case RequestRejected:
		return "rejected"
	}
	return "unknown"
}

// Agent event phases as indices: request headers, request body, response
// headers, response body.
const (
	PhaseRequestHeaders = iota
	PhaseRequestBody
	PhaseResponseHeaders
	PhaseResponseBody

	// NumPhases is the number of agent event phases.
	NumPhases
)

// PhaseNames names the phase indices (metric labels, log fields).
var PhaseNames = [NumPhases]string{"request_headers", "request_body", "response_headers", "response_body"}

// PhaseIndex maps an agent event's phase and body flag to its index.
func PhaseIndex(p protocol.Phase, body bool) int {
	i := 0
	if p == protocol.PhaseResponse {
		i = 2
	}
	if body {
		i++
	}
	return i
}

// RequestSummary describes one finished request. It is owned by the
// dataplane and valid only during the RecordRequest call: byte slices and
// the struct itself are reused by the next request.
type RequestSummary struct {
	// ID numbers the request within the process; Correlation is the id
	// sent to agents and upstream (the client's X-Request-Id when sane).
	ID          uint64
	Correlation []byte
	// Route is the route index (as in Observer), -1 when none matched.
	Route     int
	RouteName string
	// The request line and client.
	Method   []byte
	Host     []byte
	Path     []byte
	ClientIP []byte
	// Protocol is the client's protocol as it named it ("HTTP/1.1",
	// "HTTP/2.0").
	Protocol []byte
	// Status is the final status sent (0 when the client went away first).
	Status  int
	Outcome RequestOutcome
	// Agent is the index of the agent whose decision or failure ended the
	// request (blocked, redirected, failed closed), else -1.
	Agent     int
	AgentName string
	// Reason is a short explanation for outcomes other than allowed.
	Reason string
	// Start is the request's arrival; Duration runs to its end (including
	// a streamed response body).
	Start    time.Time
	Duration time.Duration
	// AgentTime is the time spent waiting on agents per phase index,
	// summed over the route's agents.
	AgentTime [NumPhases]time.Duration
	// BytesIn and BytesOut are the body bytes read from the client and
	// written to it.
	BytesIn  int64
	BytesOut int64
	// Inspected are the body bytes shown to at least one agent and Mutated
	// those an agent replaced or dropped, per protocol.Phase.
	Inspected [2]int64
	Mutated   [2]int64
	// FailedOpen counts the agents that failed open on this request.
	FailedOpen int
	// InspectionSkipped: a body passed uninspected past a buffer limit.
	InspectionSkipped bool
	// Aborted: the response was cut off after its headers were sent.
	Aborted bool
}

// RequestRecorder is implemented by an Observer that also wants one
// summary per finished request (access logs, per-outcome counters). The
// dataplane looks for it once, when the Observer is set.
type RequestRecorder interface {
	// RecordRequest is called once per request, after Request, on the
	// goroutine that ended it. It must not block or keep s.
	RecordRequest(s *RequestSummary)
}
