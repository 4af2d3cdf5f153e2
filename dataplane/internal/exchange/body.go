package exchange

import (
	"errors"
	"io"
	"slices"
	"sync/atomic"
	"time"

	"github.com/zentinelproxy/sidecar/dataplane/internal/clock"
	"github.com/zentinelproxy/sidecar/internal/observe"
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

// reqPlan is how the request body goes to the upstream, decided once
// (requestBody): every later step (the upstream request's framing,
// writing it, whether the request may be sent again) follows the plan.
type reqPlan uint8

// Request body plans.
const (
	planNone  reqPlan = iota // no body
	planWhole                // the buffered body as the agents left it (reqOut): its length is known
	planPass                 // the client's body unchanged, in its own framing
	planPipe                 // through streaming agents: its length may change
)

// bodyState is both bodies of a request: their readers, the buffers they
// are read into and the plan of the request body.
type bodyState struct {
	plan    reqPlan
	reqSrc  bodyReader
	respSrc bodyReader
	reqOut  []byte // the request body as the agents left it (planWhole)
	respOut []byte // the buffered response body as the agents left it
	inReq   []byte // buffered request body as read
	inResp  []byte // buffered response body as read
	buf     []byte // chunk buffer
	dup     []byte // the request body's chunk buffer of a duplex request
	mut     []byte // a chunk an agent replaced
	// total is each body's length when known, else -1.
	total      [2]int64
	reqBodyEOF bool
	streaming  bool  // the response body is streamed
	written    int64 // bytes of a streamed body the front end wrote
	// The trailers that go on (trailers.go), in storage kept with the
	// exchange.
	reqTrailers, respTrailers []Field
}

func (b *bodyState) reset() {
	*b = bodyState{
		reqOut:  trim(b.reqOut, 1<<20),
		respOut: trim(b.respOut, 1<<20),
		inReq:   trim(b.inReq, 1<<20),
		inResp:  trim(b.inResp, 1<<20),
		buf:     trim(b.buf, 256<<10),
		dup:     trim(b.dup, 256<<10),
		mut:     trim(b.mut, 1<<20),

		reqTrailers:  trimList(b.reqTrailers, 256),
		respTrailers: trimList(b.respTrailers, 256),
	}
}

// bodyReader reads a body (the client's request body or the upstream's
// response body) from its Source, first any bytes already read ahead,
// and keeps the read deadline moving so only a stalled peer times out.
type bodyReader struct {
	src    Source
	prefix []byte
	eof    bool
	n      int64 // bytes delivered
	// want is the framed length (-1: chunked or until close).
	want int64
	max  int64 // 0: no limit
	// joined counts the Reads that joined an earlier one's chunk
	// (coalescing: a chunk takes every byte already received).
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
	idle   time.Duration
	credit time.Duration
	slow   bool
	// ready: reqSource has set the request's body up.
	ready bool
}

// source is the reader of phase p's body.
func (ex *Exchange) source(p protocol.Phase) *bodyReader {
	if p == protocol.PhaseResponse {
		return &ex.respSrc
	}
	return &ex.reqSrc
}

// read reads into p: until p is full or the body ends when fill is set,
// else what one read returns and every byte already received after it
// (coalescing). last reports the end of the body.
func (s *bodyReader) read(p []byte, fill bool) (n int, last bool, err error) {
	// The bytes read ahead (prefix) were counted in s.n when first read:
	// only what comes from the source now is new.
	pre := 0
	if len(s.prefix) > 0 {
		pre = copy(p, s.prefix)
		s.prefix = s.prefix[pre:]
		n = pre
	}
	if s.src == nil {
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
			if !s.src.Pending() {
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
		m, rerr := s.src.Read(p[n:])
		if s.rate > 0 {
			s.credit = min(s.credit-(clock.Mono()-t0)+time.Duration(int64(m)*int64(time.Second)/s.rate), s.idle)
			if rerr != nil && s.slow && IsTimeout(rerr) {
				rerr = errTooSlow
			}
		}
		n += m
		switch {
		case rerr == io.EOF:
			s.eof = true
			if (s.want >= 0 && s.n+int64(n-pre) < s.want) || s.src.Truncated() {
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
func (s *bodyReader) touch(got int64) {
	rest := int64(-1)
	if s.want >= 0 {
		rest = s.want - (s.n + got)
	}
	if s.src.Buffered(rest) {
		return
	}
	if s.rate > 0 && s.credit < s.idle {
		// Behind the minimum rate: this read may wait for what is left
		// of the credit only. Set on every read while it lasts (two
		// atomic stores on a rawio connection).
		s.slow = true
		s.src.SetReadDeadline(time.Now().Add(s.credit))
		return
	}
	s.slow = false
	s.src.ExtendRead()
}

// limit is agent sl's buffer limit for phase p's body: the one place the
// route's body policies' limits are read.
func (sl *slot) limit(p protocol.Phase) int { return sl.ra.body[p].limit }

// bodyRole says what agent sl does with phase p's body as far as is
// known now: whether it sees the body, and whether it buffers it (it
// streams it otherwise). An agent whose exchange has not begun counts by
// its configuration and what its connection announced; one whose
// capabilities are unknown (no live connection) counts as seeing the
// body the way its configuration says.
func (ex *Exchange) bodyRole(sl *slot, p protocol.Phase) (sees, buffers bool) {
	pol := &sl.ra.body[p]
	if sl.flags&flagFailed != 0 || pol.mode == bodyNone {
		return false, false
	}
	if sl.ex != nil {
		if !sl.caps.Handles(p, true) || sl.mode[p] == bodyNone {
			return false, false
		}
		return true, sl.mode[p] == bodyBuffered
	}
	buffers = pol.mode != bodyStreaming
	if caps, known := ex.knownCaps(sl); known {
		if !caps.Handles(p, true) {
			return false, false
		}
		if pol.mode == bodyAuto && caps.SupportsStreaming {
			buffers = false
		}
	}
	return true, buffers
}

// chunkSize is the chunk size of phase p: the smallest of its active
// agents', or passChunk when no agent inspects the body.
func (ex *Exchange) chunkSize(p protocol.Phase) int {
	size := 0
	for _, i := range ex.active[p] {
		if c := ex.slots[i].ra.body[p].chunk; size == 0 || c < size {
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
func (ex *Exchange) fill(p protocol.Phase) bool {
	return len(ex.active[p]) > 0 && ex.source(p).want >= 0
}

// chunkBuf returns the read buffer sized for phase p.
func (ex *Exchange) chunkBuf(p protocol.Phase) []byte {
	n := ex.chunkSize(p)
	if cap(ex.buf) < n {
		ex.buf = make([]byte, n)
	}
	return ex.buf[:n]
}

// collectBodyAgents fills ex.active[p] with the agents that inspect the
// body of phase p, opening their exchanges; it returns the largest
// buffered limit among them (0: none buffers) and false when a failure
// ended the request.
func (ex *Exchange) collectBodyAgents(p protocol.Phase) (int, bool) {
	return ex.collectBodyAgentsTo(p, ex.nslots)
}

// collectBodyAgentsTo is collectBodyAgents for the agents below slot hi.
// Agents whose say over the body already ended (an inline chunk answered
// for good, inline.go) are not listed again.
func (ex *Exchange) collectBodyAgentsTo(p protocol.Phase, hi int) (int, bool) {
	ex.phaseNow = observe.PhaseIndex(p, true)
	act := ex.active[p][:0]
	limit := 0
	done := flagReqBodyDone | flagReqSkip
	if p == protocol.PhaseResponse {
		done = flagRespBodyDone | flagRespSkip
	}
	for i := 0; i < hi; i++ {
		sl := &ex.slots[i]
		if sl.flags&(flagFailed|done) != 0 || sl.ra.body[p].mode == bodyNone {
			continue
		}
		if caps, known := ex.knownCaps(sl); known && !caps.Handles(p, true) {
			continue
		}
		if err := ex.begin(i); err != nil {
			ex.core.obs.AgentEvent(ex.rt.idx, sl.ra.a.idx, p, true, outcomeOf(err), 0)
			ex.active[p] = act
			if !ex.failure(i, p, true, err) {
				return 0, false
			}
			continue
		}
		if !sl.caps.Handles(p, true) || sl.mode[p] == bodyNone {
			continue
		}
		act = append(act, uint8(i))
		if sl.mode[p] == bodyBuffered {
			limit = max(limit, sl.limit(p))
		}
	}
	ex.active[p] = act
	return limit, true
}

// requestBody plans the request body: pass it through, buffer it for
// inspection before the upstream is contacted, or stream it through the
// agents. It reports whether the request goes on.
func (ex *Exchange) requestBody() bool {
	if !ex.hasReqBody {
		return true
	}
	if ex.inl.err != nil {
		// Reading ahead for an inline body failed (inline.go): reported
		// here, where the body phase would have met it.
		ex.bodyReadFailed(protocol.PhaseRequest, ex.inl.err)
		return false
	}
	src := &ex.reqSrc
	cl := ex.reqSource()
	limit, ok := ex.collectBodyAgents(protocol.PhaseRequest)
	if !ok {
		return false
	}
	if ex.inl.used {
		return ex.finishInlined()
	}
	ex.plan = planPass
	if limit == 0 {
		ex.replayPreRead() // nothing buffers: the bytes read ahead go first
	}
	if len(ex.active[0]) == 0 {
		return true
	}
	if limit > 0 {
		in, complete, ok := ex.bufferBody(protocol.PhaseRequest, limit, cl)
		if !ok {
			return false
		}
		if complete {
			// Agents whose smaller limit the body exceeds see their
			// prefix first (prefix.go); the length goes by reqOut.
			if in, _, ok = ex.inspectPrefixes(in); !ok {
				return false
			}
			out, ok := ex.inspectBuffered(protocol.PhaseRequest, in, ex.reqOut[:0])
			ex.reqOut = out
			if !ok {
				return false
			}
			ex.reqBodyEOF = true
			ex.plan = planWhole
			return true
		}
		var mutated bool
		if in, mutated, ok = ex.inspectPrefixes(in); !ok {
			return false
		}
		src.prefix = in
		if mutated {
			// A rewritten prefix changes the length: send it chunked.
			ex.plan = planPipe
		}
	}
	if len(ex.active[0]) > 0 {
		ex.plan = planPipe
	}
	return true
}

// reqSource sets up the reader of the client's request body (once more is
// harmless) and returns its Content-Length (-1: chunked).
func (ex *Exchange) reqSource() int64 {
	cl := ex.head.ContentLength
	src := &ex.reqSrc
	if src.ready {
		return cl
	}
	src.ready = true
	src.src = ex.front.Body()
	ex.total[0] = cl
	if cl < 0 {
		ex.total[0] = -1
	}
	src.want = ex.total[0]
	src.max = ex.lst.MaxRequestBody
	src.joined = &ex.core.stats.joined[0]
	src.idle = ex.lst.BodyTimeout
	src.rate = ex.lst.MinBodyRate
	src.credit = src.idle
	return cl
}

// bufferBody reads up to limit+1 bytes of phase p's body ahead. complete
// reports that the whole body fits in limit; otherwise the buffered agents
// over their limit are rejected (413/502) or dropped with the skip mark,
// and in holds the bytes read so far, to be sent first.
func (ex *Exchange) bufferBody(p protocol.Phase, limit int, known int64) (in []byte, complete, ok bool) {
	src := ex.source(p)
	size := known
	in = ex.bufIn(p)
	if known < 0 || known <= int64(limit) {
		for !src.eof && len(in) <= limit {
			want := min(limit+1-len(in), 64<<10)
			in = slices.Grow(in, want)
			n, _, err := src.read(in[len(in):len(in)+want], true)
			in = in[:len(in)+n]
			if err != nil {
				ex.setBufIn(p, in)
				ex.bodyReadFailed(p, err)
				return nil, false, false
			}
		}
		ex.setBufIn(p, in)
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
	act := ex.active[p]
	for k := 0; k < len(act); {
		sl := &ex.slots[act[k]]
		pol := &sl.ra.body[p]
		if sl.mode[p] != bodyBuffered || int64(sl.limit(p)) >= size {
			k++
			continue
		}
		if handled, kept := ex.overLimit(int(act[k]), p); handled {
			if kept {
				k++
			} else {
				act = append(act[:k], act[k+1:]...)
			}
			continue
		}
		if pol.reject {
			ex.outcome = "body over " + sl.ra.a.name + "'s limit"
			if p == protocol.PhaseRequest {
				ex.local(413, "request entity too large", ex.outcome)
			} else {
				ex.local(502, "bad gateway", ex.outcome)
			}
			return nil, false, false
		}
		if p == protocol.PhaseRequest {
			sl.flags |= flagReqSkip
		} else {
			sl.flags |= flagRespSkip
		}
		ex.skipped[p] = true
		ex.core.stats.skipped.Add(1)
		ex.core.obs.InspectionSkipped(ex.rt.idx, sl.ra.a.idx, p)
		act = append(act[:k], act[k+1:]...)
	}
	ex.active[p] = act
	if ex.skipped[0] && p == protocol.PhaseRequest {
		ex.setHdr(hdrInspection, valueSkipped)
		ex.viewDirty = true
	}
	return in, complete, true
}

// bufIn is the buffer of phase p's body, holding the request body bytes
// read ahead for an inline body (inline.go), if any.
func (ex *Exchange) bufIn(p protocol.Phase) []byte {
	if p == protocol.PhaseRequest {
		if ex.inl.pre {
			return ex.inReq
		}
		return ex.inReq[:0]
	}
	return ex.inResp[:0]
}

func (ex *Exchange) setBufIn(p protocol.Phase, b []byte) {
	if p == protocol.PhaseRequest {
		ex.inReq = b
	} else {
		ex.inResp = b
	}
}

// inspectBuffered runs a whole buffered body through the active agents
// chunk by chunk, appending what they let through to out.
func (ex *Exchange) inspectBuffered(p protocol.Phase, in, out []byte) ([]byte, bool) {
	size := ex.chunkSize(p)
	for first := true; first || len(in) > 0; first = false {
		n := min(size, len(in))
		last := n == len(in)
		data, ok := ex.runChunk(p, in[:n], last, false)
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
func (ex *Exchange) runChunk(p protocol.Phase, data []byte, last, stream bool) ([]byte, bool) {
	src := ex.source(p)
	for k := 0; k < len(ex.active[p]); {
		if len(data) == 0 && !last {
			break // dropped: the agents after see nothing of it
		}
		i := int(ex.active[p][k])
		sl := &ex.slots[i]
		m := &ex.chunk
		m.Reset()
		m.ChunkIndex = sl.chunk[p]
		sl.chunk[p]++
		m.Data = data
		m.IsLast = last
		m.TotalSize = ex.total[p]
		m.Progress = src.n
		t0 := clock.Mono()
		w := ex.streamWait(t0)
		if !stream {
			var ok bool
			if w, ok = ex.agentWait(sl, t0); !ok {
				ex.core.obs.AgentEvent(ex.rt.idx, sl.ra.a.idx, p, true, observe.OutcomeTimeout, 0)
				if !ex.failure(i, p, true, errBudget(sl)) {
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
		ex.agentTime[observe.PhaseIndex(p, true)] += d
		if k == 0 {
			ex.inspected[p] += int64(len(data))
		}
		if err != nil {
			ex.core.obs.AgentEvent(ex.rt.idx, sl.ra.a.idx, p, true, outcomeOf(err), d)
			if !ex.failure(i, p, true, err) {
				return nil, false
			}
			continue // failure dropped agent i from the pipeline
		}
		sl.ra.a.brk.success(&ex.core.log, sl.ra.a.name)
		final := false
		var mut *protocol.BodyMutation
		if reply.Type == protocol.TypeBodyMutation {
			mut = &reply.Mutation
			ex.core.obs.AgentEvent(ex.rt.idx, sl.ra.a.idx, p, true, observe.OutcomeContinue, d)
		} else {
			dec := &reply.Decision
			if p == protocol.PhaseRequest && dec.HasRequestBodyMutation {
				mut = &dec.RequestBodyMutation
			} else if p == protocol.PhaseResponse && dec.HasResponseBodyMutation {
				mut = &dec.ResponseBodyMutation
			}
			if !ex.decide(i, p, true, dec, d) {
				return nil, false
			}
			if sl.flags&flagFailed != 0 {
				continue // an invalid reply failed open
			}
			final = dec.Final()
		}
		if mut != nil && mut.Action != protocol.MutationPass {
			ex.mutated[p] += int64(len(data))
			data = ex.mutate(data, mut)
		}
		if final || last {
			if p == protocol.PhaseRequest {
				sl.flags |= flagReqBodyDone
			} else {
				sl.flags |= flagRespBodyDone
			}
			a := ex.active[p]
			ex.active[p] = append(a[:k], a[k+1:]...)
			continue
		}
		k++
	}
	return data, true
}

// mutate applies a BodyMutation to the chunk data.
func (ex *Exchange) mutate(data []byte, m *protocol.BodyMutation) []byte {
	switch m.Action {
	case protocol.MutationDrop:
		return data[:0]
	case protocol.MutationReplace:
		// The reply's buffer is reused by the exchange's next event.
		ex.mut = append(ex.mut[:0], m.Data...)
		return ex.mut
	}
	return data
}

// bodyReadFailed handles a failed body read before anything was sent on.
func (ex *Exchange) bodyReadFailed(p protocol.Phase, err error) {
	if ex.canceled() {
		ex.outcome = "client gone"
		return
	}
	if p == protocol.PhaseRequest {
		ex.logFields(ex.core.log.Debug()).Err(err).Msg("reading request body failed")
		ex.closeConn = true
		if staleConn(err) {
			// The client closed or reset its connection mid-body.
			ex.outcome = "client gone"
			ex.cancel()
			return
		}
		ex.outcome = "request body read failed"
		switch {
		case errors.Is(err, errTooLarge):
			ex.local(413, "request entity too large", "body over max_request_body")
		case errors.Is(err, errTooSlow):
			ex.core.stats.bodyTooSlow.Add(1)
			ex.local(408, "request timeout", "request body below body_min_rate")
		case IsTimeout(err):
			ex.local(408, "request timeout", ex.outcome)
		default:
			ex.local(400, "bad request", ex.outcome)
		}
		return
	}
	ex.upstreamFailed(err)
}

// upstreamBody fills the body of the upstream request from the plan.
func (ex *Exchange) upstreamBody(r *UpstreamRequest) {
	r.Body, r.BodyLen, r.ContentLength = nil, 0, nil
	switch ex.plan {
	case planNone:
		// Only a Content-Length the client sent (an engine may report
		// one for a request that had none).
		if cl := ex.head.ContentLengthValue; len(cl) > 0 && ex.clientCL {
			r.ContentLength = cl
		}
		return
	case planWhole:
		r.BodyLen = int64(len(ex.reqOut))
	case planPass:
		r.BodyLen = max(ex.head.ContentLength, -1)
	case planPipe:
		r.BodyLen = -1
	}
	r.Body = (*bodyProducer)(ex)
}

// bodyProducer is the Exchange as the upstream's BodyProducer.
type bodyProducer Exchange

// Next implements BodyProducer: the request body as the plan says, read
// from the client and passed through the streaming agents as the
// upstream writes it.
func (p *bodyProducer) Next() ([]byte, bool, error) {
	ex := (*Exchange)(p)
	if ex.plan == planWhole {
		if len(ex.shadowConvs) > 0 {
			ex.shadowRequestBody(ex.reqOut)
		}
		return ex.reqOut, true, nil
	}
	pipe := ex.plan == planPipe
	var buf []byte
	if ex.upReq.Duplex {
		// Produced while the response is read (UpstreamRequest.Duplex):
		// not in the response's chunk buffer.
		if cap(ex.dup) < passChunk {
			ex.dup = make([]byte, passChunk)
		}
		buf = ex.dup[:passChunk]
	} else {
		buf = ex.chunkBuf(protocol.PhaseRequest)
	}
	n, last, err := ex.reqSrc.read(buf, ex.fill(protocol.PhaseRequest))
	if err != nil {
		return nil, false, &clientError{err: err}
	}
	data := buf[:n]
	if pipe && len(ex.active[0]) > 0 {
		var ok bool
		if data, ok = ex.runChunk(protocol.PhaseRequest, data, last, true); !ok {
			return nil, false, errStopped
		}
	}
	if last {
		ex.reqBodyEOF = true
	}
	if len(ex.shadowConvs) > 0 && (len(data) > 0 || last) {
		total := ex.total[0]
		if pipe {
			total = -1 // the agents may change its length
		}
		ex.shadowBody(protocol.PhaseRequest, data, last, total)
	}
	return data, last, nil
}

// Consumed implements BodyProducer: bytes of the client's body were taken
// (a whole body was read before the upstream was contacted, and can go
// again).
func (p *bodyProducer) Consumed() bool {
	ex := (*Exchange)(p)
	return (ex.plan == planPass || ex.plan == planPipe) && ex.reqSrc.n > 0
}

// responseBody relays the upstream's response body: nothing, a buffered
// and inspected body, or a stream the front end pulls as it writes
// (NextBody).
func (ex *Exchange) responseBody() {
	h := ex.res.Head()
	body := ex.res.Body()
	cl := h.ContentLength
	r := &ex.resp
	if !ex.respHasBody {
		ex.upBodyDone = body == nil || cl == 0
		ex.finishResponseHeaders()
		return
	}
	src := &ex.respSrc
	src.src = body
	src.joined = &ex.core.stats.joined[1]
	ex.total[1] = cl
	if cl < 0 {
		ex.total[1] = -1
	}
	src.want = ex.total[1]
	limit, ok := ex.collectBodyAgents(protocol.PhaseResponse)
	if !ok {
		return
	}
	if limit > 0 {
		in, complete, ok := ex.bufferBody(protocol.PhaseResponse, limit, cl)
		if !ok {
			return
		}
		if complete {
			ex.upBodyDone = true
			out, ok := ex.inspectBuffered(protocol.PhaseResponse, in, ex.respOut[:0])
			ex.respOut = out
			if !ok {
				return
			}
			if len(ex.shadowConvs) > 0 {
				ex.shadowBody(protocol.PhaseResponse, out, true, int64(len(out)))
			}
			ex.finishResponseHeaders()
			r.Body = out
			return
		}
		src.prefix = in
	}
	if len(ex.active[1]) == 0 && cl >= 0 && cl <= passChunk && len(src.prefix) == 0 {
		ex.smallResponse(cl)
		return
	}
	size := cl
	if len(ex.active[1]) > 0 || cl < 0 {
		size = -1
	}
	ex.finishResponseHeaders()
	ex.finishIdle(protocol.PhaseResponse)
	ex.respStarted = true
	ex.streaming = true
	r.Kind, r.Size = ResponseStream, size
}

// smallResponse relays a response body of known length no agent inspects
// and no larger than one read buffer as a plain body: read whole, then
// written with the headers in one write. Streaming it instead costs a
// stream object's round of calls, deadline extensions and a deferred
// finish (~7% of a proxied request with a small body); a body this small
// gains nothing from streaming. A failure while reading it is still a
// clean 502, since nothing has been sent.
func (ex *Exchange) smallResponse(cl int64) {
	buf := ex.chunkBuf(protocol.PhaseResponse)[:cl]
	n, last, err := ex.respSrc.read(buf, true)
	if err == nil && !last && int64(n) == cl {
		// Full, but the end not seen yet: it must come now.
		var one [1]byte
		var m int
		m, last, err = ex.respSrc.read(one[:], true)
		if err == nil && m != 0 {
			err = io.ErrUnexpectedEOF
		}
	}
	if err == nil && (!last || int64(n) != cl) {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		ex.bodyReadFailed(protocol.PhaseResponse, err)
		return
	}
	ex.upBodyDone = true
	if len(ex.shadowConvs) > 0 {
		ex.shadowBody(protocol.PhaseResponse, buf[:n], true, int64(n))
	}
	ex.finishResponseHeaders()
	ex.resp.Body = buf[:n]
}

// NextBody produces the next piece of a streamed response body (the
// upstream's, through the agents); last ends it. An error means the
// response is to be cut off (Aborted) or the client is gone.
func (ex *Exchange) NextBody() ([]byte, bool, error) {
	buf := ex.chunkBuf(protocol.PhaseResponse)
	n, last, err := ex.respSrc.read(buf, ex.fill(protocol.PhaseResponse))
	if err != nil {
		if !ex.canceled() {
			if ok, suppressed := ex.rt.up.LogAllow(); ok {
				e := ex.logFields(ex.core.log.Error()).Str("upstream", ex.rt.up.Name()).Err(err)
				if suppressed > 0 {
					e = e.Uint64("suppressed", suppressed)
				}
				e.Msg("upstream response body failed")
			}
			ex.outcome = "upstream body failed"
			ex.upFailed = true
			ex.abortResponse()
		}
		return nil, false, errStopped
	}
	data := buf[:n]
	if len(ex.active[1]) > 0 {
		var ok bool
		if data, ok = ex.runChunk(protocol.PhaseResponse, data, last, true); !ok {
			if !ex.respAbort {
				ex.abortResponse()
			}
			return nil, false, errStopped
		}
	}
	if last {
		ex.upBodyDone = true
	}
	if len(ex.shadowConvs) > 0 && (len(data) > 0 || last) {
		ex.shadowBody(protocol.PhaseResponse, data, last, ex.resp.Size)
	}
	return data, last, nil
}

// StreamDone ends a streamed response: written bytes went out; err is
// the write error that stopped it (the client stopped reading), if any.
// Finish follows.
func (ex *Exchange) StreamDone(written int64, err error) {
	ex.written = written
	if err != nil && !ex.respAbort {
		// The client stopped reading: its connection failed.
		ex.ClientGone()
	}
}

// ClientGone ends the request for a client that went away.
func (ex *Exchange) ClientGone() {
	ex.outcome = "client gone"
	ex.cancel()
}
