package dataplane

import (
	"bufio"
	"errors"
	"io"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/dataplane/internal/clock"
	"github.com/zentinelproxy/sidecar/dataplane/internal/upstream"
	"github.com/zentinelproxy/sidecar/internal/rawio"
	"github.com/zentinelproxy/sidecar/protocol"
)

// passChunk is the read size for bodies no agent inspects.
const passChunk = 32 << 10

var (
	// errStopped: an agent ended the message mid-body (block, redirect or
	// a fail-closed failure); the staged response or abort says what next.
	errStopped = errors.New("dataplane: body stopped by an agent")
	// errNoProgress: a body reader returned nothing, repeatedly.
	errNoProgress = errors.New("dataplane: body reader makes no progress")
	// errTooLarge: a chunked request body grew past max_request_body.
	errTooLarge = errors.New("dataplane: request body over max_request_body")
	// errTooSlow: a request body fell behind body_min_rate by more than
	// body_timeout.
	errTooSlow = errors.New("dataplane: request body slower than body_min_rate")
)

// clientError is a failure reading the client's request body.
type clientError struct{ err error }

func (e *clientError) Error() string { return "reading request body: " + e.err.Error() }
func (e *clientError) Unwrap() error { return e.err }

// bodySource reads a body (the client's request body or the upstream's
// response body), first any bytes already read ahead, and keeps pushing
// the connection's read deadline so only a stalled peer times out.
type bodySource struct {
	prefix   []byte
	r        io.Reader
	conn     net.Conn
	idle     time.Duration
	extended time.Time
	eof      bool
	n        int64 // bytes delivered
	// want is the framed length (-1: chunked or until close); ec, when
	// set, tells a truncated body from a complete one; untilClose marks a
	// body that legitimately ends with the connection.
	want       int64
	ec         *eofConn
	untilClose bool
	max        int64 // 0: no limit
	// buf, when set, is the buffer r drains: once it holds the rest of a
	// framed body, reading it needs no deadline; and what it holds joins
	// the chunk being read (coalesce.go), as do bytes waiting in sock.
	buf  *bufio.Reader
	sock *rawio.Conn
	// joined counts the Reads that joined an earlier one's chunk.
	joined *atomic.Uint64
	// The minimum rate of a request body (listeners' body_min_rate), in
	// bytes per second (0: none). credit is how far the body may still
	// fall behind it: it starts at idle (body_timeout), each Read spends
	// the time it waited on the client and earns 1/rate s per byte, and
	// it never grows past idle. Time spent elsewhere (on agents, on the
	// upstream) is not charged: only the client's own pace counts. A
	// trickle of a byte now and then, which body_timeout alone lets
	// through, runs out of credit. slow: the read deadline in force is
	// the credit's.
	rate   int64
	credit time.Duration
	slow   bool
	// ready: reqSource has set the request's body up.
	ready bool
}

// read reads into p: until p is full or the body ends when fill is set,
// else what one read returns and every byte already received after it
// (coalesce.go). last reports the end of the body.
func (s *bodySource) read(p []byte, fill bool) (n int, last bool, err error) {
	// The bytes read ahead (prefix) were counted in s.n when first read:
	// only what comes from s.r now is new.
	pre := 0
	if len(s.prefix) > 0 {
		pre = copy(p, s.prefix)
		s.prefix = s.prefix[pre:]
		n = pre
	}
	if s.r == nil {
		s.eof = true
	}
	zero, joined := 0, uint64(0)
	defer func() {
		if joined > 0 && s.joined != nil {
			s.joined.Add(joined)
		}
	}()
	for n < len(p) && !s.eof {
		if n > 0 && !fill {
			if !s.more() {
				break
			}
			joined++
		}
		var t0 time.Duration
		if s.rate > 0 {
			if s.credit <= 0 {
				s.n += int64(n - pre)
				return n, false, errTooSlow
			}
			t0 = clock.Mono()
		}
		s.touch(int64(n - pre))
		m, rerr := s.r.Read(p[n:])
		if s.rate > 0 {
			s.credit = min(s.credit-(clock.Mono()-t0)+time.Duration(int64(m)*int64(time.Second)/s.rate), s.idle)
			if rerr != nil && s.slow && isTimeout(rerr) {
				rerr = errTooSlow
			}
		}
		n += m
		switch {
		case rerr == io.EOF:
			s.eof = true
			if (s.want >= 0 && s.n+int64(n-pre) < s.want) || (!s.untilClose && s.ec != nil && s.ec.eof) {
				s.n += int64(n - pre)
				return n, false, io.ErrUnexpectedEOF
			}
		case rerr != nil:
			s.n += int64(n - pre)
			return n, false, rerr
		case m == 0:
			if zero++; zero > 100 {
				s.n += int64(n - pre)
				return n, false, errNoProgress
			}
		}
	}
	s.n += int64(n - pre)
	if s.max > 0 && s.n > s.max {
		return n, false, errTooLarge
	}
	return n, s.eof && len(s.prefix) == 0, nil
}

