package agentmux

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
)

// Agent is one configured agent as the dataplane sees it, whatever the
// transport: it hands out exchanges over its live connections.
type Agent interface {
	// Name is the agent's configured name.
	Name() string
	// Begin opens an exchange on the least loaded live connection, waiting
	// for an in-flight slot at most as w allows. It fails with
	// ErrAgentUnavailable when there is none.
	Begin(w Wait) (*Exchange, error)
	// Capabilities are the declared capabilities of a live connection (the
	// zero value while none is live).
	Capabilities() protocol.Capabilities
	// Reporter describes the agent to /status and to the metrics.
	Reporter
	// Close drains: CancelAll to every connection, then closes them.
	Close() error
}

// Reporter is how an agent instance of any transport describes itself:
// /status shows its AgentStatus as JSON and internal/metrics turns it
// into Prometheus series at scrape time, neither of them reaching into
// a transport. Snapshot is called by the status page, readiness checks
// and scrapes, never on the request path; it must not block on the
// network.
//
// Pool implements it (the uds and grpc clients are pools); the ext_proc
// client adds its transport's events and a reverse agent's pool its
// listener; Multi adds up its members'.
type Reporter interface {
	// Snapshot describes the agent now.
	Snapshot() AgentStatus
}

// AgentStatus is a point-in-time view of an agent.
type AgentStatus struct {
	Name        string `json:"name"`
	Transport   string `json:"transport"`
	Connections int    `json:"connections"`
	Ready       bool   `json:"ready"`
	InFlight    int64  `json:"in_flight"`
	Late        uint64 `json:"late_replies"`
	Timeouts    uint64 `json:"timeouts"`
	Protocol    uint64 `json:"protocol_errors"`
	Completed   uint64 `json:"completed"`
	// SendWaits and ControlDropped: see Stats.
	SendWaits      uint64 `json:"send_waits"`
	ControlDropped uint64 `json:"control_dropped"`
	// Writes and FramesWritten: see Stats.
	Writes        uint64                `json:"writes"`
	FramesWritten uint64                `json:"frames_written"`
	Caps          protocol.Capabilities `json:"capabilities"`
	LastError     string                `json:"last_error,omitempty"`
	// Events are the transport's own counters by name (ext_proc: streams
	// opened, immediate responses, …, exported as
	// sidecar_extproc_events_total); nil for transports without any.
	Events map[string]uint64 `json:"events,omitempty"`
	// Listener is the listener the agent's connections arrive on, for a
	// transport whose agents dial the sidecar (reverse); nil for the
	// others. Agents that share a listener report the same one.
	Listener *ListenerStatus `json:"listener,omitempty"`
}

// ListenerStatus describes a listener agents dial into: its
// registrations, by how they ended, and its connections.
type ListenerStatus struct {
	// Address names the listener: "unix:/path" or the bound host:port.
	Address string `json:"address"`
	// Accepted counts accepted registrations; Rejected those refused or
	// failed, by reason (a fixed set of label values).
	Accepted uint64            `json:"accepted"`
	Rejected map[string]uint64 `json:"rejected"`
	// Delayed counts refusals answered late, Unheld refusals closed at
	// once because too many refused connections were held open.
	Delayed uint64 `json:"delayed"`
	Unheld  uint64 `json:"unheld"`
	// Pending, Refusing and Active are the connections registering,
	// refused (their answer held back or being drained) and registered.
	Pending  int64 `json:"pending"`
	Refusing int64 `json:"refusing"`
	Active   int64 `json:"active"`
}

// add adds x's connections, in-flight requests and cumulative counters
// to st (a Multi's total over its members).
func (st *AgentStatus) add(x *AgentStatus) {
	st.Connections += x.Connections
	st.InFlight += x.InFlight
	st.Late += x.Late
	st.Timeouts += x.Timeouts
	st.Protocol += x.Protocol
	st.Completed += x.Completed
	st.SendWaits += x.SendWaits
	st.ControlDropped += x.ControlDropped
	st.Writes += x.Writes
	st.FramesWritten += x.FramesWritten
	for name, n := range x.Events {
		if st.Events == nil {
			st.Events = make(map[string]uint64, len(x.Events))
		}
		st.Events[name] += n
	}
}

// Pool is a set of live sessions to one agent; new exchanges go to the
// session with the fewest in flight that still has a free slot. It
// implements Agent and is what every transport's client builds on.
type Pool struct {
	name      string
	transport string

	mu       sync.Mutex
	sessions atomic.Pointer[[]*Session] // copy-on-write: Begin reads without locking
	lastErr  atomic.Pointer[string]
	// gen counts the sessions ever added (Generation).
	gen atomic.Uint64
	// retired carries the counters of sessions that left the pool so that
	// Snapshot totals never go backwards.
	retired Stats
}

// NewPool returns an empty pool.
func NewPool(name, transport string) *Pool {
	p := &Pool{name: name, transport: transport}
	empty := []*Session{}
	p.sessions.Store(&empty)
	return p
}

