package exchange

import (
	"context"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/dataplane/internal/ratelog"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/observe"
	"github.com/zentinelproxy/sidecar/protocol"
)

// Shadow agents (agents[].shadow). A shadow agent gets the events of
// every request of its routes that an enforcing agent with its
// capabilities would get: the RequestHeaders as the client sent them
// (before the enforcing agents changed anything), the request body as the
// upstream gets it, the response headers as the upstream sent them and the
// response body as the client gets it, in order, over one exchange per
// request (a conversation). No request waits for it: the request path
// copies each event into a bounded queue and goes on, and a few workers
// per agent send the events and count what the agent would have done. An
// event that does not fit (the queue's event count or its byte budget for
// body data) abandons its request's conversation: its later events are
// dropped, its exchange canceled, and it is counted once as dropped. A
// slow or dead shadow agent thus never delays traffic. Its decisions are
// never applied.
//
// Ordering: a conversation with queued events is in the runner's ready
// queue at most once, and only the worker that took it sends its events,
// so they reach the agent in order whatever the number of workers.

// shadowIdle is how long an idle worker waits for an event before it
// exits: workers exist only while there is traffic, so a runner that a
// reload dropped leaves no goroutine behind.
const shadowIdle = time.Second

// maxShadowRules bounds the rule ids counted per shadow agent; further
// ones count under shadowOtherRule.
const maxShadowRules = 64

const shadowOtherRule = "(other)"

// Kinds of shadow events.
const (
	shadowReqHeaders uint8 = iota
	shadowReqBody
	shadowRespHeaders
	shadowRespBody
)

// shadowEvent is one queued event with its own copy of the bytes.
type shadowEvent struct {
	kind  uint8
	rh    protocol.RequestHeaders
	rsh   protocol.ResponseHeaders
	chunk protocol.BodyChunk
	arena []byte
	hdrs  []protocol.Header
	// size is what the event holds of the runner's byte budget.
	size int64
}

var shadowEvents = sync.Pool{New: func() any { return new(shadowEvent) }}

func putShadowEvent(ev *shadowEvent) {
	if cap(ev.arena) > 1<<20 {
		ev.arena = nil
	}
	ev.chunk.Data = nil
	shadowEvents.Put(ev)
}

// shadowRunner sends one shadow agent its events.
type shadowRunner struct {
	name    string
	agent   agentmux.Agent
	timeout time.Duration
	cfg     shadowCfg
	// q holds the conversations with events to send, each at most once;
	// each holds at least one reserved event, so q never fills.
	q chan *shadowConv
	// log is the server's logger, taken from the first request (the
	// table is built without one).
	log atomic.Pointer[zerolog.Logger]

	workers atomic.Int32
	// stopCh, once closed (stop), ends the workers and their exchanges:
	// at shutdown, or when a reload dropped the runner. wg counts the
	// workers; startMu orders starting one against stop.
	stopCh  chan struct{}
	startMu sync.Mutex
	stopped atomic.Bool
	wg      sync.WaitGroup

	// events and bytes are what waits in the queues now (bytes: body
	// data); peakBytes is the most bytes ever waiting.
	events, bytes, peakBytes atomic.Int64

	queued, dropped, failed            atomic.Uint64
	allowed, wouldBlock, wouldRedirect atomic.Uint64
	wouldMutate                        atomic.Uint64
	logBlock, logFail, logDrop         ratelog.Limit
	mu                                 sync.Mutex
	byStatus                           map[int]uint64
	byRule                             map[string]uint64
}

type shadowCfg struct {
	queue, workers int
	bytes          int64
	timeout        time.Duration
}

func shadowCfgOf(a *config.Agent) shadowCfg {
	return shadowCfg{queue: a.ShadowQueue, workers: a.ShadowWorkers, bytes: int64(a.ShadowQueueBytes), timeout: a.Timeouts.Message}
}

func newShadowRunner(a *config.Agent, inst agentmux.Agent) *shadowRunner {
	c := shadowCfgOf(a)
	return &shadowRunner{
		name: a.Name, agent: inst, timeout: c.timeout, cfg: c,
		q:        make(chan *shadowConv, c.queue),
		stopCh:   make(chan struct{}),
		byStatus: map[int]uint64{}, byRule: map[string]uint64{},
	}
}