// touch pushes the read deadline before a read; got is what this read
// call has taken so far (not yet in s.n). A body whose rest is already
// buffered is read without the socket, so the deadline is left alone:
// the upstream's response deadline (set for the head, 30 s by default)
// and the body's idle one (60 s) differ, and moving the deadline from one
// to the other on every request cost two deadline changes (timer
// operations in the runtime) per request.
func (s *bodySource) touch(got int64) {
	if s.conn == nil || s.idle <= 0 {
		return
	}
	if s.buf != nil && s.want >= 0 && int64(s.buf.Buffered()) >= s.want-(s.n+got) {
		return
	}
	if uc, ok := s.conn.(*upstream.UpConn); ok {
		upstream.ExtendRead(uc, s.idle)
		return
	}
	now := time.Now()
	if s.rate > 0 && s.credit < s.idle {
		// Behind the minimum rate: this read may wait for what is left
		// of the credit only. Set on every read while it lasts (two
		// atomic stores on a rawio connection).
		s.slow = true
		s.extended = time.Time{}
		_ = s.conn.SetReadDeadline(now.Add(s.credit))
		return
	}
	s.slow = false
	if now.Sub(s.extended) > s.idle/4 {
		s.extended = now
		_ = s.conn.SetReadDeadline(now.Add(s.idle))
	}
}

// chunkSize is the chunk size of phase p: the smallest of its active
// agents', or passChunk when no agent inspects the body.
func (rs *reqState) chunkSize(p protocol.Phase) int {
	size := 0
	for _, i := range rs.active[p] {
		if c := rs.slots[i].ra.body[p].chunk; size == 0 || c < size {
			size = c
		}
	}
	if size == 0 {
		size = passChunk
	}
	return size
}

// fill says whether reads of phase p's body wait for a whole chunk: only
// when agents inspect it and its length is known. A body of unknown length
// is passed on as the sender flushes it, so a stream of events is not held
// back waiting for a chunk to fill.
func (rs *reqState) fill(p protocol.Phase) bool {
	src := &rs.reqSrc
	if p == protocol.PhaseResponse {
		src = &rs.respSrc
	}
	return len(rs.active[p]) > 0 && src.want >= 0
}

// chunkBuf returns the read buffer sized for phase p.
func (rs *reqState) chunkBuf(p protocol.Phase) []byte {
	n := rs.chunkSize(p)
	if cap(rs.buf) < n {
		rs.buf = make([]byte, n)
	}
	return rs.buf[:n]
}

// collectBodyAgents fills rs.active[p] with the agents that inspect the
// body of phase p, opening their exchanges; it returns the largest
// buffered limit among them (0: none buffers) and false when a failure
// ended the request.
func (rs *reqState) collectBodyAgents(p protocol.Phase) (int, bool) {
	return rs.collectBodyAgentsTo(p, rs.nslots)
}

