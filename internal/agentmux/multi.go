package agentmux

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
)

// Multi is one configured agent served by several members, each an Agent
// of its own (a separate agent process behind its own socket or target).
// New exchanges go to the live members in turn; an exchange a member
// cannot open (no live connection, overloaded) is opened, once, on the
// next live member instead, and counted.
type Multi struct {
	name      string
	transport string
	members   []Agent
	failover  bool
	next      atomic.Uint32
	failovers atomic.Uint64
}

// NewMulti returns the agent name served by members (at least one). With
// failover, an exchange a member cannot open is opened on the next live
// member instead.
func NewMulti(name, transport string, members []Agent, failover bool) *Multi {
	return &Multi{name: name, transport: transport, members: members, failover: failover}
}

// Name implements Agent.
func (m *Multi) Name() string { return m.name }

// Members returns the member agents (do not modify the slice).
func (m *Multi) Members() []Agent { return m.members }

// Failovers counts exchanges opened on another member after the first
// choice failed.
func (m *Multi) Failovers() uint64 { return m.failovers.Load() }

// live reports whether member a has a connection to open exchanges on.
func live(a Agent) bool {
	if p, ok := a.(interface{ Len() int }); ok {
		return p.Len() > 0
	}
	return a.Capabilities() != (protocol.Capabilities{})
}

// Begin implements Agent: the next live member in turn, and on a failure
// to open there the live member after it.
func (m *Multi) Begin(w Wait) (*Exchange, error) {
	n := len(m.members)
	start := int(m.next.Add(1)-1) % n
	var firstErr error
	tried := 0
	for k := 0; k < n && tried < 2; k++ {
		a := m.members[(start+k)%n]
		if !live(a) {
			continue
		}
		ex, err := a.Begin(w)
		if err == nil {
			if tried > 0 {
				m.failovers.Add(1)
			}
			return ex, nil
		}
		if !m.failover || !Retryable(err) {
			return nil, err
		}
		if firstErr == nil {
			firstErr = err
		}
		tried++
	}
	if firstErr != nil {
		return nil, firstErr
	}
	// No member is live: the first one says why.
	return m.members[start].Begin(w)
}

// Retryable reports whether err is a failure to reach the agent that
// another member or connection may not have: no live connection, an
// overloaded one, or one lost mid-event.
func Retryable(err error) bool {
	return errors.Is(err, ErrAgentUnavailable) || errors.Is(err, ErrAgentOverloaded) || errors.Is(err, ErrAgentConnLost)
}

// WaitReady blocks until a member is live or ctx ends.
func (m *Multi) WaitReady(ctx context.Context) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		for _, a := range m.members {
			if live(a) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s: not ready: %v", ErrAgentUnavailable, m.name, m.Snapshot().LastError)
		case <-t.C:
		}
	}
}

// Capabilities implements Agent: those of the first live member.
func (m *Multi) Capabilities() protocol.Capabilities {
	for _, a := range m.members {
		if c := a.Capabilities(); c != (protocol.Capabilities{}) {
			return c
		}
	}
	return protocol.Capabilities{}
}

// Generation sums the members' connection generations (see
// Pool.Generation): it changes whenever any member gets a new connection.
func (m *Multi) Generation() uint64 {
	var g uint64
	for _, a := range m.members {
		if x, ok := a.(interface{ Generation() uint64 }); ok {
			g += x.Generation()
		}
	}
	return g
}

// Snapshot implements Agent: the members' connections and counters added
// up; LastError is the first member's that has one.
func (m *Multi) Snapshot() AgentStatus {
	st := AgentStatus{Name: m.name, Transport: m.transport}
	for _, a := range m.members {
		x := a.Snapshot()
		st.add(&x)
		if x.Ready {
			st.Caps = x.Caps
		}
		if st.LastError == "" && x.LastError != "" {
			st.LastError = x.LastError
		}
	}
	st.Ready = st.Connections > 0
	return st
}

// Close implements Agent: every member is closed.
func (m *Multi) Close() error {
	var errs []error
	for _, a := range m.members {
		if err := a.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("agent %s: %w", m.name, errors.Join(errs...))
	}
	return nil
}
