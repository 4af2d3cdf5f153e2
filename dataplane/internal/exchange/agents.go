package exchange

import (
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/dataplane/internal/clock"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/observe"
	"github.com/zentinelproxy/sidecar/protocol"
)

// agentSlots are the route's agents' slots in the request; the used
// ones are cleared when it ends.
type agentSlots struct {
	slots  [maxAgents]slot
	nslots int
}

func (s *agentSlots) reset() {
	clear(s.slots[:s.nslots])
	s.nslots = 0
}

// messages are the events shown to the agents, kept with the request for
// their buffers (each Reset keeps them).
type messages struct {
	rh    protocol.RequestHeaders
	rsh   protocol.ResponseHeaders
	chunk protocol.BodyChunk
}

func (m *messages) reset() {
	m.rh.Reset()
	m.rsh.Reset()
	m.chunk.Reset()
}

// chainState is what the agents' answers did to the request.
type chainState struct {
	viewDirty    bool // rh is older than the request
	viewClient   bool // rh holds the client's view (clientview.go)
	names        []byte
	failedOpen   [maxAgents]uint8
	nFailed      int
	skipped      [2]bool // inspection skipped per phase
	decider      int     // the agent whose block or redirect ended the request, or -1
	failedClosed int     // the agent whose fail-closed failure ended the request, or -1
	redirected   bool    // the decider redirected
	phaseNow     int
	agentTime    [observe.NumPhases]time.Duration
	inspected    [2]int64
	mutated      [2]int64
	active       [2][]uint8 // the agents in each phase's body pipeline
}

func (c *chainState) reset() {
	*c = chainState{
		names:        trim(c.names, 64<<10),
		active:       [2][]uint8{c.active[0][:0], c.active[1][:0]},
		decider:      -1,
		failedClosed: -1,
	}
}

// errInvalidReply is an agent reply the protocol or the security rules
// do not allow (bad status, bad redirect URL, unknown decision kind).
var errInvalidReply = errors.New("invalid agent reply")

// outcomeOf maps an exchange error to its outcome.
func outcomeOf(err error) observe.Outcome {
	switch {
	case errors.Is(err, agentmux.ErrAgentCanceled):
		return observe.OutcomeCanceled
	case errors.Is(err, agentmux.ErrAgentTimeout):
		return observe.OutcomeTimeout
	case errors.Is(err, agentmux.ErrAgentOverloaded):
		return observe.OutcomeOverloaded
	case errors.Is(err, agentmux.ErrAgentConnLost):
		return observe.OutcomeConnLost
	case errors.Is(err, agentmux.ErrAgentUnavailable):
		return observe.OutcomeUnavailable
	}
	return observe.OutcomeInvalid
}

func phaseName(p protocol.Phase, body bool) string {
	switch {
	case p == protocol.PhaseRequest && !body:
		return "request_headers"
	case p == protocol.PhaseRequest:
		return "request_body"
	case !body:
		return "response_headers"
	}
	return "response_body"
}

// knownCaps returns the capabilities to plan with: those of the
// request's exchange once begun (flagCaps, which stays after the exchange
// ends early: a request is planned with one set, and the agent is not
// asked again per phase),
// else the agent's (zero while it has no live connection, in which case
// the caller begins anyway to learn why).
func (ex *Exchange) knownCaps(sl *slot) (protocol.Capabilities, bool) {
	if sl.flags&flagCaps != 0 {
		return sl.caps, true
	}
	c := sl.ra.a.agent.Capabilities()
	return c, c != (protocol.Capabilities{})
}

// begin opens agent i's exchange for this request if not yet open.
func (ex *Exchange) begin(i int) error {
	sl := &ex.slots[i]
	if sl.ex != nil {
		return nil
	}
	t0 := clock.Mono()
	w, ok := ex.agentWait(sl, t0)
	if !ok {
		return errBudget(sl)
	}
	if !sl.ra.a.brk.allow() {
		return fmt.Errorf("%w: %s", ErrCircuitOpen, sl.ra.a.name)
	}
	ae, err := sl.ra.a.agent.Begin(w)
	d := clock.Mono() - t0
	sl.spent += d
	ex.agentTime[ex.phaseNow] += d
	if err != nil {
		return err
	}
	sl.ex = ae
	sl.caps = ae.Capabilities()
	sl.flags |= flagCaps
	for p := range sl.mode {
		m := sl.ra.body[p].mode
		if m == bodyAuto {
			m = bodyBuffered
			if sl.caps.SupportsStreaming {
				m = bodyStreaming
			}
		}
		sl.mode[p] = m
	}
	return nil
}