// collectBodyAgentsTo is collectBodyAgents for the agents below slot hi.
// Agents whose say over the body already ended (an inline chunk answered
// for good, inline.go) are not listed again.
func (rs *reqState) collectBodyAgentsTo(p protocol.Phase, hi int) (int, bool) {
	rs.phaseNow = PhaseIndex(p, true)
	act := rs.active[p][:0]
	limit := 0
	done := flagReqBodyDone | flagReqSkip
	if p == protocol.PhaseResponse {
		done = flagRespBodyDone | flagRespSkip
	}
	for i := 0; i < hi; i++ {
		sl := &rs.slots[i]
		if sl.flags&(flagFailed|done) != 0 || sl.ra.body[p].mode == bodyNone {
			continue
		}
		if caps, known := rs.knownCaps(sl); known && !caps.Handles(p, true) {
			continue
		}
		if err := rs.begin(i); err != nil {
			rs.srv.obs.AgentEvent(rs.rt.idx, sl.ra.a.idx, p, true, outcomeOf(err), 0)
			rs.active[p] = act
			if !rs.failure(i, p, true, err) {
				return 0, false
			}
			continue
		}
		if !sl.caps.Handles(p, true) || sl.mode[p] == bodyNone {
			continue
		}
		act = append(act, uint8(i))
		if sl.mode[p] == bodyBuffered && sl.ra.body[p].limit > limit {
			limit = sl.ra.body[p].limit
		}
	}
	rs.active[p] = act
	return limit, true
}

// requestBody plans the request body: pass it through, buffer it for
// inspection before the upstream is contacted, or stream it through the
// agents. It reports whether the request goes on.
func (rs *reqState) requestBody() bool {
	if !rs.hasReqBody {
		return true
	}
	if rs.inl.err != nil {
		// Reading ahead for an inline body failed (inline.go): reported
		// here, where the body phase would have met it.
		rs.bodyReadFailed(protocol.PhaseRequest, rs.inl.err)
		return false
	}
	src := &rs.reqSrc
	cl := rs.reqSource()
	limit, ok := rs.collectBodyAgents(protocol.PhaseRequest)
	if !ok {
		return false
	}
	if rs.inl.used {
		return rs.finishInlined()
	}
	rs.reqMode = reqBodyPass
	if limit == 0 {
		rs.replayPreRead() // nothing buffers: the bytes read ahead go first
	}
	if len(rs.active[0]) == 0 {
		return true
	}
	if limit > 0 {
		in, complete, ok := rs.bufferBody(protocol.PhaseRequest, limit, int64(cl))
		if !ok {
			return false
		}
		if complete {
			// Agents whose smaller limit the body exceeds see their
			// prefix first (prefix.go); the length goes by reqOut.
			if in, _, ok = rs.inspectPrefixes(in); !ok {
				return false
			}
			out, ok := rs.inspectBuffered(protocol.PhaseRequest, in, rs.reqOut[:0])
			rs.reqOut = out
			if !ok {
				return false
			}
			rs.reqBodyEOF = true
			rs.reqMode = reqBodyRaw
			return true
		}
		var mutated bool
		if in, mutated, ok = rs.inspectPrefixes(in); !ok {
			return false
		}
		src.prefix = in
		if mutated {
			// A rewritten prefix changes the length: send it chunked.
			rs.reqMode = reqBodyPipe
		}
	}
	if len(rs.active[0]) > 0 {
		rs.reqMode = reqBodyPipe
	}
	return true
}

// reqSource sets up the reader of the client's request body (once more is
// harmless) and returns its Content-Length (-1: chunked).
func (rs *reqState) reqSource() int {
	req := &rs.ctx.Request
	src := &rs.reqSrc
	if src.ready {
		return req.Header.ContentLength()
	}
	src.ready = true
	src.r = req.BodyStream()
	src.conn = rs.conn
	src.ec, _ = rs.conn.(*eofConn)
	src.idle = rs.lst.cfg.BodyTimeout
	cl := req.Header.ContentLength()
	rs.total[0] = int64(cl)
	if cl < 0 {
		rs.total[0] = -1
	}
	src.want = rs.total[0]
	src.max = int64(rs.lst.cfg.MaxRequestBody)
	src.buf = bodyStreamReader.reader(src.r)
	if ec, ok := rs.conn.(*eofConn); ok {
		src.sock = ec.rw
	}
	src.joined = &rs.srv.stats.joined[0]
	src.rate = int64(rs.lst.cfg.MinBodyRate())
	src.credit = src.idle
	return cl
}