// shadowFor returns the runner of shadow agent a for a new table: the
// previous table's when the agent instance and its settings are the same
// (queued events and counters survive a reload), else a new one.
func shadowFor(prev *Table, a *config.Agent, inst agentmux.Agent) *shadowRunner {
	if !a.Shadow {
		return nil
	}
	if old := prevAgent(prev, a.Name, inst); old != nil && old.shadow != nil && old.shadow.cfg == shadowCfgOf(a) {
		return old.shadow
	}
	return newShadowRunner(a, inst)
}

// shadowConv is one request's conversation with one shadow agent.
type shadowConv struct {
	sr *shadowRunner
	// Set when the request starts, read-only afterwards: which events the
	// request side queues, and the body chunk sizes.
	want  [4]bool
	chunk [2]int
	// Request side only.
	reqBodyQueued bool
	progress      [2]int64
	// For log lines.
	corr, method, uri string

	// off mirrors dead for the request side's fast check.
	off atomic.Bool

	mu sync.Mutex
	// pending events; non-empty only while scheduled. It starts in pend,
	// so a request's first events cost no allocation.
	pending []*shadowEvent
	pend    [4]*shadowEvent
	// scheduled: in the runner's ready queue or held by a worker; ended:
	// the request is over; dead: no further event is sent.
	scheduled, ended, dead bool
	// ex is the open exchange; used by the worker holding the
	// conversation, or closed by whoever finds it idle and over.
	ex *agentmux.Exchange

	// Worker side (whoever holds the conversation).
	begun bool
	caps  protocol.Capabilities
	index [2]uint32
	said  [2]bool // the agent's say over a body ended (final allow)
}

// shadowRequest opens the conversations of the route's shadow agents and
// queues the request's headers for them. It never waits.
func (ex *Exchange) shadowRequest() {
	ex.requestView(false)
	// For log lines: one allocation per request, shared by its
	// conversations.
	var corr, method, uri string
	for k, sr := range ex.rt.shadows {
		if sr.log.Load() == nil {
			sr.log.CompareAndSwap(nil, &ex.core.log)
		}
		caps := sr.agent.Capabilities()
		c := &shadowConv{sr: sr}
		pol := &ex.rt.shadowBody[k]
		if caps == (protocol.Capabilities{}) {
			// No live connection: try the headers, to learn why.
			c.want[shadowReqHeaders] = true
		} else {
			c.want[shadowReqHeaders] = caps.HandlesRequestHeaders
			c.want[shadowReqBody] = caps.HandlesRequestBody && pol[0].mode != bodyNone && ex.hasReqBody
			c.want[shadowRespHeaders] = caps.HandlesResponseHeaders
			c.want[shadowRespBody] = caps.HandlesResponseBody && pol[1].mode != bodyNone
		}
		if c.want == [4]bool{} {
			continue
		}
		c.chunk = [2]int{pol[0].chunk, pol[1].chunk}
		if corr == "" && method == "" && uri == "" {
			rh := &ex.rh
			s := string(rh.Metadata.CorrelationID) + string(rh.Method) + string(rh.URI)
			n1, n2 := len(rh.Metadata.CorrelationID), len(rh.Metadata.CorrelationID)+len(rh.Method)
			corr, method, uri = s[:n1], s[n1:n2], s[n2:]
		}
		c.corr, c.method, c.uri = corr, method, uri
		c.pending = c.pend[:0]
		ex.shadowConvs = append(ex.shadowConvs, c)
		if c.want[shadowReqHeaders] {
			// The view the agent's live connections negotiated (the
			// exchange opens later, on the worker).
			ex.requestView(caps.SupportsClientRequest)
			ev := shadowEvents.Get().(*shadowEvent)
			ev.copyFrom(&ex.rh)
			c.enqueue(ev)
		}
	}
}

// shadowResponse queues the response headers as the upstream sent them.
func (ex *Exchange) shadowResponse() {
	r := &ex.resp
	for _, c := range ex.shadowConvs {
		if !c.want[shadowRespHeaders] || c.off.Load() {
			continue
		}
		ev := shadowEvents.Get().(*shadowEvent)
		ev.copyResponse(r.Status, r.Fields, ex.respHasBody)
		c.enqueue(ev)
	}
}