// errBudget is the error of an agent whose request budget is spent.
func errBudget(sl *slot) error {
	return fmt.Errorf("%w: %s: request budget spent", agentmux.ErrAgentTimeout, sl.ra.a.name)
}

// requestHeaders runs the request-header phase of the chain. It reports
// whether the request goes on (false: a response is staged or the client
// is gone).
func (ex *Exchange) requestHeaders() bool {
	ex.phaseNow = observe.PhaseRequestHeaders
	if len(ex.rt.shadows) > 0 {
		ex.shadowRequest()
	}
	for i := 0; i < ex.nslots; i++ {
		if !ex.headerEvent(i, protocol.PhaseRequest) {
			return false
		}
	}
	return true
}

// headerEvent sends agent i the header event of phase p (opening its
// exchange first if needed) and applies the answer. It reports whether the
// request goes on.
func (ex *Exchange) headerEvent(i int, p protocol.Phase) bool {
	sl := &ex.slots[i]
	if caps, known := ex.knownCaps(sl); known && !caps.Handles(p, false) {
		return true
	}
	fresh := sl.ex == nil
	if fresh && p == protocol.PhaseRequest && sl.ra.a.cache != nil {
		if done, goOn := ex.cacheLookup(i); done {
			return goOn
		}
	}
	if err := ex.begin(i); err != nil {
		ex.core.obs.AgentEvent(ex.rt.idx, sl.ra.a.idx, p, false, outcomeOf(err), 0)
		return ex.failure(i, p, false, err)
	}
	if !sl.caps.Handles(p, false) {
		return true
	}
	req := p == protocol.PhaseRequest
	if req {
		// Chunk 0 of the body rides along for an agent with inline_body
		// (inline.go); its way to agent i may change the headers too.
		if !ex.inlineBefore(i) {
			return false
		}
		ex.requestView(sl.caps.SupportsClientRequest)
	} else {
		ex.applyStashed()
		ex.buildResponseView()
	}
	// The deadline is computed afresh for each call from what is left of
	// the budget (Begin's time is already in sl.spent). A fresh exchange
	// is not refused here: if Begin spent the budget, its deadline is past
	// and the event fails as timed out.
	t0 := clock.Mono()
	w, ok := ex.agentWait(sl, t0)
	if !fresh && !ok {
		ex.core.obs.AgentEvent(ex.rt.idx, sl.ra.a.idx, p, false, observe.OutcomeTimeout, 0)
		return ex.failure(i, p, false, errBudget(sl))
	}
	var reply *agentmux.Reply
	var err error
	if req {
		reply, err = sl.ex.RequestHeaders(w, &ex.rh)
		if err != nil && sl.ra.a.failover {
			reply, err = ex.failoverHeaders(i, w, err)
		}
	} else {
		reply, err = sl.ex.ResponseHeaders(w, &ex.rsh)
	}
	d := clock.Mono() - t0
	sl.spent += d
	if req {
		ex.agentTime[observe.PhaseRequestHeaders] += d
		sl.flags |= flagReqHdrDone
	} else {
		ex.agentTime[observe.PhaseResponseHeaders] += d
		sl.flags |= flagRespHdrDone
	}
	if err != nil {
		ex.core.obs.AgentEvent(ex.rt.idx, sl.ra.a.idx, p, false, outcomeOf(err), d)
		return ex.failure(i, p, false, err)
	}
	sl.ra.a.brk.success(&ex.core.log, sl.ra.a.name)
	if req && sl.ra.a.cache != nil {
		ex.cacheStore(i, &reply.Decision)
	}
	if !ex.decide(i, p, false, &reply.Decision, d) {
		return false
	}
	if req {
		if ex.rh.HasInlineBody {
			ex.inlineAfter(i, &reply.Decision)
		}
		ex.finishEarly(i)
	}
	return true
}

