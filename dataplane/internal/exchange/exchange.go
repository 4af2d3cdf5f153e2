package exchange

import (
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/observe"
	"github.com/zentinelproxy/sidecar/protocol"
)

// maxAgents bounds the agents of one route (the per-request state keeps
// them in a fixed array).
const maxAgents = 16

// Slot flags: what an agent still has a say in for this request.
const (
	flagFailed       uint16 = 1 << iota // failed open: skipped from here on
	flagReqHdrDone                      // request headers answered
	flagRespHdrDone                     // response headers answered
	flagReqBodyDone                     // final decision on the request body
	flagRespBodyDone                    // final decision on the response body
	flagReqSkip                         // the request body went past its limit
	flagRespSkip                        // the response body went past its limit
	flagCaps                            // caps holds the capabilities of this request's exchange
)

// slot is one route agent's part in one request.
type slot struct {
	ra    *routeAgent
	ex    *agentmux.Exchange
	caps  protocol.Capabilities
	flags uint16
	spent time.Duration
	chunk [2]uint32 // next chunk index per phase
	mode  [2]uint8  // body mode per phase, auto resolved
}

// Exchange is one request's way through the sidecar: its head, the
// agents' conversation about it, the upstream's answer and the response
// staged for the client. A front end embeds one in its per-request state
// (pooled with it, so that a request allocates nothing in the common
// case) and drives it: Core.Begin, the Head filled, Serve (or Refuse),
// the Response written out, the streamed body pulled (NextBody,
// StreamDone), Finish.
//
// Its state is kept in sub-states, each reset whole when the request
// ends (a zero value that keeps only its reusable buffers, trimmed):
// nothing of a request outlives it by a forgotten field.
type Exchange struct {
	core  *Core
	tbl   *Table
	rt    *route
	front Front
	conn  *Conn
	lst   *Listener
	id    uint64
	start time.Time

	// head is the request as the front end received it.
	head Head

	cancelState // cancel.go: the client's going away
	reqFacts    // request.go: what the head says, normalised
	fwdHeaders  // request.go, clientview.go: the header lists agents and the upstream see
	agentSlots  // agents.go: the route's agents
	messages    // agents.go: the events they are shown
	chainState  // agents.go: what their answers did
	respState   // response.go: the response staged for the client
	bodyState   // body.go: both bodies
	upState     // forward.go: the upstream's response in use
	outcomes    // this file: how the request ended

	rs          routeState    // routing.go: the route's actions
	inl         inlineState   // inline.go
	trace       traceState    // trace.go
	shadowConvs []*shadowConv // shadow.go
	sum         observe.RequestSummary
}

// outcomes are the facts the request's summary and log line are made of.
type outcomes struct {
	status   int    // the status the sidecar staged itself (0: the upstream's)
	outcome  string // short reason for the request log line
	upFailed bool
	rejected bool // the sidecar answered by itself
}

// reqIDs numbers requests for logs; correlation ids add a per-process
// random prefix so they stay unique across restarts.
var (
	reqIDs     atomic.Uint64
	corrPrefix = rand.Uint64()
)

// Init prepares a new Exchange for front, its front end; once, before
// the first Begin.
func (ex *Exchange) Init(front Front) {
	ex.front = front
	ex.cancelCh = make(chan struct{})
	ex.decider, ex.failedClosed = -1, -1
}

// Head is the request head, for the front end to fill.
func (ex *Exchange) Head() *Head { return &ex.head }

// ID numbers the request within the process.
func (ex *Exchange) ID() uint64 { return ex.id }

// Correlation is the request's correlation id (valid until Finish).
func (ex *Exchange) Correlation() []byte { return ex.corr }

// release resets every sub-state for the next request.
func (ex *Exchange) release() {
	ex.agentSlots.reset()
	ex.messages.reset()
	ex.reqFacts.reset()
	ex.fwdHeaders.reset()
	ex.chainState.reset()
	ex.respState.reset()
	ex.bodyState.reset()
	ex.upState = upState{}
	ex.outcomes = outcomes{}
	ex.inl = inlineState{}
	ex.rs.reset()
	ex.trace = traceState{}
	ex.head = Head{Fields: ex.head.Fields[:0]}
	ex.tbl, ex.rt, ex.conn, ex.lst = nil, nil, nil, nil
}