// bufferBody reads up to limit+1 bytes of phase p's body ahead. complete
// reports that the whole body fits in limit; otherwise the buffered agents
// over their limit are rejected (413/502) or dropped with the skip mark,
// and in holds the bytes read so far, to be sent first.
func (rs *reqState) bufferBody(p protocol.Phase, limit int, known int64) (in []byte, complete, ok bool) {
	src := &rs.reqSrc
	if p == protocol.PhaseResponse {
		src = &rs.respSrc
	}
	size := known
	in = rs.bufIn(p)
	if known < 0 || known <= int64(limit) {
		for !src.eof && len(in) <= limit {
			want := min(limit+1-len(in), 64<<10)
			in = slices.Grow(in, want)
			n, _, err := src.read(in[len(in):len(in)+want], true)
			in = in[:len(in)+n]
			if err != nil {
				rs.setBufIn(p, in)
				rs.bodyReadFailed(p, err)
				return nil, false, false
			}
		}
		rs.setBufIn(p, in)
		size = int64(len(in))
		if src.eof && len(in) <= limit {
			size = int64(len(in))
			complete = true
		} else {
			size = int64(limit) + 1
		}
	}
	// Agents whose own limit the body exceeds are rejected or skipped;
	// with a complete body, those with a larger limit still inspect it.
	act := rs.active[p]
	for k := 0; k < len(act); {
		sl := &rs.slots[act[k]]
		pol := &sl.ra.body[p]
		if sl.mode[p] != bodyBuffered || int64(pol.limit) >= size {
			k++
			continue
		}
		if handled, kept := rs.overLimit(int(act[k]), p); handled {
			if kept {
				k++
			} else {
				act = append(act[:k], act[k+1:]...)
			}
			continue
		}
		if pol.reject {
			rs.outcome = "body over " + sl.ra.a.name + "'s limit"
			if p == protocol.PhaseRequest {
				rs.local(fasthttp.StatusRequestEntityTooLarge, "request entity too large", rs.outcome)
			} else {
				rs.local(fasthttp.StatusBadGateway, "bad gateway", rs.outcome)
			}
			return nil, false, false
		}
		if p == protocol.PhaseRequest {
			sl.flags |= flagReqSkip
		} else {
			sl.flags |= flagRespSkip
		}
		rs.skipped[p] = true
		rs.srv.stats.skipped.Add(1)
		rs.srv.obs.InspectionSkipped(rs.rt.idx, sl.ra.a.idx, p)
		act = append(act[:k], act[k+1:]...)
	}
	rs.active[p] = act
	if rs.skipped[0] && p == protocol.PhaseRequest {
		rs.setHdr(hdrInspection, valueSkipped)
		rs.viewDirty = true
	}
	return in, complete, true
}

// bufIn is the buffer of phase p's body, holding the request body bytes
// read ahead for an inline body (inline.go), if any.
func (rs *reqState) bufIn(p protocol.Phase) []byte {
	if p == protocol.PhaseRequest {
		if rs.inl.pre {
			return rs.inReq
		}
		return rs.inReq[:0]
	}
	return rs.inResp[:0]
}

func (rs *reqState) setBufIn(p protocol.Phase, b []byte) {
	if p == protocol.PhaseRequest {
		rs.inReq = b
	} else {
		rs.inResp = b
	}
}