// finishEarly releases agent i's slot on the agent as soon as nothing is
// left for it in this request, so a busy agent's in-flight limit is not
// held through the upstream round trip.
func (ex *Exchange) finishEarly(i int) {
	sl := &ex.slots[i]
	if sl.ex == nil {
		return
	}
	c := sl.caps
	if c.HandlesRequestBody && ex.hasReqBody && sl.mode[0] != bodyNone && sl.flags&flagReqBodyDone == 0 {
		return
	}
	if c.HandlesResponseHeaders || c.HandlesResponseBody {
		return
	}
	sl.ex.Finish()
	sl.ex = nil
}

// finishIdle ends the exchanges of agents with nothing left to do in
// this request, before a long upstream wait or body stream: their
// in-flight slots on the agent are freed early. At the request phase,
// agents that still handle the response or take part in the request body
// stay; at the response phase, only those in the response body pipeline.
func (ex *Exchange) finishIdle(p protocol.Phase) {
	for i := 0; i < ex.nslots; i++ {
		sl := &ex.slots[i]
		if sl.ex == nil || ex.inActive(p, i) {
			continue
		}
		if p == protocol.PhaseRequest && sl.flags&flagFailed == 0 && (sl.caps.HandlesResponseHeaders || sl.caps.HandlesResponseBody) {
			continue
		}
		ex.endSlot(i, false)
	}
}

func (ex *Exchange) inActive(p protocol.Phase, i int) bool {
	for _, j := range ex.active[p] {
		if int(j) == i {
			return true
		}
	}
	return false
}

// responseHeaders stages the upstream response's head for the client
// and runs the response-header phase of the chain.
func (ex *Exchange) responseHeaders() bool {
	h := ex.res.Head()
	ex.respSeen = true
	ex.respHasBody = h.HasBody
	ex.fromUpstream(h)
	if len(ex.shadowConvs) > 0 {
		ex.shadowResponse()
	}
	ex.phaseNow = observe.PhaseResponseHeaders
	for i := 0; i < ex.nslots; i++ {
		if ex.slots[i].flags&flagFailed != 0 {
			continue
		}
		if !ex.headerEvent(i, protocol.PhaseResponse) {
			return false
		}
	}
	return true
}

