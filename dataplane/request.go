package dataplane

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/dataplane/internal/upstream"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
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

// stashedOp is a response header operation decided before the response
// exists; name and value live in reqState.opArena.
type stashedOp struct {
	op               protocol.HeaderOpKind
	slot             uint8
	nameOff, nameLen uint32
	valOff, valLen   uint32
}

// Request body modes toward the upstream.
const (
	reqBodyNone uint8 = iota // no body
	reqBodyRaw               // the buffered (possibly rewritten) body in reqOut
	reqBodyPass              // the client's body unchanged, original framing
	reqBodyPipe              // through streaming agents, chunked
)

// reqState is everything one request needs, pooled so that a request
// allocates nothing in the common case.
type reqState struct {
	srv   *Server
	tbl   *table
	rt    *route
	ctx   *fasthttp.RequestCtx
	id    uint64
	conn  net.Conn
	start time.Time
	lst   *listener

	// Cancellation (ctx.go). mu guards what the watcher touches.
	mu        sync.Mutex
	cancelCh  chan struct{} // closed by cancel; replaced for the next request once closed
	cancelErr error
	upNet     net.Conn // the upstream connection in use (aborted by cancel)
	upAborted bool

	// Watcher list (guarded by the shard lock).
	wprev, wnext *reqState
	gone         bool

	// Agents.
	slots          [maxAgents]slot
	nslots         int
	rh             protocol.RequestHeaders
	rsh            protocol.ResponseHeaders
	chunk          protocol.BodyChunk
	viewDirty      bool
	respOps        []stashedOp
	respOpsApplied int // respOps already applied to the client response
	respStashed    int // header block bytes the stashed operations add
	opArena        []byte
	hidx           hdrIndex // scratch for large batches of header operations
	respList       []hkv    // scratch: response headers of a large batch
	respArena      []byte
	statusMsg      []byte
	failedOpen     [maxAgents]uint8
	nFailed        int
	skipped        [2]bool // inspection skipped per phase

	// Request facts.
	host        []byte // canonical (canonHost), no port
	corr        []byte
	corrGen     bool
	clientIP    []byte
	clientPort  int
	hasReqBody  bool
	reqBodyEOF  bool
	reqSent     bool // upstream request headers written
	respStarted bool // client response headers handed to fasthttp
	answered    bool // a local response (block, redirect, error) is staged
	respSeen    bool // the upstream response head was read
	respHasBody bool // the upstream response has a body to relay
	respAbort   bool // cut the response off (headers already sent)
	closeConn   bool // close the client connection after the response
	clientCL    bool // the client sent a Content-Length header
	status      int
	decider     int    // the agent whose block or redirect ended the request, or -1
	outcome     string // short reason for the request log line

	// Summary facts (summary.go).
	redirected   bool // the decider redirected
	failedClosed int  // the agent whose fail-closed failure ended the request, or -1
	upFailed     bool
	rejected     bool // the sidecar answered by itself
	phaseNow     int
	agentTime    [NumPhases]time.Duration
	inspected    [2]int64
	mutated      [2]int64
	sum          RequestSummary

	// Bodies.
	reqMode   uint8
	reqSrc    bodySource
	respSrc   bodySource
	reqOut    []byte
	respOut   []byte
	inReq     []byte // buffered request body as read
	inResp    []byte // buffered response body as read
	buf       []byte
	mut       []byte
	active    [2][]uint8
	total     [2]int64
	respBody  respStream
	streaming bool
	inl       inlineState // chunk 0 inline in RequestHeaders (inline.go)

	// The request's conversations with shadow agents (shadow.go).
	shadowConvs []*shadowConv

	// Upstream.
	upCC       any                // *fasthttp.clientConn; its type is unexported
	upEP       *upstream.Endpoint // the endpoint of upCC (endpoints.go)
	upWrap     eofConn
	upSent     sentConn // the request's writes to the upstream (upstream.go)
	upBR       *bufio.Reader
	upResp     fasthttp.Response
	upClose    bool
	upBodyDone bool

	// Trace context (trace.go).
	trace traceState

	// Upstream request headers (reqheaders.go).
	hdr       []hkv
	hdrArena  []byte
	xffBuf    []byte
	upHost    []byte
	upChunked bool
	upgrade   bool // an Upgrade request to tunnel on a 101 (upgrade.go)

	// The client's view of the request (clientview.go).
	viewClient bool       // rs.rh holds the client's view
	chdr       []hkv      // the client's header list, the operations applied
	chdrBuilt  bool       // chdr was built for this request
	chdrOps    int        // opLog entries applied to chdr
	opLog      []loggedOp // the agents' applied request header operations
	rawTarget  []byte     // the client's target when not origin-form
	fwdBuf     []byte     // joined X-Forwarded-* values
	srvDone    bool       // srvIP, srvPort and lstName are set
	srvIP      []byte     // the connection's local address (text)
	srvPort    int
	srvBuf     [64]byte
	lstName    []byte

	// Scratch storage.
	names     []byte
	scratch   []byte
	ipBuf     [64]byte
	hostBuf   []byte
	targetBuf []byte
	corrBuf   [32]byte
	corrStore []byte
}

