package dataplane

import (
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/dataplane/internal/clock"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/protocol"
)

// errInvalidReply is an agent reply the protocol or the security rules
// do not allow (bad status, bad redirect URL, unknown decision kind).
var errInvalidReply = errors.New("invalid agent reply")

// outcomeOf maps an exchange error to its outcome.
func outcomeOf(err error) Outcome {
	switch {
	case errors.Is(err, agentmux.ErrAgentCanceled):
		return OutcomeCanceled
	case errors.Is(err, agentmux.ErrAgentTimeout):
		return OutcomeTimeout
	case errors.Is(err, agentmux.ErrAgentOverloaded):
		return OutcomeOverloaded
	case errors.Is(err, agentmux.ErrAgentConnLost):
		return OutcomeConnLost
	case errors.Is(err, agentmux.ErrAgentUnavailable):
		return OutcomeUnavailable
	}
	return OutcomeInvalid
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
func (rs *reqState) knownCaps(sl *slot) (protocol.Capabilities, bool) {
	if sl.flags&flagCaps != 0 {
		return sl.caps, true
	}
	c := sl.ra.a.agent.Capabilities()
	return c, c != (protocol.Capabilities{})
}

// begin opens agent i's exchange for this request if not yet open.
func (rs *reqState) begin(i int) error {
	sl := &rs.slots[i]
	if sl.ex != nil {
		return nil
	}
	t0 := clock.Mono()
	w, ok := rs.agentWait(sl, t0)
	if !ok {
		return errBudget(sl)
	}
	if !sl.ra.a.brk.allow() {
		return fmt.Errorf("%w: %s", ErrCircuitOpen, sl.ra.a.name)
	}
	ex, err := sl.ra.a.agent.Begin(w)
	d := clock.Mono() - t0
	sl.spent += d
	rs.agentTime[rs.phaseNow] += d
	if err != nil {
		return err
	}
	sl.ex = ex
	sl.caps = ex.Capabilities()
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
func (rs *reqState) requestHeaders() bool {
	rs.phaseNow = PhaseRequestHeaders
	if len(rs.rt.shadows) > 0 {
		rs.shadowRequest()
	}
	for i := 0; i < rs.nslots; i++ {
		if !rs.headerEvent(i, protocol.PhaseRequest) {
			return false
		}
	}
	return true
}

// headerEvent sends agent i the header event of phase p (opening its
// exchange first if needed) and applies the answer. It reports whether the
// request goes on.
func (rs *reqState) headerEvent(i int, p protocol.Phase) bool {
	sl := &rs.slots[i]
	if caps, known := rs.knownCaps(sl); known && !caps.Handles(p, false) {
		return true
	}
	fresh := sl.ex == nil
	if fresh && p == protocol.PhaseRequest && sl.ra.a.cache != nil {
		if done, goOn := rs.cacheLookup(i); done {
			return goOn
		}
	}
	if err := rs.begin(i); err != nil {
		rs.srv.obs.AgentEvent(rs.rt.idx, sl.ra.a.idx, p, false, outcomeOf(err), 0)
		return rs.failure(i, p, false, err)
	}
	if !sl.caps.Handles(p, false) {
		return true
	}
	req := p == protocol.PhaseRequest
	if req {
		// Chunk 0 of the body rides along for an agent with inline_body
		// (inline.go); its way to agent i may change the headers too.
		if !rs.inlineBefore(i) {
			return false
		}
		rs.requestView(sl.caps.SupportsClientRequest)
	} else {
		rs.applyStashed()
		rs.buildResponseView()
	}
	// The deadline is computed afresh for each call from what is left of
	// the budget (Begin's time is already in sl.spent). A fresh exchange
	// is not refused here: if Begin spent the budget, its deadline is past
	// and the event fails as timed out.
	t0 := clock.Mono()
	w, ok := rs.agentWait(sl, t0)
	if !fresh && !ok {
		rs.srv.obs.AgentEvent(rs.rt.idx, sl.ra.a.idx, p, false, OutcomeTimeout, 0)
		return rs.failure(i, p, false, errBudget(sl))
	}
	var reply *agentmux.Reply
	var err error
	if req {
		reply, err = sl.ex.RequestHeaders(w, &rs.rh)
		if err != nil && sl.ra.a.failover {
			reply, err = rs.failoverHeaders(i, w, err)
		}
	} else {
		reply, err = sl.ex.ResponseHeaders(w, &rs.rsh)
	}
	d := clock.Mono() - t0
	sl.spent += d
	if req {
		rs.agentTime[PhaseRequestHeaders] += d
		sl.flags |= flagReqHdrDone
	} else {
		rs.agentTime[PhaseResponseHeaders] += d
		sl.flags |= flagRespHdrDone
	}
	if err != nil {
		rs.srv.obs.AgentEvent(rs.rt.idx, sl.ra.a.idx, p, false, outcomeOf(err), d)
		return rs.failure(i, p, false, err)
	}
	sl.ra.a.brk.success(&rs.srv.log, sl.ra.a.name)
	if req && sl.ra.a.cache != nil {
		rs.cacheStore(i, &reply.Decision)
	}
	if !rs.decide(i, p, false, &reply.Decision, d) {
		return false
	}
	if req {
		if rs.rh.HasInlineBody {
			rs.inlineAfter(i, &reply.Decision)
		}
		rs.finishEarly(i)
	}
	return true
}

// finishEarly releases agent i's slot on the agent as soon as nothing is
// left for it in this request, so a busy agent's in-flight limit is not
// held through the upstream round trip.
func (rs *reqState) finishEarly(i int) {
	sl := &rs.slots[i]
	if sl.ex == nil {
		return
	}
	c := sl.caps
	if c.HandlesRequestBody && rs.hasReqBody && sl.mode[0] != bodyNone && sl.flags&flagReqBodyDone == 0 {
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
func (rs *reqState) finishIdle(p protocol.Phase) {
	for i := 0; i < rs.nslots; i++ {
		sl := &rs.slots[i]
		if sl.ex == nil || rs.inActive(p, i) {
			continue
		}
		if p == protocol.PhaseRequest && sl.flags&flagFailed == 0 && (sl.caps.HandlesResponseHeaders || sl.caps.HandlesResponseBody) {
			continue
		}
		rs.endSlot(i, false)
	}
}

func (rs *reqState) inActive(p protocol.Phase, i int) bool {
	for _, j := range rs.active[p] {
		if int(j) == i {
			return true
		}
	}
	return false
}

// responseHeaders copies the upstream response's head to the client
// response and runs the response-header phase of the chain.
func (rs *reqState) responseHeaders() bool {
	ctx := rs.ctx
	h := &ctx.Response.Header
	rs.respSeen = true
	rs.respHasBody = rs.upResp.BodyStream() != nil && !ctx.Request.Header.IsHead() && rs.upResp.Header.ContentLength() != 0
	rs.upClose = rs.upResp.Header.ConnectionClose()
	rs.upResp.Header.CopyTo(h)
	rs.scratch = stripResponse(h, rs.scratch)
	h.SetNoDefaultContentType(true)
	if len(rs.shadowConvs) > 0 {
		rs.shadowResponse()
	}
	rs.respOpsApplied = 0
	rs.phaseNow = PhaseResponseHeaders
	for i := 0; i < rs.nslots; i++ {
		if rs.slots[i].flags&flagFailed != 0 {
			continue
		}
		if !rs.headerEvent(i, protocol.PhaseResponse) {
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
func (rs *reqState) decide(i int, phase protocol.Phase, body bool, d *protocol.Decision, wait time.Duration) bool {
	sl := &rs.slots[i]
	obs := rs.srv.obs
	switch d.Kind {
	case protocol.DecisionAllow, protocol.DecisionNeedsMore, protocol.DecisionBlock, protocol.DecisionRedirect:
		if err := rs.checkLimits(i, d); err != nil {
			rs.srv.stats.limits.Add(1)
			obs.AgentEvent(rs.rt.idx, sl.ra.a.idx, phase, body, OutcomeInvalid, wait)
			return rs.failure(i, phase, body, err)
		}
	}
	switch d.Kind {
	case protocol.DecisionAllow, protocol.DecisionNeedsMore:
		rs.applyOps(i, d)
		o := OutcomeAllow
		if !d.Final() {
			// needs_more at a header event is an allow for now: an agent
			// that handles the body gets its chunks either way.
			o = OutcomeContinue
		}
		obs.AgentEvent(rs.rt.idx, sl.ra.a.idx, phase, body, o, wait)
		return true
	case protocol.DecisionBlock:
		status := d.Status
		if status < 200 || status > 599 {
			// 1xx cannot be a final response; the contract's 100–599 is
			// narrowed so a block always ends the exchange cleanly.
			obs.AgentEvent(rs.rt.idx, sl.ra.a.idx, phase, body, OutcomeInvalid, wait)
			return rs.failure(i, phase, body, fmt.Errorf("%w: block status %d", errInvalidReply, status))
		}
		obs.AgentEvent(rs.rt.idx, sl.ra.a.idx, phase, body, OutcomeBlock, wait)
		rs.applyOps(i, d)
		rs.block(i, d, status)
		return false
	case protocol.DecisionRedirect:
		status := d.Status
		switch {
		case status != 301 && status != 302 && status != 303 && status != 307 && status != 308:
			obs.AgentEvent(rs.rt.idx, sl.ra.a.idx, phase, body, OutcomeInvalid, wait)
			return rs.failure(i, phase, body, fmt.Errorf("%w: redirect status %d", errInvalidReply, status))
		case !validRedirect(d.RedirectURL):
			obs.AgentEvent(rs.rt.idx, sl.ra.a.idx, phase, body, OutcomeInvalid, wait)
			return rs.failure(i, phase, body, fmt.Errorf("%w: redirect url is not an absolute http(s) URL or a /path", errInvalidReply))
		}
		obs.AgentEvent(rs.rt.idx, sl.ra.a.idx, phase, body, OutcomeRedirect, wait)
		rs.applyOps(i, d)
		rs.redirect(i, d, status)
		return false
	}
	obs.AgentEvent(rs.rt.idx, sl.ra.a.idx, phase, body, OutcomeInvalid, wait)
	return rs.failure(i, phase, body, fmt.Errorf("%w: decision kind %d", errInvalidReply, d.Kind))
}

// applyOps applies the header operations of agent i's decision (within
// its limits): request operations to the upstream request while it is not
// sent, response operations to the stash applied when the response is
// final.
func (rs *reqState) applyOps(i int, d *protocol.Decision) {
	rs.applyReqOps(i, d.RequestHeaderOps)
	rs.stashRespOps(i, d.ResponseHeaderOps)
}

// block stages agent i's block response. A block once the response has
// started streaming can only cut the response off.
func (rs *reqState) block(i int, d *protocol.Decision, status int) {
	rs.srv.stats.blocked.Add(1)
	rs.decider = i
	rs.redirected = false
	rs.outcome = "blocked by " + rs.slots[i].ra.a.name
	if rs.respStarted {
		rs.abortResponse()
		return
	}
	resp := &rs.ctx.Response
	resp.Reset()
	resp.Header.SetNoDefaultContentType(true)
	resp.SetStatusCode(status)
	hasType := false
	var ref refusals
	for k := range d.BlockHeaders {
		bh := &d.BlockHeaders[k]
		// The same rules as every agent header operation, Location's
		// included: a block cannot send what a redirect may not.
		if rs.refuseOp(&ref, protocol.HeaderAdd, bh.Name, bh.Value) {
			continue
		}
		if string(rs.scratch) == "content-type" {
			hasType = true
		}
		resp.Header.AddBytesKV(bh.Name, bh.Value)
	}
	rs.reportRefused(i, &ref)
	if !hasType && len(d.Body) > 0 {
		resp.Header.SetContentTypeBytes(valueTextPlain)
	}
	resp.SetBody(d.Body)
	rs.respOpsApplied = 0
	rs.finishResponseHeaders()
	rs.answered = true
	rs.status = status
}

// redirect stages agent i's redirect.
func (rs *reqState) redirect(i int, d *protocol.Decision, status int) {
	rs.srv.stats.blocked.Add(1)
	rs.decider = i
	rs.redirected = true
	rs.outcome = "redirected by " + rs.slots[i].ra.a.name
	if rs.respStarted {
		rs.abortResponse()
		return
	}
	resp := &rs.ctx.Response
	resp.Reset()
	resp.Header.SetNoDefaultContentType(true)
	resp.SetStatusCode(status)
	resp.Header.SetBytesKV(hdrLocation, d.RedirectURL)
	rs.respOpsApplied = 0
	rs.finishResponseHeaders()
	rs.answered = true
	rs.status = status
}

// failure applies agent i's failure policy to err. It reports whether the
// request goes on (fail-open); otherwise a 503/504 is staged, or the
// client is gone, or the response is to be aborted.
func (rs *reqState) failure(i int, phase protocol.Phase, body bool, err error) bool {
	sl := &rs.slots[i]
	o := outcomeOf(err)
	if errors.Is(err, errInvalidReply) {
		o = OutcomeInvalid
	}
	if o == OutcomeCanceled || rs.canceled() {
		rs.outcome = "client gone"
		return false
	}
	if o != OutcomeInvalid {
		// A reply that breaks the rules came from a live agent; only
		// timeouts, lost or refused connections and overload count.
		sl.ra.a.brk.failure(&rs.srv.log, sl.ra.a.name, err)
	}
	if sl.ex != nil && o == OutcomeInvalid {
		// The exchange is unusable; agentmux already canceled it when it
		// caught the error itself.
		sl.ex.Cancel("protocol_error")
	}
	ra := sl.ra
	if ok, suppressed := ra.a.logFail[o].Allow(); ok {
		var ev *zerolog.Event
		if ra.failOpen {
			ev = rs.srv.log.Warn()
		} else {
			ev = rs.srv.log.Error()
		}
		ev = rs.logFields(ev).Str("agent", ra.a.name).Str("phase", phaseName(phase, body)).
			Str("failure", o.String()).Bool("fail_open", ra.failOpen).Err(err)
		if suppressed > 0 {
			ev = ev.Uint64("suppressed", suppressed)
		}
		ev.Msg("agent failed")
	}
	if ra.failOpen {
		sl.flags |= flagFailed
		rs.dropActive(i)
		if rs.nFailed < maxAgents {
			rs.failedOpen[rs.nFailed] = uint8(i)
			rs.nFailed++
		}
		if !rs.reqSent {
			rs.hdr = append(rs.hdr, hkv{name: hdrFailOpen, value: ra.a.nameB})
			rs.viewDirty = true
		}
		rs.srv.stats.failOpen.Add(1)
		rs.srv.obs.FailOpen(rs.rt.idx, ra.a.idx)
		return true
	}
	rs.srv.stats.failClosed.Add(1)
	rs.failedClosed = i
	if rs.respStarted {
		rs.outcome = "agent " + ra.a.name + " failed mid-response"
		rs.abortResponse()
		return false
	}
	if o == OutcomeTimeout {
		rs.local(fasthttp.StatusGatewayTimeout, "gateway timeout", "agent "+ra.a.name+" timed out")
	} else {
		rs.local(ra.failStatus, ra.failBody, "agent "+ra.a.name+" "+o.String())
	}
	return false
}

// dropActive removes agent i from the body pipelines.
func (rs *reqState) dropActive(i int) {
	for p := range rs.active {
		rs.dropActiveIn(p, i)
	}
}

// dropActiveIn removes agent i from the body pipeline of phase p.
func (rs *reqState) dropActiveIn(p, i int) {
	a := rs.active[p]
	for k, j := range a {
		if int(j) == i {
			rs.active[p] = append(a[:k], a[k+1:]...)
			return
		}
	}
}

// abortResponse marks a response that must be cut off: its headers are
// already on their way, so the connection is closed mid-body.
func (rs *reqState) abortResponse() {
	rs.respAbort = true
	rs.srv.stats.aborted.Add(1)
}

// buildRequestView fills rs.rh from the upstream request as it stands
// (the view of agents without client_request; clientview.go has the
// other).
func (rs *reqState) buildRequestView() {
	h := &rs.ctx.Request.Header
	m := &rs.rh
	hdrs := m.Headers[:0]
	names := rs.names[:0]
	// Agents see the Host the upstream will get.
	if len(rs.upHost) > 0 {
		hdrs = append(hdrs, protocol.Header{Name: nameHost, Value: rs.upHost})
	}
	var trace []byte
	for _, kv := range rs.hdr {
		start := len(names)
		names = lower(names, kv.name)
		name := names[start:len(names):len(names)]
		if trace == nil && string(name) == "traceparent" {
			trace = kv.value
		}
		hdrs = append(hdrs, protocol.Header{Name: name, Value: kv.value})
	}
	if cl := h.PeekBytes(hdrContentLength); len(cl) > 0 && rs.hasReqBody {
		hdrs = append(hdrs, protocol.Header{Name: nameContentLength, Value: cl})
	}
	rs.names = names
	m.Headers = hdrs
	m.Method = h.Method()
	m.URI = h.RequestURI()
	m.RequestTarget = nil
	m.HasBody = rs.hasReqBody
	md := &m.Metadata
	rs.commonMetadata(md)
	md.Traceparent = trace
	md.UpstreamHost, md.ForwardedFor, md.ForwardedProto, md.ForwardedHost = nil, nil, nil, nil
	rs.viewDirty = false
	rs.viewClient = false
}

// buildResponseView fills rs.rsh from the client response as it stands.
func (rs *reqState) buildResponseView() {
	resp := &rs.ctx.Response
	m := &rs.rsh
	hdrs := m.Headers[:0]
	names := rs.names[:0]
	for k, v := range resp.Header.All() {
		start := len(names)
		names = lower(names, k)
		hdrs = append(hdrs, protocol.Header{Name: names[start:len(names):len(names)], Value: v})
	}
	rs.names = names
	m.Headers = hdrs
	m.StatusCode = resp.StatusCode()
	m.HasBody = rs.respHasBody
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