// decide applies a Decision of agent i. It reports whether the chain goes
// on; false means a response is staged (block, redirect, failure) or the
// response is to be aborted.
//
// d is normalized (protocol.Decision.Normalize, which agentmux applies to
// every reply of every transport): its kind is known, a block or redirect
// has its status (the defaults applied) and a redirect a URL, a block or
// redirect is final, header operations have an operation and a name. Those
// are the protocol's schema and are not checked again here. What decide
// checks is the proxy's own policy: the statuses it answers with (block
// 200–599, redirect 301/302/303/307/308), a safe redirect target
// (validRedirect), and the header operation limits and refusals.
func (ex *Exchange) decide(i int, phase protocol.Phase, body bool, d *protocol.Decision, wait time.Duration) bool {
	sl := &ex.slots[i]
	obs := ex.core.obs
	switch d.Kind {
	case protocol.DecisionAllow, protocol.DecisionNeedsMore, protocol.DecisionBlock, protocol.DecisionRedirect:
		if err := ex.checkLimits(i, d); err != nil {
			ex.core.stats.limits.Add(1)
			obs.AgentEvent(ex.rt.idx, sl.ra.a.idx, phase, body, observe.OutcomeInvalid, wait)
			return ex.failure(i, phase, body, err)
		}
	}
	if d.SetQuery && phase == protocol.PhaseRequest && (d.Kind == protocol.DecisionAllow || d.Kind == protocol.DecisionNeedsMore) {
		if over, err := ex.checkQuery(i, d); err != nil {
			if over {
				ex.core.stats.limits.Add(1)
			}
			obs.AgentEvent(ex.rt.idx, sl.ra.a.idx, phase, body, observe.OutcomeInvalid, wait)
			return ex.failure(i, phase, body, err)
		}
		ex.applyQuery(i, d)
	}
	switch d.Kind {
	case protocol.DecisionAllow, protocol.DecisionNeedsMore:
		ex.applyOps(i, d)
		o := observe.OutcomeAllow
		if !d.Final() {
			// needs_more at a header event is an allow for now: an agent
			// that handles the body gets its chunks either way.
			o = observe.OutcomeContinue
		}
		obs.AgentEvent(ex.rt.idx, sl.ra.a.idx, phase, body, o, wait)
		return true
	case protocol.DecisionBlock:
		status := d.Status
		if status < 200 || status > 599 {
			// 1xx cannot be a final response; the contract's 100–599 is
			// narrowed so a block always ends the exchange cleanly.
			obs.AgentEvent(ex.rt.idx, sl.ra.a.idx, phase, body, observe.OutcomeInvalid, wait)
			return ex.failure(i, phase, body, fmt.Errorf("%w: block status %d", errInvalidReply, status))
		}
		obs.AgentEvent(ex.rt.idx, sl.ra.a.idx, phase, body, observe.OutcomeBlock, wait)
		ex.applyOps(i, d)
		ex.block(i, d, status)
		return false
	case protocol.DecisionRedirect:
		status := d.Status
		switch {
		case status != 301 && status != 302 && status != 303 && status != 307 && status != 308:
			obs.AgentEvent(ex.rt.idx, sl.ra.a.idx, phase, body, observe.OutcomeInvalid, wait)
			return ex.failure(i, phase, body, fmt.Errorf("%w: redirect status %d", errInvalidReply, status))
		case !validRedirect(d.RedirectURL):
			obs.AgentEvent(ex.rt.idx, sl.ra.a.idx, phase, body, observe.OutcomeInvalid, wait)
			return ex.failure(i, phase, body, fmt.Errorf("%w: redirect url is not an absolute http(s) URL or a /path", errInvalidReply))
		}
		obs.AgentEvent(ex.rt.idx, sl.ra.a.idx, phase, body, observe.OutcomeRedirect, wait)
		ex.applyOps(i, d)
		ex.redirect(i, d, status)
		return false
	}
	obs.AgentEvent(ex.rt.idx, sl.ra.a.idx, phase, body, observe.OutcomeInvalid, wait)
	return ex.failure(i, phase, body, fmt.Errorf("%w: decision kind %d", errInvalidReply, d.Kind))
}

// applyOps applies the header operations of agent i's decision (within
// its limits): request operations to the upstream request while it is not
// sent, response operations to the stash applied when the response is
// final.
func (ex *Exchange) applyOps(i int, d *protocol.Decision) {
	ex.applyReqOps(i, d.RequestHeaderOps)
	ex.stashRespOps(i, d.ResponseHeaderOps)
}

// failure applies agent i's failure policy to err. It reports whether the
// request goes on (fail-open); otherwise a 503/504 is staged, or the
// client is gone, or the response is to be aborted.
func (ex *Exchange) failure(i int, phase protocol.Phase, body bool, err error) bool {
	sl := &ex.slots[i]
	o := outcomeOf(err)
	if errors.Is(err, errInvalidReply) {
		o = observe.OutcomeInvalid
	}
	if o == observe.OutcomeCanceled || ex.canceled() {
		ex.outcome = "client gone"
		return false
	}
	if o != observe.OutcomeInvalid {
		// A reply that breaks the rules came from a live agent; only
		// timeouts, lost or refused connections and overload count.
		sl.ra.a.brk.failure(&ex.core.log, sl.ra.a.name, err)
	}
	if sl.ex != nil && o == observe.OutcomeInvalid {
		// The exchange is unusable; agentmux already canceled it when it
		// caught the error itself.
		sl.ex.Cancel("protocol_error")
	}
	ra := sl.ra
	if ok, suppressed := ra.a.logFail[o].Allow(); ok {
		var ev *zerolog.Event
		if ra.failOpen {
			ev = ex.core.log.Warn()
		} else {
			ev = ex.core.log.Error()
		}
		ev = ex.logFields(ev).Str("agent", ra.a.name).Str("phase", phaseName(phase, body)).
			Str("failure", o.String()).Bool("fail_open", ra.failOpen).Err(err)
		if suppressed > 0 {
			ev = ev.Uint64("suppressed", suppressed)
		}
		ev.Msg("agent failed")
	}
	if ra.failOpen {
		sl.flags |= flagFailed
		ex.dropActive(i)
		if ex.nFailed < maxAgents {
			ex.failedOpen[ex.nFailed] = uint8(i)
			ex.nFailed++
		}
		if !ex.reqSent {
			ex.hdr = append(ex.hdr, Field{Name: hdrFailOpen, Value: ra.a.nameB})
			ex.viewDirty = true
		}
		ex.core.stats.failOpen.Add(1)
		ex.core.obs.FailOpen(ex.rt.idx, ra.a.idx)
		return true
	}
	ex.core.stats.failClosed.Add(1)
	ex.failedClosed = i
	if ex.respStarted {
		ex.outcome = "agent " + ra.a.name + " failed mid-response"
		ex.abortResponse()
		return false
	}
	if o == observe.OutcomeTimeout {
		ex.local(504, "gateway timeout", "agent "+ra.a.name+" timed out")
	} else {
		ex.local(ra.failStatus, ra.failBody, "agent "+ra.a.name+" "+o.String())
	}
	return false
}