// shadowBody queues a piece of body p (a copy of what the upstream or the
// client gets), cut to each agent's chunk size. total is the body's size
// when known, else -1.
func (ex *Exchange) shadowBody(p protocol.Phase, data []byte, last bool, total int64) {
	kind := shadowReqBody
	if p == protocol.PhaseResponse {
		kind = shadowRespBody
	}
	for _, c := range ex.shadowConvs {
		if !c.want[kind] || c.off.Load() {
			continue
		}
		rest := data
		for first := true; first || len(rest) > 0; first = false {
			n := min(len(rest), c.chunk[p])
			c.progress[p] += int64(n)
			ev := shadowEvents.Get().(*shadowEvent)
			ev.kind = kind
			ev.arena = append(ev.arena[:0], rest[:n]...)
			ev.chunk = protocol.BodyChunk{Data: ev.arena, IsLast: last && n == len(rest), TotalSize: total, Progress: c.progress[p]}
			ev.size = int64(n)
			if !c.enqueue(ev) {
				break
			}
			rest = rest[n:]
		}
	}
}

// shadowRequestBody queues the whole buffered request body (once: a
// replayed request writes it again).
func (ex *Exchange) shadowRequestBody(body []byte) {
	if c := ex.shadowConvs[0]; c.reqBodyQueued {
		return
	}
	for _, c := range ex.shadowConvs {
		c.reqBodyQueued = true
	}
	ex.shadowBody(protocol.PhaseRequest, body, true, int64(len(body)))
}

// endShadows ends the request's conversations: events already queued are
// still sent, then the exchanges end.
func (ex *Exchange) endShadows() {
	for k, c := range ex.shadowConvs {
		c.end()
		ex.shadowConvs[k] = nil
	}
	ex.shadowConvs = ex.shadowConvs[:0]
}

// enqueue queues ev for the conversation without waiting. It reports
// false when the conversation is over (ev is then released).
func (c *shadowConv) enqueue(ev *shadowEvent) bool {
	sr := c.sr
	c.mu.Lock()
	if c.dead || c.ended {
		c.mu.Unlock()
		putShadowEvent(ev)
		return false
	}
	if sr.stopped.Load() || !sr.reserve(ev.size) {
		ex := c.kill()
		c.mu.Unlock()
		putShadowEvent(ev)
		closeShadow(ex)
		if sr.stopped.Load() {
			return false
		}
		sr.dropped.Add(1)
		if ok, sup := sr.logDrop.Allow(); ok {
			sr.log.Load().Warn().Str("agent", sr.name).Str("correlation_id", c.corr).Func(ratelog.Suppressed(sup)).
				Msg("shadow agent queue full, conversation dropped")
		}
		return false
	}
	c.pending = append(c.pending, ev)
	sched := !c.scheduled
	c.scheduled = true
	c.mu.Unlock()
	sr.queued.Add(1)
	if sched {
		sr.q <- c // never blocks: q has room for every reserved event
	}
	if sr.stopped.Load() {
		sr.drain()
		return false
	}
	sr.spawn()
	return true
}

// kill marks the conversation dead (c.mu held) and returns its exchange
// for the caller to close when no worker holds it.
func (c *shadowConv) kill() *agentmux.Exchange {
	c.dead = true
	c.off.Store(true)
	if c.scheduled {
		return nil // the worker holding it closes it
	}
	ex := c.ex
	c.ex = nil
	return ex
}

// end is called once the request is over.
func (c *shadowConv) end() {
	c.mu.Lock()
	c.ended = true
	var ex *agentmux.Exchange
	if !c.scheduled {
		ex, c.ex = c.ex, nil
	}
	c.mu.Unlock()
	closeShadow(ex)
}

func closeShadow(ex *agentmux.Exchange) {
	if ex == nil {
		return
	}
	// The shadow agent has no further say in this request.
	ex.Cancel(reasonDecided)
	ex.Finish()
}