// inspectBuffered runs a whole buffered body through the active agents
// chunk by chunk, appending what they let through to out.
func (rs *reqState) inspectBuffered(p protocol.Phase, in, out []byte) ([]byte, bool) {
	size := rs.chunkSize(p)
	for first := true; first || len(in) > 0; first = false {
		n := min(size, len(in))
		last := n == len(in)
		data, ok := rs.runChunk(p, in[:n], last, false)
		if !ok {
			return out, false
		}
		out = append(out, data...)
		in = in[n:]
	}
	return out, true
}

// runChunk passes one chunk through phase p's active agents, in order,
// each seeing what the previous one let through. It returns the bytes to
// forward; ok is false when the message must stop (a response is staged,
// the response is to be cut off, or the client is gone).
func (rs *reqState) runChunk(p protocol.Phase, data []byte, last, stream bool) ([]byte, bool) {
	src := &rs.reqSrc
	if p == protocol.PhaseResponse {
		src = &rs.respSrc
	}
	for k := 0; k < len(rs.active[p]); {
		if len(data) == 0 && !last {
			break // dropped: the agents after see nothing of it
		}
		i := int(rs.active[p][k])
		sl := &rs.slots[i]
		m := &rs.chunk
		m.Reset()
		m.ChunkIndex = sl.chunk[p]
		sl.chunk[p]++
		m.Data = data
		m.IsLast = last
		m.TotalSize = rs.total[p]
		m.Progress = src.n
		t0 := clock.Mono()
		w := rs.streamWait(t0)
		if !stream {
			var ok bool
			if w, ok = rs.agentWait(sl, t0); !ok {
				rs.srv.obs.AgentEvent(rs.rt.idx, sl.ra.a.idx, p, true, OutcomeTimeout, 0)
				if !rs.failure(i, p, true, errBudget(sl)) {
					return nil, false
				}
				continue
			}
		}
		reply, err := sl.ex.BodyChunk(w, p, m)
		d := clock.Mono() - t0
		if !stream {
			sl.spent += d
		}
		rs.agentTime[PhaseIndex(p, true)] += d
		if k == 0 {
			rs.inspected[p] += int64(len(data))
		}
		if err != nil {
			rs.srv.obs.AgentEvent(rs.rt.idx, sl.ra.a.idx, p, true, outcomeOf(err), d)
			if !rs.failure(i, p, true, err) {
				return nil, false
			}
			continue // failure dropped agent i from the pipeline
		}
		sl.ra.a.brk.success(&rs.srv.log, sl.ra.a.name)
		final := false
		var mut *protocol.BodyMutation
		if reply.Type == protocol.TypeBodyMutation {
			mut = &reply.Mutation
			rs.srv.obs.AgentEvent(rs.rt.idx, sl.ra.a.idx, p, true, OutcomeContinue, d)
		} else {
			dec := &reply.Decision
			if p == protocol.PhaseRequest && dec.HasRequestBodyMutation {
				mut = &dec.RequestBodyMutation
			} else if p == protocol.PhaseResponse && dec.HasResponseBodyMutation {
				mut = &dec.ResponseBodyMutation
			}
			if !rs.decide(i, p, true, dec, d) {
				return nil, false
			}
			if sl.flags&flagFailed != 0 {
				continue // an invalid reply failed open
			}
			final = dec.Final()
		}
		if mut != nil && mut.Action != protocol.MutationPass {
			rs.mutated[p] += int64(len(data))
			data = rs.mutate(data, mut)
		}
		if final || last {
			if p == protocol.PhaseRequest {
				sl.flags |= flagReqBodyDone
			} else {
				sl.flags |= flagRespBodyDone
			}
			a := rs.active[p]
			rs.active[p] = append(a[:k], a[k+1:]...)
			continue
		}
		k++
	}
	return data, true
}

// mutate applies a BodyMutation to the chunk data.
func (rs *reqState) mutate(data []byte, m *protocol.BodyMutation) []byte {
	switch m.Action {
	case protocol.MutationDrop:
		return data[:0]
	case protocol.MutationReplace:
		// The reply's buffer is reused by the exchange's next event.
		rs.mut = append(rs.mut[:0], m.Data...)
		return rs.mut
	}
	return data
}

