package dataplane

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/protocol"
)

// Shadow agents (agents[].shadow). A shadow agent gets the RequestHeaders
// of every request of its routes, as the client sent them (before the
// enforcing agents changed anything), but no request waits for it: the
// request path copies the event into a bounded queue and goes on, and a
// few workers per agent send the events and count what the agent would
// have done. A full queue drops the event (counted), so a slow or dead
// shadow agent never delays traffic. Its decisions are never applied.

// shadowIdle is how long an idle worker waits for an event before it
// exits: workers exist only while there is traffic, so a runner that a
// reload dropped leaves no goroutine behind.
const shadowIdle = time.Second

// maxShadowRules bounds the rule ids counted per shadow agent; further
// ones count under shadowOtherRule.
const maxShadowRules = 64

const shadowOtherRule = "(other)"

// shadowEvent is one queued RequestHeaders with its own copy of the bytes.
type shadowEvent struct {
	rh    protocol.RequestHeaders
	arena []byte
	hdrs  []protocol.Header
}

var shadowEvents = sync.Pool{New: func() any { return new(shadowEvent) }}

// shadowRunner sends one shadow agent its events.
type shadowRunner struct {
	name    string
	agent   agentmux.Agent
	timeout time.Duration
	cfg     shadowCfg
	q       chan *shadowEvent
	// log is the server's logger, taken from the first request (the
	// table is built without one).
	log atomic.Pointer[zerolog.Logger]

	workers atomic.Int32
	// stopCh, once closed (stop), ends the workers and their exchanges:
	// at shutdown, or when a reload dropped the runner. wg counts the
	// workers; startMu orders starting one against stop.
	stopCh  chan struct{}
	startMu sync.Mutex
	stopped bool
	wg      sync.WaitGroup

	queued, dropped, failed            atomic.Uint64
	allowed, wouldBlock, wouldRedirect atomic.Uint64
	logBlock, logFail, logDrop         rateLog
	mu                                 sync.Mutex
	byStatus                           map[int]uint64
	byRule                             map[string]uint64
}

type shadowCfg struct {
	queue, workers int
	timeout        time.Duration
}

func newShadowRunner(a *config.Agent, inst agentmux.Agent) *shadowRunner {
	c := shadowCfg{queue: a.ShadowQueue, workers: a.ShadowWorkers, timeout: a.Timeouts.Message}
	return &shadowRunner{
		name: a.Name, agent: inst, timeout: c.timeout, cfg: c,
		q:        make(chan *shadowEvent, c.queue),
		stopCh:   make(chan struct{}),
		byStatus: map[int]uint64{}, byRule: map[string]uint64{},
	}
}

// shadowFor returns the runner of shadow agent a for a new table: the
// previous table's when the agent instance and its settings are the same
// (queued events and counters survive a reload), else a new one.
func shadowFor(prev *table, a *config.Agent, inst agentmux.Agent) *shadowRunner {
	if !a.Shadow {
		return nil
	}
	if prev != nil {
		for _, old := range prev.agents {
			if old.name == a.Name && old.agent == inst && old.shadow != nil &&
				old.shadow.cfg == (shadowCfg{queue: a.ShadowQueue, workers: a.ShadowWorkers, timeout: a.Timeouts.Message}) {
				return old.shadow
			}
		}
	}
	return newShadowRunner(a, inst)
}

// shadowRequest queues the request's headers for the route's shadow
// agents. It never waits.
func (rs *reqState) shadowRequest() {
	if rs.viewDirty {
		rs.buildRequestView()
	}
	for _, sr := range rs.rt.shadows {
		if sr.log.Load() == nil {
			sr.log.CompareAndSwap(nil, &rs.srv.log)
		}
		sr.enqueue(&rs.rh)
	}
}

func (sr *shadowRunner) enqueue(m *protocol.RequestHeaders) {
	ev := shadowEvents.Get().(*shadowEvent)
	ev.copyFrom(m)
	select {
	case sr.q <- ev:
		sr.queued.Add(1)
	default:
		sr.dropped.Add(1)
		shadowEvents.Put(ev)
		if ok, sup := sr.logDrop.allow(); ok {
			sr.log.Load().Warn().Str("agent", sr.name).Func(suppressed(sup)).Msg("shadow agent queue full, event dropped")
		}
		return
	}
	// Start a worker when fewer than the limit run; a running one may be
	// about to exit idle, which is why it re-checks the queue (work).
	for {
		n := sr.workers.Load()
		if int(n) >= sr.cfg.workers {
			return
		}
		if sr.workers.CompareAndSwap(n, n+1) {
			if !sr.start() {
				sr.workers.Add(-1)
			}
			return
		}
	}
}