var reqPool = sync.Pool{New: func() any { return newReqState() }}

func newReqState() *reqState {
	rs := &reqState{cancelCh: make(chan struct{})}
	rs.respBody.rs = rs
	return rs
}

// reqIDs numbers requests for logs; correlation ids add a per-process
// random prefix so they stay unique across restarts.
var (
	reqIDs     atomic.Uint64
	corrPrefix = rand.Uint64()
)

func acquireReqState(s *Server, t *table, ctx *fasthttp.RequestCtx, l *listener) *reqState {
	rs := reqPool.Get().(*reqState)
	rs.srv, rs.tbl, rs.ctx, rs.lst = s, t, ctx, l
	rs.id = reqIDs.Add(1)
	rs.conn = ctx.Conn()
	rs.start = ctx.Time()
	if rs.start.IsZero() {
		rs.start = time.Now()
	}
	rs.resetCancel()
	rs.gone = false
	rs.decider = -1
	rs.failedClosed = -1
	return rs
}

// release returns rs to the pool; every per-request field is reset here
// so the next request starts clean.
func (rs *reqState) release() {
	for i := 0; i < rs.nslots; i++ {
		rs.slots[i] = slot{}
	}
	rs.nslots = 0
	rs.rh.Reset()
	rs.rsh.Reset()
	rs.chunk.Reset()
	rs.viewDirty = false
	rs.respOps = rs.respOps[:0]
	rs.respOpsApplied = 0
	rs.respStashed = 0
	rs.opArena = trim(rs.opArena, 64<<10)
	rs.respArena = trim(rs.respArena, 64<<10)
	if cap(rs.respList) > 4096 {
		rs.respList = nil
	}
	if cap(rs.hidx.slots) > 1<<14 {
		rs.hidx = hdrIndex{}
	}
	rs.nFailed = 0
	rs.skipped = [2]bool{}
	rs.host, rs.corr, rs.clientIP = nil, nil, nil
	rs.corrGen = false
	rs.clientPort = 0
	rs.hasReqBody, rs.reqBodyEOF, rs.reqSent, rs.respStarted, rs.answered = false, false, false, false, false
	rs.respSeen, rs.respHasBody, rs.respAbort, rs.closeConn, rs.clientCL = false, false, false, false, false
	rs.status = 0
	rs.outcome = ""
	rs.redirected, rs.upFailed, rs.rejected = false, false, false
	rs.phaseNow = 0
	rs.agentTime = [NumPhases]time.Duration{}
	rs.inspected, rs.mutated = [2]int64{}, [2]int64{}
	rs.reqMode = reqBodyNone
	rs.reqSrc = bodySource{}
	rs.respSrc = bodySource{}
	rs.reqOut = trim(rs.reqOut, 1<<20)
	rs.respOut = trim(rs.respOut, 1<<20)
	rs.inReq = trim(rs.inReq, 1<<20)
	rs.inResp = trim(rs.inResp, 1<<20)
	rs.buf = trim(rs.buf, 256<<10)
	rs.respBody.reset()
	rs.inl = inlineState{}
	rs.mut = trim(rs.mut, 1<<20)
	rs.active[0], rs.active[1] = rs.active[0][:0], rs.active[1][:0]
	rs.total = [2]int64{}
	rs.streaming = false
	rs.upCC, rs.upBR, rs.upEP = nil, nil, nil
	rs.trace = traceState{}
	rs.upWrap = eofConn{}
	rs.upSent = sentConn{}
	rs.upResp.Reset()
	rs.upClose, rs.upBodyDone = false, false
	rs.hdr = rs.hdr[:0]
	rs.hdrArena = trim(rs.hdrArena, 64<<10)
	rs.viewClient, rs.chdrBuilt, rs.chdrOps = false, false, 0
	rs.chdr = trimList(rs.chdr, 4096)
	if cap(rs.opLog) > 4096 {
		rs.opLog = nil
	} else {
		clear(rs.opLog)
		rs.opLog = rs.opLog[:0]
	}
	rs.rawTarget = trim(rs.rawTarget, 16<<10)
	rs.fwdBuf = trim(rs.fwdBuf, 4<<10)
	rs.srvDone, rs.srvIP, rs.srvPort = false, nil, 0
	rs.lstName = trim(rs.lstName, 1<<10)
	rs.xffBuf = trim(rs.xffBuf, 4<<10)
	rs.upHost = nil
	rs.upChunked = false
	rs.upgrade = false
	rs.names = trim(rs.names, 64<<10)
	rs.scratch = trim(rs.scratch, 64<<10)
	rs.hostBuf = rs.hostBuf[:0]
	rs.targetBuf = trim(rs.targetBuf, 16<<10)
	rs.srv, rs.tbl, rs.rt, rs.ctx, rs.conn, rs.lst = nil, nil, nil, nil, nil, nil
	reqPool.Put(rs)
}

