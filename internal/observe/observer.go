package observe

import (
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
	// NumOutcomes is the number of outcomes.
	NumOutcomes = int(OutcomeCanceled) + 1
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

// Observers returns an Observer that passes every event to each of obs in
// order, and RecordRequest to those that implement RequestRecorder. Nil
// entries are skipped; a single Observer is returned as it is.
func Observers(obs ...Observer) Observer {
	var m multiObserver
	for _, o := range obs {
		if o == nil {
			continue
		}
		m.obs = append(m.obs, o)
		if r, ok := o.(RequestRecorder); ok {
			m.recs = append(m.recs, r)
		}
	}
	switch {
	case len(m.obs) == 0:
		return NopObserver{}
	case len(m.obs) == 1:
		return m.obs[0]
	case len(m.recs) > 0:
		return &multiRecorder{m}
	}
	return &m
}

type multiObserver struct {
	obs  []Observer
	recs []RequestRecorder
}

func (m *multiObserver) Reset(routes, agents []string) {
	for _, o := range m.obs {
		o.Reset(routes, agents)
	}
}

func (m *multiObserver) Request(route, status int, d time.Duration) {
	for _, o := range m.obs {
		o.Request(route, status, d)
	}
}

func (m *multiObserver) AgentEvent(route, agent int, phase protocol.Phase, body bool, oc Outcome, d time.Duration) {
	for _, o := range m.obs {
		o.AgentEvent(route, agent, phase, body, oc, d)
	}
}

func (m *multiObserver) FailOpen(route, agent int) {
	for _, o := range m.obs {
		o.FailOpen(route, agent)
	}
}

func (m *multiObserver) MutationRefused(route, agent int) {
	for _, o := range m.obs {
		o.MutationRefused(route, agent)
	}
}

func (m *multiObserver) InspectionSkipped(route, agent int, phase protocol.Phase) {
	for _, o := range m.obs {
		o.InspectionSkipped(route, agent, phase)
	}
}

func (m *multiObserver) Upstream(route int, timeout bool) {
	for _, o := range m.obs {
		o.Upstream(route, timeout)
	}
}

// multiRecorder is a multiObserver with at least one RequestRecorder, so
// that the Server builds summaries only when someone reads them.
type multiRecorder struct{ multiObserver }

func (m *multiRecorder) RecordRequest(s *RequestSummary) {
	for _, r := range m.recs {
		r.RecordRequest(s)
	}
}