// trimList empties a header list, dropping its storage when it grew past
// max entries; the entries are cleared so the pool pins no request's
// header block.
func trimList(l []Field, max int) []Field {
	if cap(l) > max {
		return nil
	}
	clear(l)
	return l[:0]
}

// trim empties b, dropping its storage when it grew past max so one huge
// request does not pin memory in the pool.
func trim(b []byte, max int) []byte {
	if cap(b) > max {
		return nil
	}
	return b[:0]
}

// Refuse answers a head the front end refused (its target or its
// framing): 400, connection closed, counted under reason
// (observe.RejectReasons).
func (ex *Exchange) Refuse(reason int, outcome string) {
	ex.hostFull = ex.head.Host
	ex.correlation()
	ex.refuseHead(reason, outcome)
}

// Serve runs the request up to its response: the head normalised, the
// route, the agents, the upstream. A Response is staged when it
// returns (or the client is gone, or the connection was handed to a
// tunnel).
func (ex *Exchange) Serve() {
	ex.hostFull = ex.head.Host
	ex.correlation()
	h := &ex.head
	cl := h.ContentLength
	ex.hasReqBody = cl > 0 || cl == -1
	// The head is normalised before anything looks at it: the route, the
	// agents and the upstream see the same method, host and target.
	if !ex.prepareRequest() || !ex.prepareUpgrade() {
		return
	}
	// ex.host is the canonical host (prepareRequest); the Host header
	// carries the same, with the client's port.
	if ex.tbl.lstLimits != nil {
		if rl := ex.tbl.lstLimits[string(ex.lst.Name)]; rl != nil && ex.rateLimited(rl) {
			return
		}
	}
	rt := ex.tbl.match(ex, ex.host, h.Path)
	if rt == nil {
		ex.local(404, "no route", "no route")
		return
	}
	if string(h.Method) == "CONNECT" {
		// A reverse proxy does not open tunnels.
		ex.local(405, "method not allowed", "CONNECT refused")
		return
	}
	ex.rt = rt
	x := &rt.ext
	if x.limit != nil && !x.limit.after && ex.rateLimited(x.limit) {
		return
	}
	if x.global != nil && !x.global.after && ex.globalLimited(x.global) {
		return
	}
	switch {
	case x.direct != nil:
		ex.directResponse()
		return
	case x.redirect != nil:
		ex.redirectResponse()
		return
	}
	if x.retry != nil {
		x.retry.active.Add(1)
		ex.rs.budgeted = true
	}
	ex.upHost = rt.upstreamHost(ex.hostFull)
	ex.rewrite()
	if len(x.reqOps) > 0 {
		ex.applyRouteReqOps()
	}
	ex.nslots = len(rt.agents)
	for i := range rt.agents {
		ex.slots[i].ra = &rt.agents[i]
	}
	if max := ex.lst.MaxRequestBody; max > 0 && cl > max {
		ex.local(413, "request body too large", "body over max_request_body")
		return
	}
	if !ex.bufferAhead() || !ex.requestHeaders() {
		return
	}
	if x.limit != nil && x.limit.after && ex.rateLimited(x.limit) {
		return
	}
	if x.global != nil && x.global.after && ex.globalLimited(x.global) {
		return
	}
	if !ex.requestBody() || !ex.forward() {
		return
	}
	if ex.upgrade || ex.res.Head().Status == 101 {
		if !ex.upgraded() {
			return
		}
	}
	if !ex.responseHeaders() {
		return
	}
	ex.responseBody()
}

// CloseAfter reports whether the client connection is to be closed after
// the response: asked for, a refused head, or unread body bytes that
// would be parsed as the next request. The client may still be sending:
// a front end closes it lingeringly.
func (ex *Exchange) CloseAfter() bool {
	return ex.closeConn || (ex.hasReqBody && !ex.reqBodyEOF)
}

