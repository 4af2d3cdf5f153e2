package exchange

import (
	"sync/atomic"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/observe"
)

// Failover (agents[].failover, default on). A request-header event whose
// agent connection was lost, or that found none, is sent once more on
// another connection or member of the agent (agentmux.Multi opens the
// exchange on a live one) within the same deadline, before the failure
// policy applies. Only the request-header event is retried: a later event
// belongs to an exchange whose agent has seen the request, and one that
// carried a body (inline_body) is not sent twice.

// agentStats counts one agent's failovers and over-limit bodies; it is
// carried over reloads with the agent instance, so the counters stay
// monotonic.
type agentStats struct {
	retried, recovered atomic.Uint64
	// Request bodies over the buffer limit inspected in part (prefix) or
	// streamed to the agent (stream).
	prefix, stream atomic.Uint64
}

// failoverFor returns the counters of agent name for a new table.
func failoverFor(prev *Table, name string, inst agentmux.Agent) *agentStats {
	if old := prevAgent(prev, name, inst); old != nil && old.fo != nil {
		return old.fo
	}
	return &agentStats{}
}

// failoverHeaders retries agent i's request-header event after err, once,
// within w. It returns the retry's outcome, or err when no retry applies.
func (ex *Exchange) failoverHeaders(i int, w agentmux.Wait, err error) (*agentmux.Reply, error) {
	sl := &ex.slots[i]
	a := sl.ra.a
	if !a.failover || ex.rh.HasInlineBody || !agentmux.Retryable(err) || ex.canceled() {
		return nil, err
	}
	// The failed exchange is over: its connection is gone.
	sl.ex.Finish()
	sl.ex = nil
	a.fo.retried.Add(1)
	// w's clock reading is the failed call's, up to a message timeout
	// old: the retry reads its own, so that its message timeout starts
	// now (its budget deadline stays what it was).
	w.Now = time.Time{}
	ae, err := a.agent.Begin(w)
	if err != nil {
		return nil, err
	}
	sl.ex = ae
	sl.caps = ae.Capabilities()
	// Another connection may have negotiated the other view.
	ex.requestView(sl.caps.SupportsClientRequest)
	reply, err := ae.RequestHeaders(w, &ex.rh)
	if err == nil {
		a.fo.recovered.Add(1)
	}
	return reply, err
}

// Failovers returns the failover counters of every current agent that
// has retried or has several members.
func (c *Core) Failovers() []observe.FailoverStatus {
	t := c.tbl.Load()
	var out []observe.FailoverStatus
	for _, a := range t.agents {
		st := observe.FailoverStatus{Agent: a.name, Retried: a.fo.retried.Load(), Recovered: a.fo.recovered.Load()}
		m, multi := a.agent.(*agentmux.Multi)
		if multi {
			st.Members = m.Failovers()
		}
		if multi || st.Retried > 0 {
			out = append(out, st)
		}
	}
	return out
}