// bodyReadFailed handles a failed body read before anything was sent on.
func (rs *reqState) bodyReadFailed(p protocol.Phase, err error) {
	if rs.canceled() {
		rs.outcome = "client gone"
		return
	}
	if p == protocol.PhaseRequest {
		rs.logFields(rs.srv.log.Debug()).Err(err).Msg("reading request body failed")
		rs.ctx.SetConnectionClose()
		if staleConn(err) {
			// The client closed or reset its connection mid-body.
			rs.outcome = "client gone"
			rs.cancel()
			return
		}
		rs.outcome = "request body read failed"
		switch {
		case errors.Is(err, errTooLarge):
			rs.local(fasthttp.StatusRequestEntityTooLarge, "request entity too large", "body over max_request_body")
		case errors.Is(err, errTooSlow):
			rs.srv.stats.bodyTooSlow.Add(1)
			rs.local(fasthttp.StatusRequestTimeout, "request timeout", "request body below body_min_rate")
		case isTimeout(err):
			rs.local(fasthttp.StatusRequestTimeout, "request timeout", rs.outcome)
		default:
			rs.local(fasthttp.StatusBadRequest, "bad request", rs.outcome)
		}
		return
	}
	rs.upstreamFailed(err)
}

// responseBody relays the upstream's response body: nothing, a buffered
// and inspected body, or a stream pulled by the listener as it writes.
// It reports whether the body is streaming (rs lives on until it closes).
func (rs *reqState) responseBody() bool {
	ctx := rs.ctx
	up := &rs.upResp
	stream := up.BodyStream()
	cl := up.Header.ContentLength()
	if !up.Header.IsHTTP11() {
		// The client's response is the sidecar's message, sent in its
		// own version (RFC 9110 §6.2, RFC 9112 §6.1), whatever the
		// upstream spoke: an HTTP/1.0 status line on a chunked body is
		// read by clients as a body delimited by the close that never
		// comes on a kept-alive connection.
		ctx.Response.Header.SetProtocol(protoHTTP11)
	}
	if !rs.respHasBody {
		rs.upBodyDone = stream == nil || cl == 0
		rs.finishResponseHeaders()
		return false
	}
	src := &rs.respSrc
	src.r = stream
	src.conn = rs.upNetConn()
	src.ec = &rs.upWrap
	src.untilClose = cl == -2
	src.idle = rs.rt.up.Config().IdleTimeout
	src.buf = rs.upBR
	src.sock = upstream.RawOf(src.conn)
	src.joined = &rs.srv.stats.joined[1]
	rs.total[1] = int64(cl)
	if cl < 0 {
		rs.total[1] = -1
	}
	src.want = rs.total[1]
	limit, ok := rs.collectBodyAgents(protocol.PhaseResponse)
	if !ok {
		return false
	}
	if limit > 0 {
		in, complete, ok := rs.bufferBody(protocol.PhaseResponse, limit, int64(cl))
		if !ok {
			return false
		}
		if complete {
			rs.upBodyDone = true
			out, ok := rs.inspectBuffered(protocol.PhaseResponse, in, rs.respOut[:0])
			rs.respOut = out
			if !ok {
				return false
			}
			if len(rs.shadowConvs) > 0 {
				rs.shadowBody(protocol.PhaseResponse, out, true, int64(len(out)))
			}
			rs.finishResponseHeaders()
			ctx.Response.SetBody(out)
			return false
		}
		src.prefix = in
	}
	if len(rs.active[1]) == 0 && cl >= 0 && cl <= passChunk && len(src.prefix) == 0 {
		return rs.smallResponse(cl)
	}
	size := cl
	if len(rs.active[1]) > 0 || cl < 0 {
		size = -1
	}
	rs.finishResponseHeaders()
	rs.finishIdle(protocol.PhaseResponse)
	rs.respBody.reset()
	rs.respBody.total = int64(size)
	rs.respStarted = true
	rs.streaming = true
	if size < 0 && !ctx.Request.Header.IsHTTP11() {
		rs.closeDelimited()
		return true
	}
	ctx.Response.SetBodyStream(&rs.respBody, size)
	return true
}

