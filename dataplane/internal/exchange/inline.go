package exchange

import (
	"slices"

	"github.com/zentinelproxy/sidecar/internal/observe"
	"github.com/zentinelproxy/sidecar/protocol"
)

// Inline request bodies (feature inline_body, docs/protocol.md §7.4).
//
// A buffered request body is read before the upstream is contacted anyway;
// for an agent that negotiated inline_body it is read before that agent's
// RequestHeaders instead, and chunk 0 rides in the event: one round trip
// decides the headers and the chunk (for a body of one chunk, everything).
//
// Chunk 0 still passes the chain in order, each agent seeing it as the
// agents before it left it: when agent i gets it inline, the request body
// agents before i that have not seen it yet (those without the feature)
// get it first, as a chunk event, at that point of the header phase. The
// agents after the last inline one get it in the body phase, and every
// later chunk goes through the chain as before (finishInlined).
//
// The body is inlined only when the whole of it is read within the limit
// of every agent of the route that might buffer it, so that no agent can
// be over its limit (413, or skip): those cases, and a body that fails to
// read, take the usual path, with any bytes read ahead handed to it and a
// read error reported where the body phase would have met it.

// inlineState is a request's chunk 0 while it goes through the header
// phase. It is reset with the request (release).
type inlineState struct {
	planned bool  // planInline ran
	ready   bool  // the whole body is in ex.inReq and may be inlined
	used    bool  // chunk 0 went through the header phase: the body phase takes finishInlined
	pre     bool  // ex.inReq holds request body bytes read ahead
	shown   bool  // chunk 0 was shown to an agent (counted as inspected)
	err     error // a read error, reported by requestBody
	data    []byte
	n       int  // bytes of the body chunk 0 covers (len(data) before any mutation)
	last    bool // chunk 0 is the whole body
	next    int  // the slots below next have had their say on chunk 0
}

// inlineBefore prepares the RequestHeaders of agent i (ex.rh): with chunk
// 0 inline when i negotiated the feature and buffers the request body,
// else without. It may run chunk 0 through earlier agents first; false
// means the request ended there.
func (ex *Exchange) inlineBefore(i int) bool {
	ex.rh.HasInlineBody = false
	sl := &ex.slots[i]
	if !ex.hasReqBody || !sl.caps.SupportsInlineBody || !sl.caps.HandlesRequestBody ||
		sl.mode[0] != bodyBuffered || sl.flags&(flagFailed|flagReqBodyDone|flagReqSkip) != 0 {
		return true
	}
	if !ex.inl.planned {
		ex.planInline()
	}
	if !ex.inl.ready {
		return true
	}
	// The request body agents up to i, as the body phase will list them.
	_, ok := ex.collectBodyAgentsTo(protocol.PhaseRequest, i+1)
	ex.phaseNow = observe.PhaseRequestHeaders
	if !ok {
		return false
	}
	if !ex.inActive(protocol.PhaseRequest, i) {
		return true
	}
	ex.inl.used = true
	if ex.inl.next < i {
		data, ok := ex.chunk0Window(i)
		if !ok {
			return false
		}
		ex.inl.data = data
	}
	ex.inl.next = i + 1
	if len(ex.inl.data) == 0 && !ex.inl.last {
		return true // dropped before i: i never sees this chunk
	}
	if !ex.inl.shown {
		ex.inl.shown = true
		ex.inspected[0] += int64(len(ex.inl.data))
	}
	m := &ex.rh
	m.HasInlineBody = true
	m.InlineBody = protocol.BodyChunk{Data: ex.inl.data, IsLast: ex.inl.last, TotalSize: ex.total[0], Progress: ex.reqSrc.n}
	sl.chunk[0] = 1
	ex.core.stats.inlined.Add(1)
	return true
}

// inlineAfter applies what agent i's Decision (already through decide)
// says about the inline chunk: its request_body_mutation, and the end of
// its say over the body when the Decision is final or the chunk the last.
func (ex *Exchange) inlineAfter(i int, d *protocol.Decision) {
	sl := &ex.slots[i]
	if sl.flags&flagFailed != 0 {
		return // an invalid reply failed open
	}
	if d.HasRequestBodyMutation && d.RequestBodyMutation.Action != protocol.MutationPass {
		ex.mutated[0] += int64(len(ex.inl.data))
		ex.inl.data = ex.mutate(ex.inl.data, &d.RequestBodyMutation)
	}
	if d.Final() || ex.inl.last {
		sl.flags |= flagReqBodyDone
		ex.dropActiveIn(0, i)
	}
}

// planInline reads the request body ahead, once, for the first agent that
// would take it inline. The body is ready when all of it fits the limit
// of every agent that might buffer it; otherwise (or on a read error) the
// bytes read stay in ex.inReq for the usual path.
func (ex *Exchange) planInline() {
	ex.inl.planned = true
	if ex.inl.err != nil {
		return // reading ahead already failed (bufferAhead)
	}
	cl := ex.reqSource()
	limit, chunk := ex.inlineBounds()
	if limit < 0 || (cl >= 0 && cl > int64(limit)) {
		return
	}
	src := &ex.reqSrc
	if err := ex.readAhead(limit); err != nil {
		ex.inl.err = err
		return
	}
	in := ex.inReq
	if !src.eof || len(in) > limit {
		return
	}
	ex.reqBodyEOF = true
	n := min(chunk, len(in))
	ex.inl.ready = true
	ex.inl.data, ex.inl.n, ex.inl.last = in[:n:n], n, n == len(in)
}