// Finish ends the request: upstream connection, agent exchanges, log,
// metrics. The Exchange may be reused after it.
func (ex *Exchange) Finish() {
	c := ex.core
	ex.releaseUpstream()
	gone := ex.canceled()
	for i := 0; i < ex.nslots; i++ {
		ex.endSlot(i, gone)
	}
	if len(ex.shadowConvs) > 0 {
		ex.endShadows()
	}
	if gone {
		c.stats.clientGone.Add(1)
	}
	if c.watch != nil {
		c.watch.remove(ex)
	}
	route := -1
	if ex.rt != nil {
		route = ex.rt.idx
	}
	status := ex.status
	if status == 0 && !gone {
		if status = ex.resp.Status; status == 0 {
			status = 200 // what an HTTP engine answers when nothing else was said
		}
	}
	d := time.Since(ex.start)
	c.obs.Request(route, status, d)
	if c.rec != nil {
		c.rec.RecordRequest(ex.summarize(route, status, d, gone))
	}
	if e := c.log.Debug(); e != nil {
		ex.logFields(e).Int("status", status).Dur("duration", d)
		if ex.outcome != "" {
			e.Str("outcome", ex.outcome)
		}
		e.Msg("request")
	}
	if ex.trace.sampled {
		c.spans.record(ex, route, status, d)
	}
	c.stats.inflight.Add(-1)
	if ex.rs.budgeted {
		ex.rt.ext.retry.active.Add(-1)
	}
	t := ex.tbl
	ex.release()
	t.release()
}

// Abandon releases what a panicked request holds on the agents, the
// upstream and the table, as far as it safely can. The Exchange must not
// be reused.
func (ex *Exchange) Abandon() {
	c := ex.core
	if c.watch != nil {
		c.watch.remove(ex)
	}
	func() {
		defer func() { _ = recover() }()
		ex.cancel()
		for i := 0; i < ex.nslots; i++ {
			if ae := ex.slots[i].ex; ae != nil {
				ex.slots[i].ex = nil
				ae.Cancel(reasonDecided)
				ae.Finish()
			}
		}
		ex.releaseUpstream()
	}()
	c.stats.inflight.Add(-1)
	if ex.rs.budgeted {
		ex.rt.ext.retry.active.Add(-1)
	}
	ex.tbl.release()
}

// summarize fills the request's summary for a RequestRecorder.
func (ex *Exchange) summarize(route, status int, d time.Duration, gone bool) *observe.RequestSummary {
	sm := &ex.sum
	*sm = observe.RequestSummary{
		ID:                ex.id,
		Correlation:       ex.corr,
		Route:             route,
		ClientIP:          ex.conn.ClientIP,
		Status:            status,
		Agent:             -1,
		Reason:            ex.outcome,
		Start:             ex.start,
		Duration:          d,
		AgentTime:         ex.agentTime,
		BytesIn:           ex.reqSrc.n,
		Inspected:         ex.inspected,
		Mutated:           ex.mutated,
		FailedOpen:        ex.nFailed,
		InspectionSkipped: ex.skipped[0] || ex.skipped[1],
		Aborted:           ex.respAbort,
		Method:            ex.head.Method,
		Host:              ex.hostFull,
		Path:              ex.head.Path,
		Protocol:          ex.head.Proto,
	}
	if ex.rt != nil {
		sm.RouteName = ex.rt.name
	}
	if ex.streaming {
		sm.BytesOut = ex.written
	} else if !gone {
		sm.BytesOut = int64(len(ex.resp.Body))
	}
	agent := -1
	switch {
	case ex.decider >= 0:
		sm.Outcome, agent = observe.RequestBlocked, ex.decider
		if ex.redirected {
			sm.Outcome = observe.RequestRedirected
		}
	case gone:
		sm.Outcome = observe.RequestClientGone
	case ex.failedClosed >= 0:
		sm.Outcome, agent = observe.RequestFailedClosed, ex.failedClosed
	case ex.upFailed:
		sm.Outcome = observe.RequestUpstreamError
	case ex.nFailed > 0:
		sm.Outcome = observe.RequestFailedOpen
	case ex.rejected:
		sm.Outcome = observe.RequestRejected
	default:
		sm.Outcome = observe.RequestAllowed
	}
	if agent >= 0 {
		sm.Agent = ex.slots[agent].ra.a.idx
		sm.AgentName = ex.slots[agent].ra.a.name
	}
	return sm
}

