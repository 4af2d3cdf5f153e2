package exchange

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/dataplane/internal/clock"
	"github.com/zentinelproxy/sidecar/dataplane/internal/ratelog"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/observe"
)

// Circuit breaking (agents.circuit_breaker). A hung agent in fail-open
// mode costs every request the full message timeout; once it failed
// `failures` times in a row its circuit opens and requests get its
// failure policy without consulting it. After the cool-down, or once the
// agent has a new connection (it restarted), the next request is let
// through as a probe: an answer closes the circuit, a failure opens it
// for another cool-down. Only the opening of an
// exchange is refused, so requests already talking to the agent finish
// normally.

// ErrCircuitOpen is the failure of a request that did not consult an
// agent because its circuit is open. It wraps agentmux.ErrAgentUnavailable,
// so the failure policy treats it as an unavailable agent (closed: 503).
var ErrCircuitOpen = fmt.Errorf("%w: circuit open", agentmux.ErrAgentUnavailable)

// breaker is one agent's circuit. Its zero-cost path (closed, no
// failures) is two atomic loads per exchange opened. It is shared by the
// tables of successive reloads while the agent and its settings stay.
type breaker struct {
	threshold uint32
	cooldown  time.Duration
	cfg       config.CircuitBreaker

	fails atomic.Uint32
	// openUntil is the mono time until which the circuit refuses
	// exchanges; 0 while closed. Once it passes, the first request to
	// move it forward by a cool-down (CAS) is the probe.
	openUntil atomic.Int64
	probing   atomic.Bool

	opens, closes, rejected, probes atomic.Uint64
	logState                        ratelog.Limit

	// gen reads the agent's connection generation (nil: unknown); a new
	// connection since the circuit opened (a restarted agent) lets the
	// next request probe at once instead of after the cool-down.
	gen     func() uint64
	openGen atomic.Uint64
}

func newBreaker(c config.CircuitBreaker, inst agentmux.Agent) *breaker {
	if !c.On() {
		return nil
	}
	b := &breaker{threshold: uint32(c.Failures), cooldown: c.Cooldown, cfg: c}
	if g, ok := inst.(generationer); ok {
		b.gen = g.Generation
	}
	return b
}

// reconnected reports whether the agent got a new connection since the
// circuit opened.
func (b *breaker) reconnected() bool { return b.gen != nil && b.gen() != b.openGen.Load() }

// allow reports whether an exchange may be opened now (nil: no breaker).
// The nil and closed checks inline into the request path.
func (b *breaker) allow() bool {
	return b == nil || b.openUntil.Load() == 0 || b.allowOpen()
}

// allowOpen is allow for an open circuit: refused until the cool-down
// has passed, then one request is the probe.
func (b *breaker) allowOpen() bool {
	until := b.openUntil.Load()
	if until == 0 {
		return true
	}
	now := int64(clock.Mono())
	if (now < until && !b.reconnected()) || !b.openUntil.CompareAndSwap(until, now+int64(b.cooldown)) {
		b.rejected.Add(1)
		return false
	}
	// This request is the probe; the next one is due a cool-down from now
	// should it never report (a client that went away), or at the next
	// new connection.
	if b.gen != nil {
		b.openGen.Store(b.gen())
	}
	b.probing.Store(true)
	b.probes.Add(1)
	return true
}

// success records an answer from the agent: the failure run ends and an
// open circuit closes.
func (b *breaker) success(log *zerolog.Logger, agent string) {
	if b != nil {
		b.succeeded(log, agent)
	}
}

func (b *breaker) succeeded(log *zerolog.Logger, agent string) {
	if b.fails.Load() != 0 {
		b.fails.Store(0)
	}
	if until := b.openUntil.Load(); until != 0 && b.openUntil.CompareAndSwap(until, 0) {
		b.probing.Store(false)
		b.closes.Add(1)
		if ok, sup := b.logState.Allow(); ok {
			log.Info().Str("agent", agent).Func(ratelog.Suppressed(sup)).Msg("agent circuit closed")
		}
	}
}

// failure records a failure of the agent: at the threshold (or when the
// probe failed) the circuit opens for a cool-down.
func (b *breaker) failure(log *zerolog.Logger, agent string, err error) {
	if b == nil || errors.Is(err, ErrCircuitOpen) {
		return
	}
	n := b.fails.Add(1)
	until := b.openUntil.Load()
	if until == 0 && n < b.threshold {
		return
	}
	next := int64(clock.Mono()) + int64(b.cooldown)
	if b.gen != nil {
		// Stored before the circuit opens: a probe compares with it.
		b.openGen.Store(b.gen())
	}
	if until == 0 {
		if !b.openUntil.CompareAndSwap(0, next) {
			return // another failure opened it
		}
		b.opens.Add(1)
		if ok, sup := b.logState.Allow(); ok {
			log.Warn().Str("agent", agent).Uint32("failures", n).Dur("cooldown", b.cooldown).
				Func(ratelog.Suppressed(sup)).Err(err).Msg("agent circuit opened")
		}
		return
	}
	// Open: only the probe's failure (or another failure while the probe
	// is out) starts another cool-down; late failures of requests that
	// began before the circuit opened change nothing.
	if b.probing.Swap(false) {
		b.openUntil.Store(next)
		b.opens.Add(1)
		if ok, sup := b.logState.Allow(); ok {
			log.Warn().Str("agent", agent).Dur("cooldown", b.cooldown).Func(ratelog.Suppressed(sup)).
				Err(err).Msg("agent circuit probe failed, reopened")
		}
	}
}

func (b *breaker) state() string {
	switch {
	case b.openUntil.Load() == 0:
		return observe.CircuitClosed
	case b.probing.Load():
		return observe.CircuitHalfOpen
	}
	return observe.CircuitOpen
}

// Breakers returns the circuit of every current agent that has one.
func (c *Core) Breakers() []observe.BreakerStatus {
	t := c.tbl.Load()
	var out []observe.BreakerStatus
	for _, a := range t.agents {
		b := a.brk
		if b == nil {
			continue
		}
		out = append(out, observe.BreakerStatus{
			Agent: a.name, State: b.state(), Failures: b.fails.Load(),
			Opens: b.opens.Load(), Closes: b.closes.Load(), Rejected: b.rejected.Load(), Probes: b.probes.Load(),
		})
	}
	return out
}

// breakerFor returns the breaker of agent name for a new table: the
// previous table's when the agent instance and its settings are the same
// (a reload keeps the circuit's state), else a fresh one.
func breakerFor(prev *Table, name string, inst agentmux.Agent, c config.CircuitBreaker) *breaker {
	if old := prevAgent(prev, name, inst); old != nil && old.brk != nil && old.brk.cfg == c {
		return old.brk
	}
	return newBreaker(c, inst)
}