// dropActive removes agent i from the body pipelines.
func (ex *Exchange) dropActive(i int) {
	for p := range ex.active {
		ex.dropActiveIn(p, i)
	}
}

// dropActiveIn removes agent i from the body pipeline of phase p.
func (ex *Exchange) dropActiveIn(p, i int) {
	a := ex.active[p]
	for k, j := range a {
		if int(j) == i {
			ex.active[p] = append(a[:k], a[k+1:]...)
			return
		}
	}
}

// buildRequestView fills ex.rh from the upstream request as it stands
// (the view of agents without client_request; clientview.go has the
// other).
func (ex *Exchange) buildRequestView() {
	h := &ex.head
	m := &ex.rh
	hdrs := m.Headers[:0]
	names := ex.names[:0]
	// Agents see the Host the upstream will get.
	if len(ex.upHost) > 0 {
		hdrs = append(hdrs, protocol.Header{Name: nameHost, Value: ex.upHost})
	}
	var trace []byte
	for _, kv := range ex.hdr {
		start := len(names)
		names = lower(names, kv.Name)
		name := names[start:len(names):len(names)]
		if trace == nil && string(name) == "traceparent" {
			trace = kv.Value
		}
		hdrs = append(hdrs, protocol.Header{Name: name, Value: kv.Value})
	}
	if cl := h.ContentLengthValue; len(cl) > 0 && ex.hasReqBody {
		hdrs = append(hdrs, protocol.Header{Name: nameContentLength, Value: cl})
	}
	ex.names = names
	m.Headers = hdrs
	m.Method = h.Method
	m.URI = ex.fwdTarget() // a route's rewrite applied
	m.RequestTarget = nil
	m.HasBody = ex.hasReqBody
	md := &m.Metadata
	ex.commonMetadata(md)
	md.Traceparent = trace
	md.UpstreamHost, md.ForwardedFor, md.ForwardedProto, md.ForwardedHost = nil, nil, nil, nil
	ex.viewDirty = false
	ex.viewClient = false
}

// validRedirect accepts an absolute http(s) URL or a path starting with a
// single "/", free of control characters, spaces and backslashes. It
// guards every Location an agent sends: a redirect's URL, a block
// response's headers and response header operations.
func validRedirect(u []byte) bool {
	if len(u) == 0 || len(u) > 8192 {
		return false
	}
	for _, c := range u {
		if c <= ' ' || c == 0x7f {
			return false
		}
	}
	for _, c := range u {
		if c == '\\' {
			return false // browsers read a backslash as "/": "/\\evil.example" leaves the site
		}
	}
	if u[0] == '/' {
		// "//evil.example" is a network-path reference to another host.
		return len(u) == 1 || u[1] != '/'
	}
	rest := u
	switch {
	case len(u) > 7 && foldEq(u[:7], "http://"):
		rest = u[7:]
	case len(u) > 8 && foldEq(u[:8], "https://"):
		rest = u[8:]
	default:
		return false
	}
	return len(rest) > 0 && rest[0] != '/' && rest[0] != '?' && rest[0] != '#'
}