// endSlot finishes agent i's exchange: CancelRequest first when it still
// expected events (a decision elsewhere, an error, a vanished client).
func (ex *Exchange) endSlot(i int, gone bool) {
	sl := &ex.slots[i]
	if sl.ex == nil {
		return
	}
	if gone {
		sl.ex.Cancel(reasonClientGone)
	} else if i != ex.decider && ex.pending(sl) {
		sl.ex.Cancel(reasonDecided)
	}
	sl.ex.Finish()
	sl.ex = nil
}

// Reasons sent in CancelRequest.
const (
	reasonDecided    = "decided"
	reasonClientGone = "client_disconnect"
)

// pending reports whether the agent still expected events it did not get.
func (ex *Exchange) pending(sl *slot) bool {
	if sl.flags&flagFailed != 0 {
		return false
	}
	c, f := sl.caps, sl.flags
	switch {
	case c.HandlesRequestHeaders && f&flagReqHdrDone == 0:
		return true
	case c.HandlesRequestBody && ex.hasReqBody && sl.mode[0] != bodyNone && f&(flagReqBodyDone|flagReqSkip) == 0:
		return true
	case c.HandlesResponseHeaders && f&flagRespHdrDone == 0:
		return true
	case c.HandlesResponseBody && sl.mode[1] != bodyNone && f&(flagRespBodyDone|flagRespSkip) == 0 && (!ex.respSeen || ex.respHasBody):
		return true
	}
	return false
}

// correlation picks the correlation id: the client's X-Request-Id or
// X-Correlation-Id when sane, else a fresh one.
func (ex *Exchange) correlation() {
	for _, name := range [2][]byte{hdrXRequestID, hdrXCorrelationID} {
		if v := ex.headField(name); saneID(v) {
			ex.corrStore = append(ex.corrStore[:0], v...)
			ex.corr = ex.corrStore
			return
		}
	}
	var raw [16]byte
	binary.BigEndian.PutUint64(raw[:8], corrPrefix)
	binary.BigEndian.PutUint64(raw[8:], ex.id)
	hex.Encode(ex.corrBuf[:], raw[:])
	ex.corr = ex.corrBuf[:]
	ex.corrGen = true
}

// headField is the value of the first header field called name in the
// request head (nil: none).
func (ex *Exchange) headField(name []byte) []byte {
	for _, f := range ex.head.Fields {
		if eqFold(f.Name, name) {
			return f.Value
		}
	}
	return nil
}

func saneID(v []byte) bool {
	if len(v) == 0 || len(v) > 128 {
		return false
	}
	for _, c := range v {
		if c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}

// logFields adds the request's identity to a log event.
func (ex *Exchange) logFields(e *zerolog.Event) *zerolog.Event {
	if e == nil {
		return nil
	}
	e = e.Uint64("req", ex.id).Bytes("corr", ex.corr)
	if ex.rt != nil {
		e = e.Str("route", ex.rt.name)
	}
	return e.Bytes("method", ex.head.Method).Bytes("path", clip(ex.head.Path, 256))
}

func clip(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

type stampCache struct {
	sec int64
	b   []byte
}

var stamp atomic.Pointer[stampCache]

// timestamp is t in RFC 3339 (UTC, seconds), formatted once per second.
func timestamp(t time.Time) []byte {
	sec := t.Unix()
	if c := stamp.Load(); c != nil && c.sec == sec {
		return c.b
	}
	c := &stampCache{sec: sec, b: t.UTC().AppendFormat(nil, time.RFC3339)}
	stamp.Store(c)
	return c.b
}
