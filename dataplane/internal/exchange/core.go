package exchange

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/dataplane/internal/ratelog"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/observe"
)

// Core is what every exchange of one server shares: the routing table,
// the observer, the counters, the disconnect watcher and span export.
type Core struct {
	log   zerolog.Logger
	obs   observe.Observer
	rec   observe.RequestRecorder // obs, when it also wants request summaries
	tbl   atomic.Pointer[Table]
	stats counters
	watch *watcher
	spans *spanExporter // trace span export (otlp.go); nil when off
	// logRLS rate-limits the log lines of rate limit service failures.
	logRLS ratelog.Limit
}

// NewCore makes a core that reports to obs (nil: nobody) and logs to
// log. It starts nothing; Publish gives it its first table, Start its
// goroutines.
func NewCore(obs observe.Observer, log zerolog.Logger) *Core {
	c := &Core{log: log, obs: obs}
	if c.obs == nil {
		c.obs = observe.NopObserver{}
	}
	c.rec, _ = c.obs.(observe.RequestRecorder)
	return c
}

// Start starts span export (tracing) and, with a check interval, the
// disconnect watcher.
func (c *Core) Start(tracing config.Tracing, disconnectCheck time.Duration) error {
	var err error
	if c.spans, err = newSpanExporter(tracing, c.log); err != nil {
		return err
	}
	if disconnectCheck > 0 {
		c.watch = newWatcher(disconnectCheck, func(ex *Exchange) { ex.cancel() })
	}
	return nil
}

// Publish makes t the table of new requests and returns the one it
// replaces (nil at first). The observer learns t's names first.
func (c *Core) Publish(t *Table) *Table {
	c.obs.Reset(t.routeIDs.names, t.agentIDs.names)
	return c.tbl.Swap(t)
}

// Table is the current routing table.
func (c *Core) Table() *Table { return c.tbl.Load() }

// Stop ends the watcher and exports the spans still queued, within ctx.
func (c *Core) Stop(ctx context.Context) error {
	if c.watch != nil {
		c.watch.close()
	}
	if t := c.tbl.Load(); t != nil {
		t.rls.close()
	}
	if c.spans != nil {
		return c.spans.shutdown(ctx)
	}
	return nil
}

// StopShadows stops the shadow agents' workers and waits for them to
// leave (or ctx to end).
func (c *Core) StopShadows(ctx context.Context) {
	t := c.tbl.Load()
	for _, e := range t.agents {
		if e.shadow != nil {
			e.shadow.stop()
		}
	}
	for _, e := range t.agents {
		if e.shadow != nil {
			e.shadow.waitStopped(ctx)
		}
	}
}

// Begin starts ex, the exchange of a request of its front end that
// arrived at start, on the current table.
func (c *Core) Begin(ex *Exchange, start time.Time) {
	t := c.acquireTable()
	c.stats.requests.Add(1)
	c.stats.inflight.Add(1)
	ex.core, ex.tbl = c, t
	ex.conn = ex.front.Conn()
	ex.lst = ex.conn.Listener
	ex.id = reqIDs.Add(1)
	ex.start = start
	if ex.start.IsZero() {
		ex.start = time.Now()
	}
	ex.resetCancel()
	ex.gone = false
	if c.watch != nil {
		c.watch.add(ex)
	}
}

// acquireTable pins the current table for one request; the re-check
// makes sure a concurrent swap cannot retire it unnoticed.
func (c *Core) acquireTable() *Table {
	for {
		t := c.tbl.Load()
		t.acquire()
		if c.tbl.Load() == t {
			return t
		}
		t.release()
	}
}

// Reject counts a request head refused for reason (observe.RejectReasons)
// before it became an exchange (a parse error of the front end).
func (c *Core) Reject(reason int) { c.stats.rejected[reason].Add(1) }

// Routes returns the route names of the current table, in configuration
// order.
func (c *Core) Routes() []string { return c.tbl.Load().routeNames() }

// Agents returns the agent names of the current table, in configuration
// order.
func (c *Core) Agents() []string { return c.tbl.Load().agentNames() }

// AgentStatus returns a snapshot of every current agent.
func (c *Core) AgentStatus() []agentmux.AgentStatus {
	t := c.tbl.Load()
	out := make([]agentmux.AgentStatus, 0, len(t.agents))
	for _, a := range t.agents {
		out = append(out, a.agent.Snapshot())
	}
	return out
}

// counters are the exchanges' counters (Stats).
type counters struct {
	requests, blocked, failOpen, failClosed, refused, skipped atomic.Uint64
	upErrors, upTimeouts, clientGone, aborted                 atomic.Uint64
	joined                                                    [2]atomic.Uint64 // per phase
	bodyTooSlow                                               atomic.Uint64
	traceInvalid, tracestateInvalid, traceGenerated           atomic.Uint64
	limits, inlined                                           atomic.Uint64
	rateLimited, retries, retryBudget                         atomic.Uint64
	globalLimited, globalErrors                               atomic.Uint64
	rejected                                                  [observe.NumRejects]atomic.Uint64
	trailers                                                  [2][numTrailerOutcomes]atomic.Uint64 // per phase
	inflight                                                  atomic.Int64
}

// Stats fills the exchanges' part of st.
func (c *Core) Stats(st *observe.Stats) {
	s := &c.stats
	st.Requests = s.requests.Load()
	st.Blocked = s.blocked.Load()
	st.FailOpen = s.failOpen.Load()
	st.FailClosed = s.failClosed.Load()
	st.MutationsRefused = s.refused.Load()
	st.InspectionSkipped = s.skipped.Load()
	st.UpstreamErrors = s.upErrors.Load()
	st.UpstreamTimeouts = s.upTimeouts.Load()
	st.ClientGone = s.clientGone.Load()
	st.ResponseAborted = s.aborted.Load()
	st.InFlight = s.inflight.Load()
	st.RequestBodyReadsJoined = s.joined[0].Load()
	st.ResponseBodyReadsJoined = s.joined[1].Load()
	st.RequestBodyTooSlow = s.bodyTooSlow.Load()
	st.TraceInvalid = s.traceInvalid.Load()
	st.TracestateInvalid = s.tracestateInvalid.Load()
	st.TraceGenerated = s.traceGenerated.Load()
	st.LimitsExceeded = s.limits.Load()
	st.InlineBodies = s.inlined.Load()
	st.RateLimited = s.rateLimited.Load()
	if t := c.tbl.Load(); t != nil {
		st.RateLimitedBy = t.rateLimitedBy()
		st.RateLimitKeysEvictedBy = t.keysEvictedBy()
		st.RouteRetriesBy = t.retriesBy()
	}
	st.RouteRetries = s.retries.Load()
	st.RetryBudgetExhausted = s.retryBudget.Load()
	st.GlobalRateLimited = s.globalLimited.Load()
	st.GlobalRateLimitErrors = s.globalErrors.Load()
	st.Trailers = observe.TrailerStats{
		RequestForwarded:  s.trailers[0][trailerForwarded].Load(),
		RequestDropped:    s.trailers[0][trailerDropped].Load(),
		RequestRefused:    s.trailers[0][trailerRefused].Load(),
		ResponseForwarded: s.trailers[1][trailerForwarded].Load(),
		ResponseDropped:   s.trailers[1][trailerDropped].Load(),
		ResponseRefused:   s.trailers[1][trailerRefused].Load(),
	}
	st.Rejected = make(map[string]uint64, observe.NumRejects)
	for i := range s.rejected {
		st.Rejected[observe.RejectReasons[i]] = s.rejected[i].Load()
	}
}