// Name implements Agent.
func (p *Pool) Name() string { return p.name }

// Add puts a live session into the pool.
func (p *Pool) Add(s *Session) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := *p.sessions.Load()
	next := make([]*Session, 0, len(old)+1)
	next = append(next, old...)
	next = append(next, s)
	p.sessions.Store(&next)
	p.gen.Add(1)
}

// Generation counts the sessions ever added to the pool: it changes
// whenever the agent gets a new connection (a reconnect, a restart), which
// is when what the proxy remembers of its answers may be stale.
func (p *Pool) Generation() uint64 { return p.gen.Load() }

// Remove takes a session out of the pool (it stays usable by the
// exchanges already open on it).
func (p *Pool) Remove(s *Session) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := *p.sessions.Load()
	next := make([]*Session, 0, len(old))
	for _, x := range old {
		if x != s {
			next = append(next, x)
		}
	}
	if len(next) != len(old) {
		p.retired.addCounters(s.Stats())
	}
	p.sessions.Store(&next)
}

// addCounters adds x's cumulative counters (not the InFlight and Waiting
// gauges) to s.
func (s *Stats) addCounters(x Stats) {
	s.Late += x.Late
	s.Timeouts += x.Timeouts
	s.Cancels += x.Cancels
	s.Protocol += x.Protocol
	s.Completed += x.Completed
	s.SendWaits += x.SendWaits
	s.ControlDropped += x.ControlDropped
	s.Writes += x.Writes
	s.FramesWritten += x.FramesWritten
}

// Sessions returns the live sessions (do not modify the slice).
func (p *Pool) Sessions() []*Session { return *p.sessions.Load() }

// Len is the number of live sessions.
func (p *Pool) Len() int { return len(*p.sessions.Load()) }

// SetLastError records why the last connection attempt failed (for status).
func (p *Pool) SetLastError(err error) {
	if err == nil {
		p.lastErr.Store(nil)
		return
	}
	s := err.Error()
	p.lastErr.Store(&s)
}

// Begin implements Agent.
func (p *Pool) Begin(w Wait) (*Exchange, error) {
	ss := *p.sessions.Load()
	var best *Session
	var bestLoad int64 = -1
	for _, s := range ss {
		select {
		case <-s.done:
			continue
		default:
		}
		n := s.inflight.Load()
		if n >= int64(cap(s.sem)) && best != nil {
			continue
		}
		// Prefer free capacity, then the fewest in flight.
		if best == nil || n < bestLoad || (bestLoad >= int64(cap(best.sem)) && n < int64(cap(s.sem))) {
			best, bestLoad = s, n
		}
	}
	if best == nil {
		msg := "no live connection"
		if le := p.lastErr.Load(); le != nil {
			msg += " (last error: " + *le + ")"
		}
		return nil, fmt.Errorf("%w: %s: %s", ErrAgentUnavailable, p.name, msg)
	}
	return best.Begin(w)
}

// WaitReady blocks until at least one session is live or ctx ends.
func (p *Pool) WaitReady(ctx context.Context) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for p.Len() == 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s: not ready: %v", ErrAgentUnavailable, p.name, p.Snapshot().LastError)
		case <-t.C:
		}
	}
	return nil
}

// Capabilities implements Agent.
func (p *Pool) Capabilities() protocol.Capabilities {
	for _, s := range *p.sessions.Load() {
		return s.caps
	}
	return protocol.Capabilities{}
}

// Snapshot implements Agent.
func (p *Pool) Snapshot() AgentStatus {
	p.mu.Lock()
	tot := p.retired
	p.mu.Unlock()
	st := AgentStatus{Name: p.name, Transport: p.transport}
	for _, s := range *p.sessions.Load() {
		x := s.Stats()
		st.Connections++
		st.InFlight += x.InFlight
		tot.addCounters(x)
		st.Caps = s.caps
	}
	st.Late, st.Timeouts, st.Protocol, st.Completed = tot.Late, tot.Timeouts, tot.Protocol, tot.Completed
	st.SendWaits, st.ControlDropped = tot.SendWaits, tot.ControlDropped
	st.Writes, st.FramesWritten = tot.Writes, tot.FramesWritten
	st.Ready = st.Connections > 0
	if le := p.lastErr.Load(); le != nil {
		st.LastError = *le
	}
	return st
}

// CancelAll sends CancelAll to every live session.
func (p *Pool) CancelAll(reason string) {
	for _, s := range *p.sessions.Load() {
		_ = s.SendCancelAll(reason)
	}
}

// Close implements Agent: CancelAll, then close every session.
func (p *Pool) Close() error {
	p.CancelAll("shutdown")
	p.mu.Lock()
	ss := *p.sessions.Load()
	empty := []*Session{}
	p.sessions.Store(&empty)
	p.mu.Unlock()
	for _, s := range ss {
		_ = s.Close()
	}
	return nil
}