// start starts a worker unless the runner is stopped.
func (sr *shadowRunner) start() bool {
	sr.startMu.Lock()
	defer sr.startMu.Unlock()
	if sr.stopped {
		return false
	}
	sr.wg.Add(1)
	go sr.work()
	return true
}

// stop ends the runner: its workers leave (an exchange in flight is
// canceled) and no new one starts; queued events are dropped.
func (sr *shadowRunner) stop() {
	sr.startMu.Lock()
	defer sr.startMu.Unlock()
	if !sr.stopped {
		sr.stopped = true
		close(sr.stopCh)
	}
}

// waitStopped waits for the workers of a stopped runner to leave, or for
// ctx to end.
func (sr *shadowRunner) waitStopped(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		sr.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// copyFrom fills ev with a deep copy of m (the fields an agent sees in
// RequestHeaders; the inline body is never sent to a shadow agent).
func (ev *shadowEvent) copyFrom(m *protocol.RequestHeaders) {
	a := ev.arena[:0]
	cp := func(b []byte) []byte {
		if b == nil {
			return nil
		}
		start := len(a)
		a = append(a, b...)
		return a[start:len(a):len(a)]
	}
	// The arena must not move while slices of it are taken: size it first.
	n := len(m.Method) + len(m.URI)
	for _, h := range m.Headers {
		n += len(h.Name) + len(h.Value)
	}
	md := &m.Metadata
	n += len(md.CorrelationID) + len(md.ClientIP) + len(md.Protocol) + len(md.ServerName) + len(md.RouteID) +
		len(md.UpstreamID) + len(md.Traceparent) + len(md.Timestamp) + len(md.TLSVersion) + len(md.TLSCipher) +
		len(md.TLSServerName) + len(md.TLSClientSubject) + len(md.TLSClientSAN)
	if cap(a) < n {
		a = make([]byte, 0, n)
	}
	hdrs := ev.hdrs[:0]
	for _, h := range m.Headers {
		hdrs = append(hdrs, protocol.Header{Name: cp(h.Name), Value: cp(h.Value)})
	}
	ev.rh = protocol.RequestHeaders{
		Method:  cp(m.Method),
		URI:     cp(m.URI),
		HasBody: m.HasBody,
		Headers: hdrs,
		Metadata: protocol.Metadata{
			CorrelationID:    cp(md.CorrelationID),
			ClientIP:         cp(md.ClientIP),
			ClientPort:       md.ClientPort,
			Protocol:         cp(md.Protocol),
			ServerName:       cp(md.ServerName),
			RouteID:          cp(md.RouteID),
			UpstreamID:       cp(md.UpstreamID),
			Traceparent:      cp(md.Traceparent),
			Timestamp:        cp(md.Timestamp),
			TLSVersion:       cp(md.TLSVersion),
			TLSCipher:        cp(md.TLSCipher),
			TLSServerName:    cp(md.TLSServerName),
			TLSClientSubject: cp(md.TLSClientSubject),
			TLSClientSAN:     cp(md.TLSClientSAN),
		},
	}
	ev.arena, ev.hdrs = a, hdrs
}

// work sends queued events until the queue stays empty for shadowIdle.
func (sr *shadowRunner) work() {
	defer sr.wg.Done()
	idle := time.NewTimer(shadowIdle)
	defer idle.Stop()
	for {
		select {
		case <-sr.stopCh:
			sr.workers.Add(-1)
			return
		case ev := <-sr.q:
			sr.send(ev)
			shadowEvents.Put(ev)
			idle.Reset(shadowIdle)
		case <-idle.C:
			sr.workers.Add(-1)
			// An event queued while this worker was leaving found the
			// limit reached and started none: take it back up.
			if len(sr.q) == 0 || !sr.rejoin() {
				return
			}
			idle.Reset(shadowIdle)
		}
	}
}

func (sr *shadowRunner) rejoin() bool {
	for {
		n := sr.workers.Load()
		if int(n) >= sr.cfg.workers {
			return false
		}
		if sr.workers.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// send runs one event through the shadow agent and counts the answer.
func (sr *shadowRunner) send(ev *shadowEvent) {
	w := agentmux.Wait{Deadline: time.Now().Add(sr.timeout), Cancel: sr.stopCh}
	ex, err := sr.agent.Begin(w)
	if err != nil {
		sr.fail(ev, err)
		return
	}
	reply, err := ex.RequestHeaders(w, &ev.rh)
	if err != nil {
		ex.Finish()
		sr.fail(ev, err)
		return
	}
	d := &reply.Decision
	switch d.Kind {
	case protocol.DecisionBlock:
		sr.wouldBlock.Add(1)
		sr.countBlock(ev, d, "would block")
	case protocol.DecisionRedirect:
		sr.wouldRedirect.Add(1)
		sr.countBlock(ev, d, "would redirect")
	default:
		sr.allowed.Add(1)
	}
	// The shadow agent has no further say in this request.
	ex.Cancel(reasonDecided)
	ex.Finish()
}

func (sr *shadowRunner) fail(ev *shadowEvent, err error) {
	select {
	case <-sr.stopCh:
		return // stopped: not the agent's failure
	default:
	}
	sr.failed.Add(1)
	if ok, sup := sr.logFail.allow(); ok {
		sr.log.Load().Warn().Str("agent", sr.name).Bytes("correlation_id", ev.rh.Metadata.CorrelationID).
			Str("failure", outcomeOf(err).String()).Func(suppressed(sup)).Err(err).Msg("shadow agent failed")
	}
}

func (sr *shadowRunner) countBlock(ev *shadowEvent, d *protocol.Decision, what string) {
	sr.mu.Lock()
	sr.byStatus[d.Status]++
	for _, r := range d.Audit.RuleIDs {
		k := ruleLabel(r)
		if _, ok := sr.byRule[k]; !ok && len(sr.byRule) >= maxShadowRules {
			k = shadowOtherRule
		}
		sr.byRule[k]++
	}
	sr.mu.Unlock()
	if ok, sup := sr.logBlock.allow(); ok {
		e := sr.log.Load().Info().Str("agent", sr.name).Bytes("correlation_id", ev.rh.Metadata.CorrelationID).
			Bytes("method", ev.rh.Method).Bytes("uri", ev.rh.URI).Int("status", d.Status)
		if len(d.Audit.RuleIDs) > 0 {
			arr := zerolog.Arr()
			for _, r := range d.Audit.RuleIDs {
				arr.Bytes(r)
			}
			e = e.Array("rule_ids", arr)
		}
		e.Func(suppressed(sup)).Msg("shadow agent " + what)
	}
}

// ruleLabel makes an agent's rule id fit a metric label: valid UTF-8, at
// most 128 bytes.
func ruleLabel(r []byte) string {
	if len(r) > 128 {
		r = r[:128]
	}
	return strings.ToValidUTF8(string(r), "\uFFFD")
}

// ShadowStatus counts what one shadow agent saw and would have done.
type ShadowStatus struct {
	Agent string `json:"agent"`
	// Queued events were accepted into the queue; Dropped found it full.
	Queued  uint64 `json:"queued"`
	Dropped uint64 `json:"dropped"`
	// Failed events got no answer (timeout, connection, overload).
	Failed uint64 `json:"failed"`
	// Allowed, WouldBlock and WouldRedirect are the answers.
	Allowed       uint64 `json:"allowed"`
	WouldBlock    uint64 `json:"would_block"`
	WouldRedirect uint64 `json:"would_redirect"`
	// ByStatus counts blocks and redirects by status; ByRule counts them
	// by the audit rule ids of the decision (at most 64, then "(other)").
	ByStatus map[string]uint64 `json:"by_status,omitempty"`
	ByRule   map[string]uint64 `json:"by_rule,omitempty"`
	// Waiting is the queue's length now.
	Waiting int `json:"waiting"`
}

// Shadows returns the counters of every current shadow agent.
func (s *Server) Shadows() []ShadowStatus {
	t := s.tbl.Load()
	var out []ShadowStatus
	for _, a := range t.agents {
		sr := a.shadow
		if sr == nil {
			continue
		}
		st := ShadowStatus{
			Agent: a.name, Queued: sr.queued.Load(), Dropped: sr.dropped.Load(), Failed: sr.failed.Load(),
			Allowed: sr.allowed.Load(), WouldBlock: sr.wouldBlock.Load(), WouldRedirect: sr.wouldRedirect.Load(),
			Waiting: len(sr.q),
		}
		sr.mu.Lock()
		if len(sr.byStatus) > 0 {
			st.ByStatus = make(map[string]uint64, len(sr.byStatus))
			for k, v := range sr.byStatus {
				st.ByStatus[strconv.Itoa(k)] = v
			}
		}
		if len(sr.byRule) > 0 {
			st.ByRule = make(map[string]uint64, len(sr.byRule))
			for k, v := range sr.byRule {
				st.ByRule[k] = v
			}
		}
		sr.mu.Unlock()
		out = append(out, st)
	}
	return out
}