// reserve takes room for one event of size body bytes, or reports false.
func (sr *shadowRunner) reserve(size int64) bool {
	if sr.events.Add(1) > int64(sr.cfg.queue) {
		sr.events.Add(-1)
		return false
	}
	if size > 0 {
		b := sr.bytes.Add(size)
		if b > sr.cfg.bytes {
			sr.bytes.Add(-size)
			sr.events.Add(-1)
			return false
		}
		for {
			p := sr.peakBytes.Load()
			if b <= p || sr.peakBytes.CompareAndSwap(p, b) {
				break
			}
		}
	}
	return true
}

func (sr *shadowRunner) release(ev *shadowEvent) {
	sr.events.Add(-1)
	if ev.size > 0 {
		sr.bytes.Add(-ev.size)
	}
	putShadowEvent(ev)
}

// spawn starts a worker when fewer than the limit run; a running one may
// be about to exit idle, which is why it re-checks the queue (work).
func (sr *shadowRunner) spawn() {
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
	if sr.stopped.Load() {
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
	if !sr.stopped.Load() {
		sr.stopped.Store(true)
		close(sr.stopCh)
	}
	sr.startMu.Unlock()
	sr.drain()
}

// drain abandons the conversations waiting in the ready queue of a
// stopped runner.
func (sr *shadowRunner) drain() {
	for {
		select {
		case c := <-sr.q:
			sr.abandon(c)
		default:
			return
		}
	}
}

// abandon ends a conversation taken from the ready queue unsent.
func (sr *shadowRunner) abandon(c *shadowConv) {
	c.mu.Lock()
	c.dead = true
	c.off.Store(true)
	c.scheduled = false
	drop := c.pending
	c.pending = nil
	ex := c.ex
	c.ex = nil
	c.mu.Unlock()
	for _, ev := range drop {
		sr.release(ev)
	}
	closeShadow(ex)
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
	ev.kind = shadowReqHeaders
	ev.size = 0
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
	n := len(m.Method) + len(m.URI) + len(m.RequestTarget)
	for _, h := range m.Headers {
		n += len(h.Name) + len(h.Value)
	}
	md := &m.Metadata
	n += len(md.CorrelationID) + len(md.ClientIP) + len(md.Protocol) + len(md.ServerName) + len(md.RouteID) +
		len(md.UpstreamID) + len(md.Traceparent) + len(md.Timestamp) + len(md.TLSVersion) + len(md.TLSCipher) +
		len(md.TLSServerName) + len(md.TLSClientSubject) + len(md.TLSClientSAN) +
		len(md.ServerIP) + len(md.ListenerID) + len(md.UpstreamHost) + len(md.ForwardedFor) +
		len(md.ForwardedProto) + len(md.ForwardedHost) + len(md.Path)
	if cap(a) < n {
		a = make([]byte, 0, n)
	}
	hdrs := ev.hdrs[:0]
	for _, h := range m.Headers {
		hdrs = append(hdrs, protocol.Header{Name: cp(h.Name), Value: cp(h.Value)})
	}
	ev.rh = protocol.RequestHeaders{
		Method:        cp(m.Method),
		URI:           cp(m.URI),
		RequestTarget: cp(m.RequestTarget),
		HasBody:       m.HasBody,
		Headers:       hdrs,
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
			ServerIP:         cp(md.ServerIP),
			ServerPort:       md.ServerPort,
			ListenerID:       cp(md.ListenerID),
			UpstreamHost:     cp(md.UpstreamHost),
			ForwardedFor:     cp(md.ForwardedFor),
			ForwardedProto:   cp(md.ForwardedProto),
			ForwardedHost:    cp(md.ForwardedHost),
			Path:             cp(md.Path),
		},
	}
	ev.arena, ev.hdrs = a, hdrs
}