// trimList empties a header list, dropping its storage when it grew past
// max entries; the entries are cleared so the pool pins no request's
// header block.
func trimList(l []hkv, max int) []hkv {
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

// serve runs the request up to the response body. It reports whether the
// response body is being streamed (rs then lives until the stream closes).
func (rs *reqState) serve() bool {
	ctx := rs.ctx
	req := &ctx.Request
	rs.correlation()
	cl := req.Header.ContentLength()
	rs.hasReqBody = cl > 0 || cl == -1
	// The head is normalised before anything looks at it: the route, the
	// agents and the upstream see the same method, host and target.
	if !rs.prepareRequest() || !rs.prepareUpgrade() {
		return false
	}
	// rs.host is the canonical host (prepareRequest); the Host header
	// carries the same, with the client's port.
	rt := rs.tbl.match(rs.host, ctx.Path())
	if rt == nil {
		rs.local(fasthttp.StatusNotFound, "no route", "no route")
		return false
	}
	if req.Header.IsConnect() {
		// A reverse proxy does not open tunnels.
		rs.local(fasthttp.StatusMethodNotAllowed, "method not allowed", "CONNECT refused")
		return false
	}
	rs.rt = rt
	rs.upHost = rt.upstreamHost(req.Header.Host())
	rs.nslots = len(rt.agents)
	for i := range rt.agents {
		rs.slots[i].ra = &rt.agents[i]
	}
	if max := int64(rs.lst.cfg.MaxRequestBody); max > 0 && int64(cl) > max {
		rs.local(fasthttp.StatusRequestEntityTooLarge, "request body too large", "body over max_request_body")
		return false
	}
	if !rs.bufferAhead() || !rs.requestHeaders() || !rs.requestBody() || !rs.forward() {
		return false
	}
	if rs.upgrade || rs.upResp.StatusCode() == fasthttp.StatusSwitchingProtocols {
		if !rs.upgraded() {
			return false
		}
	}
	if !rs.responseHeaders() {
		return false
	}
	return rs.responseBody()
}

// finish ends the request: upstream connection, exchanges, log, metrics.
func (rs *reqState) finish() {
	s := rs.srv
	rs.releaseUpstream()
	gone := rs.canceled()
	for i := 0; i < rs.nslots; i++ {
		rs.endSlot(i, gone)
	}
	if len(rs.shadowConvs) > 0 {
		rs.endShadows()
	}
	if gone {
		s.stats.clientGone.Add(1)
	}
	if s.watch != nil {
		s.watch.remove(rs)
	}
	route := -1
	if rs.rt != nil {
		route = rs.rt.idx
	}
	status := rs.status
	if status == 0 && rs.ctx != nil && !gone {
		status = rs.ctx.Response.StatusCode()
	}
	d := time.Since(rs.start)
	s.obs.Request(route, status, d)
	if s.rec != nil {
		s.rec.RecordRequest(rs.summarize(route, status, d, gone))
	}
	if e := s.log.Debug(); e != nil {
		rs.logFields(e).Int("status", status).Dur("duration", d)
		if rs.outcome != "" {
			e.Str("outcome", rs.outcome)
		}
		e.Msg("request")
	}
	if rs.trace.sampled {
		s.spans.record(rs, route, status, d)
	}
	s.stats.inflight.Add(-1)
	t := rs.tbl
	rs.release()
	t.release()
}

// summarize fills the request's summary for a RequestRecorder.
func (rs *reqState) summarize(route, status int, d time.Duration, gone bool) *RequestSummary {
	sm := &rs.sum
	*sm = RequestSummary{
		ID:                rs.id,
		Correlation:       rs.corr,
		Route:             route,
		ClientIP:          rs.clientIP,
		Status:            status,
		Agent:             -1,
		Reason:            rs.outcome,
		Start:             rs.start,
		Duration:          d,
		AgentTime:         rs.agentTime,
		BytesIn:           rs.reqSrc.n,
		Inspected:         rs.inspected,
		Mutated:           rs.mutated,
		FailedOpen:        rs.nFailed,
		InspectionSkipped: rs.skipped[0] || rs.skipped[1],
		Aborted:           rs.respAbort,
	}
	if rs.rt != nil {
		sm.RouteName = rs.rt.name
	}
	if ctx := rs.ctx; ctx != nil {
		sm.Method = ctx.Method()
		sm.Host = ctx.Request.Header.Host()
		sm.Path = ctx.Path()
		if rs.streaming {
			sm.BytesOut = rs.respBody.written
		} else if !gone {
			sm.BytesOut = int64(len(ctx.Response.Body()))
		}
	}
	agent := -1
	switch {
	case rs.decider >= 0:
		sm.Outcome, agent = RequestBlocked, rs.decider
		if rs.redirected {
			sm.Outcome = RequestRedirected
		}
	case gone:
		sm.Outcome = RequestClientGone
	case rs.failedClosed >= 0:
		sm.Outcome, agent = RequestFailedClosed, rs.failedClosed
	case rs.upFailed:
		sm.Outcome = RequestUpstreamError
	case rs.nFailed > 0:
		sm.Outcome = RequestFailedOpen
	case rs.rejected:
		sm.Outcome = RequestRejected
	default:
		sm.Outcome = RequestAllowed
	}
	if agent >= 0 {
		sm.Agent = rs.slots[agent].ra.a.idx
		sm.AgentName = rs.slots[agent].ra.a.name
	}
	return sm
}

// abandon releases what a panicked request holds on the agents and the
// upstream, as far as it safely can; the state itself is not pooled again.
func (rs *reqState) abandon() {
	defer func() { _ = recover() }()
	rs.cancel()
	for i := 0; i < rs.nslots; i++ {
		if ex := rs.slots[i].ex; ex != nil {
			rs.slots[i].ex = nil
			ex.Cancel(reasonDecided)
			ex.Finish()
		}
	}
	rs.releaseUpstream()
}

// endSlot finishes agent i's exchange: CancelRequest first when it still
// expected events (a decision elsewhere, an error, a vanished client).
func (rs *reqState) endSlot(i int, gone bool) {
	sl := &rs.slots[i]
	if sl.ex == nil {
		return
	}
	if gone {
		sl.ex.Cancel(reasonClientGone)
	} else if i != rs.decider && rs.pending(sl) {
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
func (rs *reqState) pending(sl *slot) bool {
	if sl.flags&flagFailed != 0 {
		return false
	}
	c, f := sl.caps, sl.flags
	switch {
	case c.HandlesRequestHeaders && f&flagReqHdrDone == 0:
		return true
	case c.HandlesRequestBody && rs.hasReqBody && sl.mode[0] != bodyNone && f&(flagReqBodyDone|flagReqSkip) == 0:
		return true
	case c.HandlesResponseHeaders && f&flagRespHdrDone == 0:
		return true
	case c.HandlesResponseBody && sl.mode[1] != bodyNone && f&(flagRespBodyDone|flagRespSkip) == 0 && (!rs.respSeen || rs.respHasBody):
		return true
	}
	return false
}

// correlation picks the correlation id: the client's X-Request-Id or
// X-Correlation-Id when sane, else a fresh one.
func (rs *reqState) correlation() {
	h := &rs.ctx.Request.Header
	for _, name := range [2][]byte{hdrXRequestID, hdrXCorrelationID} {
		if v := h.PeekBytes(name); saneID(v) {
			rs.corrStore = append(rs.corrStore[:0], v...)
			rs.corr = rs.corrStore
			return
		}
	}
	var raw [16]byte
	binary.BigEndian.PutUint64(raw[:8], corrPrefix)
	binary.BigEndian.PutUint64(raw[8:], rs.id)
	hex.Encode(rs.corrBuf[:], raw[:])
	rs.corr = rs.corrBuf[:]
	rs.corrGen = true
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

// local stages a response made by the sidecar (errors, no route). The
// body is generic: details go to the log only.
func (rs *reqState) local(status int, body, outcome string) {
	resp := &rs.ctx.Response
	resp.Reset()
	resp.Header.SetNoDefaultContentType(true)
	resp.SetStatusCode(status)
	resp.Header.SetContentTypeBytes(valueTextPlain)
	resp.SetBodyString(body)
	rs.respOpsApplied = 0
	rs.finishResponseHeaders()
	rs.answered = true
	rs.rejected = true
	rs.status = status
	if rs.outcome == "" {
		rs.outcome = outcome
	}
}

// finishResponseHeaders applies the response operations decided earlier
// and the sidecar's markers to the client response.
func (rs *reqState) finishResponseHeaders() {
	rs.applyStashed()
	h := &rs.ctx.Response.Header
	for i := 0; i < rs.nFailed; i++ {
		h.AddBytesKV(hdrFailOpen, rs.slots[rs.failedOpen[i]].ra.a.nameB)
	}
	if rs.skipped[0] || rs.skipped[1] {
		h.SetBytesKV(hdrInspection, valueSkipped)
	}
}