// protoHTTP11 is the version of every response the sidecar sends.
var protoHTTP11 = []byte("HTTP/1.1")

// closeDelimited sends a body of unknown length to an HTTP/1.0 client,
// which cannot read chunked framing (RFC 9112 §7.1: a server must not
// send it to a client that did not say HTTP/1.1): no Content-Length, no
// Transfer-Encoding, the end of the body is the close of the connection.
// fasthttp frames every body stream of unknown length as chunked, so the
// response is written through ctx.Hijack: head and body by respStream,
// on the client's connection, which fasthttp closes once it is done.
func (rs *reqState) closeDelimited() {
	h := &rs.ctx.Response.Header
	h.SetContentLength(-1) // drops a Content-Length the agents may change
	h.Del(fasthttp.HeaderTransferEncoding)
	h.SetContentLength(-2) // identity, with Connection: close
	b := &rs.respBody
	b.hijack.Store(0)
	// fasthttp skips the hijack handler only when it cannot reset the
	// connection's deadline or flush earlier responses: the guard then
	// ends the request.
	b.guard = time.AfterFunc(rs.lst.cfg.ReadTimeout, b.abandonHijack)
	rs.ctx.HijackSetNoResponse(true)
	rs.ctx.Hijack(b.hijacked)
}

// hijacked is the hijack handler of closeDelimited: head, body, close.
func (b *respStream) hijacked(c net.Conn) {
	if !b.hijack.CompareAndSwap(0, 1) {
		return
	}
	b.guard.Stop()
	rs := b.rs
	rs.scratch = rs.ctx.Response.Header.AppendBytes(rs.scratch[:0])
	b.touch()
	_, err := c.Write(rs.scratch)
	if err == nil {
		_, err = b.WriteTo(c)
	}
	if rs.respAbort {
		// A close-delimited body cut off looks complete: a reset says
		// it is not.
		resetOnClose(rs.conn)
	}
	_ = b.CloseWithError(err)
}

// abandonHijack ends a request whose hijack handler never ran.
func (b *respStream) abandonHijack() {
	if !b.hijack.CompareAndSwap(0, 1) {
		return
	}
	rs := b.rs
	rs.outcome = "client gone"
	rs.cancel()
	_ = b.CloseWithError(nil)
}

// resetOnClose makes the close of the client connection c a reset
// (SO_LINGER 0) when it is TCP.
func resetOnClose(c net.Conn) {
	for {
		switch t := c.(type) {
		case *net.TCPConn:
			_ = t.SetLinger(0)
			return
		case *eofConn:
			c = t.Conn
			if t.raw != nil {
				c = t.raw
			}
		case *rawio.Conn:
			c = t.Conn
		default:
			return
		}
	}
}

// smallResponse relays a response body of known length no agent inspects
// and no larger than one read buffer as a plain body: read whole, then
// written with the headers in one write. Streaming it instead costs a
// stream object's round of calls, deadline extensions and a deferred
// finish (~7% of a proxied request with a small body); a body this small
// gains nothing from streaming. A failure while reading it is still a
// clean 502, since nothing has been sent.
func (rs *reqState) smallResponse(cl int) bool {
	buf := rs.chunkBuf(protocol.PhaseResponse)[:cl]
	n, last, err := rs.respSrc.read(buf, true)
	if err == nil && !last && n == cl {
		// Full, but the end not seen yet: it must come now.
		var one [1]byte
		var m int
		m, last, err = rs.respSrc.read(one[:], true)
		if err == nil && m != 0 {
			err = io.ErrUnexpectedEOF
		}
	}
	if err == nil && (!last || n != cl) {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		rs.bodyReadFailed(protocol.PhaseResponse, err)
		return false
	}
	rs.upBodyDone = true
	if len(rs.shadowConvs) > 0 {
		rs.shadowBody(protocol.PhaseResponse, buf[:n], true, int64(n))
	}
	rs.finishResponseHeaders()
	rs.ctx.Response.SetBody(buf[:n])
	return false
}