// copyResponse fills ev with a copy of the response head, header names
// lower-cased as in every ResponseHeaders.
func (ev *shadowEvent) copyResponse(status int, fields []Field, hasBody bool) {
	ev.kind = shadowRespHeaders
	ev.size = 0
	n := 0
	for _, f := range fields {
		n += len(f.Name) + len(f.Value)
	}
	a := ev.arena[:0]
	if cap(a) < n {
		a = make([]byte, 0, n)
	}
	hdrs := ev.hdrs[:0]
	for _, f := range fields {
		start := len(a)
		a = append(a, f.Name...)
		name := a[start:len(a):len(a)]
		for i, c := range name {
			if 'A' <= c && c <= 'Z' {
				name[i] = c + 'a' - 'A'
			}
		}
		start = len(a)
		a = append(a, f.Value...)
		hdrs = append(hdrs, protocol.Header{Name: name, Value: a[start:len(a):len(a)]})
	}
	ev.rsh = protocol.ResponseHeaders{StatusCode: status, Headers: hdrs, HasBody: hasBody}
	ev.arena, ev.hdrs = a, hdrs
}

// work runs conversations until none is ready for shadowIdle.
func (sr *shadowRunner) work() {
	defer sr.wg.Done()
	idle := time.NewTimer(shadowIdle)
	defer idle.Stop()
	for {
		select {
		case <-sr.stopCh:
			sr.workers.Add(-1)
			sr.drain()
			return
		case c := <-sr.q:
			sr.run(c)
			idle.Reset(shadowIdle)
		case <-idle.C:
			sr.workers.Add(-1)
			// A conversation queued while this worker was leaving found
			// the limit reached and started none: take it back up.
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

// run sends the conversation's pending events, in order, until none is
// left; the conversation goes back to idle (or ends).
func (sr *shadowRunner) run(c *shadowConv) {
	for {
		c.mu.Lock()
		if c.dead || len(c.pending) == 0 || sr.stopped.Load() {
			// A non-empty drop means the conversation is now dead: no
			// event joins pend again while drop is cleared below.
			drop := c.pending
			c.pending = c.pend[:0]
			c.scheduled = false
			var ex *agentmux.Exchange
			if c.dead || c.ended || sr.stopped.Load() {
				c.dead = true
				c.off.Store(true)
				ex, c.ex = c.ex, nil
			}
			c.mu.Unlock()
			for k, ev := range drop {
				sr.release(ev)
				drop[k] = nil
			}
			closeShadow(ex)
			return
		}
		ev := c.pending[0]
		c.pending[0] = nil
		c.pending = c.pending[1:]
		c.mu.Unlock()
		more := sr.send(c, ev)
		sr.release(ev)
		if !more {
			c.mu.Lock()
			c.dead = true
			c.off.Store(true)
			c.mu.Unlock()
		}
	}
}

// send runs one event through the shadow agent and counts the answer. It
// reports whether the conversation goes on.
func (sr *shadowRunner) send(c *shadowConv, ev *shadowEvent) bool {
	w := agentmux.Wait{Deadline: time.Now().Add(sr.timeout), Cancel: sr.stopCh}
	if c.ex == nil {
		if c.begun {
			return false
		}
		c.begun = true
		ex, err := sr.agent.Begin(w)
		if err != nil {
			sr.fail(c, err)
			return false
		}
		c.ex, c.caps = ex, ex.Capabilities()
	}
	var reply *agentmux.Reply
	var err error
	phase := protocol.PhaseRequest
	body := false
	switch ev.kind {
	case shadowReqHeaders:
		if !c.caps.HandlesRequestHeaders {
			return c.expectMore(ev)
		}
		reply, err = c.ex.RequestHeaders(w, &ev.rh)
	case shadowRespHeaders:
		phase = protocol.PhaseResponse
		if !c.caps.HandlesResponseHeaders {
			return c.expectMore(ev)
		}
		reply, err = c.ex.ResponseHeaders(w, &ev.rsh)
	default:
		body = true
		if ev.kind == shadowRespBody {
			phase = protocol.PhaseResponse
		}
		if !c.caps.Handles(phase, true) || c.said[phase] {
			return c.expectMore(ev)
		}
		ev.chunk.ChunkIndex = c.index[phase]
		c.index[phase]++
		reply, err = c.ex.BodyChunk(w, phase, &ev.chunk)
		if ev.chunk.IsLast {
			c.said[phase] = true
		}
	}
	if err != nil {
		sr.fail(c, err)
		return false
	}
	if reply.Type == protocol.TypeBodyMutation {
		if reply.Mutation.Action != protocol.MutationPass {
			sr.wouldMutate.Add(1)
		}
		sr.allowed.Add(1)
		return c.expectMore(ev)
	}
	d := &reply.Decision
	switch d.Kind {
	case protocol.DecisionBlock:
		sr.wouldBlock.Add(1)
		sr.countBlock(c, phase, body, d, "would block")
		return false // the request would have ended here
	case protocol.DecisionRedirect:
		sr.wouldRedirect.Add(1)
		sr.countBlock(c, phase, body, d, "would redirect")
		return false
	}
	sr.allowed.Add(1)
	if (phase == protocol.PhaseRequest && d.HasRequestBodyMutation && d.RequestBodyMutation.Action != protocol.MutationPass) ||
		(phase == protocol.PhaseResponse && d.HasResponseBodyMutation && d.ResponseBodyMutation.Action != protocol.MutationPass) {
		sr.wouldMutate.Add(1)
	}
	if body && d.Final() {
		c.said[phase] = true // its say over this body ended
	}
	return c.expectMore(ev)
}

// expectMore reports whether the agent may get further events of the
// request after ev.
func (c *shadowConv) expectMore(ev *shadowEvent) bool {
	caps := c.caps
	respHdr := c.want[shadowRespHeaders] && caps.HandlesResponseHeaders
	respBody := c.want[shadowRespBody] && caps.HandlesResponseBody
	switch ev.kind {
	case shadowReqHeaders:
		return c.want[shadowReqBody] && caps.HandlesRequestBody || respHdr || respBody
	case shadowReqBody:
		return !ev.chunk.IsLast || respHdr || respBody
	case shadowRespHeaders:
		return respBody && ev.rsh.HasBody
	}
	return !ev.chunk.IsLast
}

func (sr *shadowRunner) fail(c *shadowConv, err error) {
	select {
	case <-sr.stopCh:
		return // stopped: not the agent's failure
	default:
	}
	sr.failed.Add(1)
	if ok, sup := sr.logFail.Allow(); ok {
		sr.log.Load().Warn().Str("agent", sr.name).Str("correlation_id", c.corr).
			Str("failure", outcomeOf(err).String()).Func(ratelog.Suppressed(sup)).Err(err).Msg("shadow agent failed")
	}
}

func (sr *shadowRunner) countBlock(c *shadowConv, phase protocol.Phase, body bool, d *protocol.Decision, what string) {
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
	if ok, sup := sr.logBlock.Allow(); ok {
		e := sr.log.Load().Info().Str("agent", sr.name).Str("correlation_id", c.corr).
			Str("method", c.method).Str("uri", c.uri).Str("phase", phaseName(phase, body)).Int("status", d.Status)
		if len(d.Audit.RuleIDs) > 0 {
			arr := zerolog.Arr()
			for _, r := range d.Audit.RuleIDs {
				arr.Bytes(r)
			}
			e = e.Array("rule_ids", arr)
		}
		e.Func(ratelog.Suppressed(sup)).Msg("shadow agent " + what)
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

// Shadows returns the counters of every current shadow agent.
func (c *Core) Shadows() []observe.ShadowStatus {
	t := c.tbl.Load()
	var out []observe.ShadowStatus
	for _, a := range t.agents {
		sr := a.shadow
		if sr == nil {
			continue
		}
		st := observe.ShadowStatus{
			Agent: a.name, Queued: sr.queued.Load(), Dropped: sr.dropped.Load(), Failed: sr.failed.Load(),
			Allowed: sr.allowed.Load(), WouldBlock: sr.wouldBlock.Load(), WouldRedirect: sr.wouldRedirect.Load(),
			WouldMutate: sr.wouldMutate.Load(),
			Waiting:     int(sr.events.Load()), WaitingBytes: sr.bytes.Load(), PeakWaitingBytes: sr.peakBytes.Load(),
		}
		sr.mu.Lock()
		if len(sr.byStatus) > 0 {
			st.ByStatus = make(map[string]uint64, len(sr.byStatus))
			for k, v := range sr.byStatus {
				st.ByStatus[strconv.Itoa(k)] = v
			}
		}
		if len(sr.byRule) > 0 {
			st.ByRule = maps.Clone(sr.byRule)
		}
		sr.mu.Unlock()
		out = append(out, st)
	}
	return out
}