// inlineBounds returns the smallest request body limit among the route's
// agents that might buffer the body (-1: none) and the smallest chunk
// size among those that might inspect it. Agents not begun yet count by
// their configuration (bodyRole), so the bounds are never above what the
// body phase will use.
func (ex *Exchange) inlineBounds() (limit, chunk int) {
	limit = -1
	for j := 0; j < ex.nslots; j++ {
		sl := &ex.slots[j]
		sees, buffers := ex.bodyRole(sl, protocol.PhaseRequest)
		if !sees {
			continue
		}
		if c := sl.ra.body[0].chunk; chunk == 0 || c < chunk {
			chunk = c
		}
		if l := sl.limit(protocol.PhaseRequest); buffers && (limit < 0 || l < limit) {
			limit = l
		}
	}
	return limit, chunk
}

// chunk0Window runs chunk 0 through the active request body agents whose
// slots lie in [ex.inl.next, hi), in order, and returns what they let
// through (ok false: the request ended).
func (ex *Exchange) chunk0Window(hi int) ([]byte, bool) {
	all := ex.active[0]
	a := 0
	for a < len(all) && int(all[a]) < ex.inl.next {
		a++
	}
	b := a
	for b < len(all) && int(all[b]) < hi {
		b++
	}
	if a == b {
		return ex.inl.data, true
	}
	// runChunk walks ex.active[0] and removes the agents whose say ends;
	// give it the window (capped, so removals stay inside it), then close
	// the gap they leave.
	ex.active[0] = all[a:b:b]
	counted := ex.inspected[0]
	data, ok := ex.runChunk(protocol.PhaseRequest, ex.inl.data, ex.inl.last, false)
	if ex.inl.shown {
		ex.inspected[0] = counted // chunk 0 is counted once
	}
	ex.inl.shown = true
	win := len(ex.active[0])
	n := copy(all[a+win:], all[b:])
	ex.active[0] = all[:a+win+n]
	return data, ok
}

// finishInlined is the body phase of a request whose chunk 0 went through
// the header phase: chunk 0 for the agents that have not had it, then the
// rest of the body chunk by chunk, as for any buffered body. The body is
// whole in ex.inReq.
func (ex *Exchange) finishInlined() bool {
	out := ex.reqOut[:0]
	data, ok := ex.chunk0Window(maxAgents)
	if ok {
		out = append(out, data...)
		if !ex.inl.last {
			out, ok = ex.inspectBuffered(protocol.PhaseRequest, ex.inReq[ex.inl.n:], out)
		}
	}
	ex.reqOut = out
	if !ok {
		return false
	}
	ex.reqBodyEOF = true
	ex.plan = planWhole
	return true
}

// replayPreRead hands the request body bytes read ahead to the reader of
// the usual path.
func (ex *Exchange) replayPreRead() {
	if ex.inl.pre {
		ex.reqSrc.prefix = ex.inReq
	}
}

// readAhead reads the request body into ex.inReq, after the bytes read
// ahead before (if any), until it ends or holds more than limit bytes.
func (ex *Exchange) readAhead(limit int) error {
	src := &ex.reqSrc
	in := ex.inReq[:0]
	if ex.inl.pre {
		in = ex.inReq
	}
	var err error
	for !src.eof && len(in) <= limit {
		want := min(limit+1-len(in), 64<<10)
		in = slices.Grow(in, want)
		var n int
		n, _, err = src.read(in[len(in):len(in)+want], true)
		in = in[:len(in)+n]
		if err != nil {
			break
		}
	}
	ex.inReq, ex.inl.pre = in, true
	return err
}

// bufferAhead reads a request body that every agent of the route that
// will see it buffers, up to the largest of their limits, before the
// first agent exchange begins. An exchange holds one of its agent's
// in-flight slots (max_concurrent_requests) from the request headers on:
// were the body read after them, a client uploading slowly would hold the
// slot for the whole upload, and a few such clients would starve the
// agent of slots for every other request. Buffering is for this: nginx
// reads a buffered body before it contacts its upstream the same way.
//
// A body that some agent streams is not read ahead: that agent is to see
// it as it comes, and holds its slot meanwhile; so does every request
// whose body goes to the upstream unbuffered while an agent waits for the
// response. body_min_rate bounds how long a slow client can do that.
//
// A read that fails here is reported where the body phase would have met
// it (requestBody, as for an inline body): the agents still see the
// request's headers, and the client gets its 408 or 413 after them. A
// client that went away ends the request at once.
func (ex *Exchange) bufferAhead() bool {
	if !ex.hasReqBody {
		return true
	}
	limit := ex.aheadLimit()
	if limit <= 0 {
		return true
	}
	if cl := ex.reqSource(); cl > int64(limit) {
		return true // over every limit: not buffered (bufferBody)
	}
	if err := ex.readAhead(limit); err != nil {
		if staleConn(err) {
			ex.bodyReadFailed(protocol.PhaseRequest, err)
			return false
		}
		ex.inl.err = err
	}
	return true
}

// aheadLimit is the largest request body limit among the route's agents
// that may see the body, or 0 when none does or one of them streams it.
// Agents not begun yet count by their configuration and what their
// connection announced (bodyRole); one whose capabilities are unknown (no
// live connection) counts as buffering, by its limit.
func (ex *Exchange) aheadLimit() int {
	limit := 0
	for j := 0; j < ex.nslots; j++ {
		sl := &ex.slots[j]
		sees, buffers := ex.bodyRole(sl, protocol.PhaseRequest)
		if !sees {
			continue
		}
		if !buffers {
			return 0
		}
		limit = max(limit, sl.limit(protocol.PhaseRequest))
	}
	return limit
}