// respStream is the client response body: the listener pulls it as it
// writes, which is when the upstream body is read and shown to the
// agents, so memory stays at one chunk however large the body.
type respStream struct {
	rs      *reqState
	pending []byte
	eof     bool
	extend  time.Time
	written int64
	// total is the body's length when known, else -1.
	total int64
	// hijack and guard: an HTTP/1.0 client's body of unknown length
	// (closeDelimited); hijack is 1 once the handler or the guard ran.
	hijack atomic.Int32
	guard  *time.Timer
}

func (b *respStream) reset() {
	b.guard = nil
	b.pending = nil
	b.eof = false
	b.extend = time.Time{}
	b.written = 0
}

// next produces the next piece of the response body.
func (b *respStream) next() ([]byte, bool, error) {
	rs := b.rs
	buf := rs.chunkBuf(protocol.PhaseResponse)
	n, last, err := rs.respSrc.read(buf, rs.fill(protocol.PhaseResponse))
	if err != nil {
		if !rs.canceled() {
			if ok, suppressed := rs.rt.up.LogErr().Allow(); ok {
				e := rs.logFields(rs.srv.log.Error()).Str("upstream", rs.rt.up.Name()).Err(err)
				if suppressed > 0 {
					e = e.Uint64("suppressed", suppressed)
				}
				e.Msg("upstream response body failed")
			}
			rs.outcome = "upstream body failed"
			rs.upFailed = true
			rs.abortResponse()
		}
		return nil, false, errStopped
	}
	data := buf[:n]
	if len(rs.active[1]) > 0 {
		var ok bool
		if data, ok = rs.runChunk(protocol.PhaseResponse, data, last, true); !ok {
			if !rs.respAbort {
				rs.abortResponse()
			}
			return nil, false, errStopped
		}
	}
	if last {
		rs.upBodyDone = true
	}
	if len(rs.shadowConvs) > 0 && (len(data) > 0 || last) {
		rs.shadowBody(protocol.PhaseResponse, data, last, b.total)
	}
	return data, last, nil
}

// SupportsBodyWriteTo tells fasthttp to call WriteTo.
func (b *respStream) SupportsBodyWriteTo() bool { return true }

// WriteTo writes the whole body to w (fasthttp's connection writer or its
// chunked framer, which flushes every chunk).
func (b *respStream) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for !b.eof {
		data, last, err := b.next()
		if err != nil {
			return total, err
		}
		if len(data) > 0 {
			b.touch()
			n, err := w.Write(data)
			total += int64(n)
			b.written += int64(n)
			if err != nil {
				return total, err
			}
		}
		b.eof = last
	}
	return total, nil
}

// Read implements io.Reader for callers that do not use WriteTo.
func (b *respStream) Read(p []byte) (int, error) {
	for len(b.pending) == 0 {
		if b.eof {
			return 0, io.EOF
		}
		data, last, err := b.next()
		if err != nil {
			return 0, err
		}
		b.pending, b.eof = data, last
	}
	n := copy(p, b.pending)
	b.pending = b.pending[n:]
	b.written += int64(n)
	return n, nil
}

// CloseWithError is called by fasthttp once the body is written or the
// write failed; err is the write error. It ends the request.
func (b *respStream) CloseWithError(err error) error {
	rs := b.rs
	if err != nil && !rs.respAbort {
		// The client stopped reading: its connection failed.
		rs.outcome = "client gone"
		rs.cancel()
	}
	if !b.extend.IsZero() {
		_ = rs.conn.SetWriteDeadline(time.Time{})
	}
	rs.finish()
	return nil
}

func (b *respStream) touch() {
	rs := b.rs
	idle := rs.lst.cfg.BodyTimeout
	now := time.Now()
	if now.Sub(b.extend) > idle/4 {
		b.extend = now
		_ = rs.conn.SetWriteDeadline(now.Add(idle))
	}
}
