package dataplane

import (
	"slices"

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
	ready   bool  // the whole body is in rs.inReq and may be inlined
	used    bool  // chunk 0 went through the header phase: the body phase takes finishInlined
	pre     bool  // rs.inReq holds request body bytes read ahead
	shown   bool  // chunk 0 was shown to an agent (counted as inspected)
	err     error // a read error, reported by requestBody
	data    []byte
	n       int  // bytes of the body chunk 0 covers (len(data) before any mutation)
	last    bool // chunk 0 is the whole body
	next    int  // the slots below next have had their say on chunk 0
}

// inlineBefore prepares the RequestHeaders of agent i (rs.rh): with chunk
// 0 inline when i negotiated the feature and buffers the request body,
// else without. It may run chunk 0 through earlier agents first; false
// means the request ended there.
func (rs *reqState) inlineBefore(i int) bool {
	rs.rh.HasInlineBody = false
	sl := &rs.slots[i]
	if !rs.hasReqBody || !sl.caps.SupportsInlineBody || !sl.caps.HandlesRequestBody ||
		sl.mode[0] != bodyBuffered || sl.flags&(flagFailed|flagReqBodyDone|flagReqSkip) != 0 {
		return true
	}
	if !rs.inl.planned {
		rs.planInline()
	}
	if !rs.inl.ready {
		return true
	}
	// The request body agents up to i, as the body phase will list them.
	_, ok := rs.collectBodyAgentsTo(protocol.PhaseRequest, i+1)
	rs.phaseNow = PhaseRequestHeaders
	if !ok {
		return false
	}
	if !rs.inActive(protocol.PhaseRequest, i) {
		return true
	}
	rs.inl.used = true
	if rs.inl.next < i {
		data, ok := rs.chunk0Window(i)
		if !ok {
			return false
		}
		rs.inl.data = data
	}
	rs.inl.next = i + 1
	if len(rs.inl.data) == 0 && !rs.inl.last {
		return true // dropped before i: i never sees this chunk
	}
	if !rs.inl.shown {
		rs.inl.shown = true
		rs.inspected[0] += int64(len(rs.inl.data))
	}
	m := &rs.rh
	m.HasInlineBody = true
	m.InlineBody = protocol.BodyChunk{Data: rs.inl.data, IsLast: rs.inl.last, TotalSize: rs.total[0], Progress: rs.reqSrc.n}
	sl.chunk[0] = 1
	rs.srv.stats.inlined.Add(1)
	return true
}

// inlineAfter applies what agent i's Decision (already through decide)
// says about the inline chunk: its request_body_mutation, and the end of
// its say over the body when the Decision is final or the chunk the last.
func (rs *reqState) inlineAfter(i int, d *protocol.Decision) {
	sl := &rs.slots[i]
	if sl.flags&flagFailed != 0 {
		return // an invalid reply failed open
	}
	if d.HasRequestBodyMutation && d.RequestBodyMutation.Action != protocol.MutationPass {
		rs.mutated[0] += int64(len(rs.inl.data))
		rs.inl.data = rs.mutate(rs.inl.data, &d.RequestBodyMutation)
	}
	if d.Final() || rs.inl.last {
		sl.flags |= flagReqBodyDone
		rs.dropActiveIn(0, i)
	}
}

// planInline reads the request body ahead, once, for the first agent that
// would take it inline. The body is ready when all of it fits the limit
// of every agent that might buffer it; otherwise (or on a read error) the
// bytes read stay in rs.inReq for the usual path.
func (rs *reqState) planInline() {
	rs.inl.planned = true
	if rs.inl.err != nil {
		return // reading ahead already failed (bufferAhead)
	}
	cl := rs.reqSource()
	limit, chunk := rs.inlineBounds()
	if limit < 0 || (cl >= 0 && int64(cl) > int64(limit)) {
		return
	}
	src := &rs.reqSrc
	if err := rs.readAhead(limit); err != nil {
		rs.inl.err = err
		return
	}
	in := rs.inReq
	if !src.eof || len(in) > limit {
		return
	}
	rs.reqBodyEOF = true
	n := min(chunk, len(in))
	rs.inl.ready = true
	rs.inl.data, rs.inl.n, rs.inl.last = in[:n:n], n, n == len(in)
}

// inlineBounds returns the smallest request body limit among the route's
// agents that might buffer the body (-1: none) and the smallest chunk
// size among those that might inspect it. Agents not begun yet count by
// their configuration, so the bounds are never above what the body phase
// will use.
func (rs *reqState) inlineBounds() (limit, chunk int) {
	limit = -1
	for j := 0; j < rs.nslots; j++ {
		sl := &rs.slots[j]
		pol := &sl.ra.body[0]
		if sl.flags&flagFailed != 0 || pol.mode == bodyNone {
			continue
		}
		buffered := pol.mode != bodyStreaming
		if sl.ex != nil {
			if !sl.caps.HandlesRequestBody || sl.mode[0] == bodyNone {
				continue
			}
			buffered = sl.mode[0] == bodyBuffered
		} else if caps, known := rs.knownCaps(sl); known {
			if !caps.HandlesRequestBody {
				continue
			}
			if pol.mode == bodyAuto && caps.SupportsStreaming {
				buffered = false
			}
		}
		if chunk == 0 || pol.chunk < chunk {
			chunk = pol.chunk
		}
		if buffered && (limit < 0 || pol.limit < limit) {
			limit = pol.limit
		}
	}
	return limit, chunk
}

// chunk0Window runs chunk 0 through the active request body agents whose
// slots lie in [rs.inl.next, hi), in order, and returns what they let
// through (ok false: the request ended).
func (rs *reqState) chunk0Window(hi int) ([]byte, bool) {
	all := rs.active[0]
	a := 0
	for a < len(all) && int(all[a]) < rs.inl.next {
		a++
	}
	b := a
	for b < len(all) && int(all[b]) < hi {
		b++
	}
	if a == b {
		return rs.inl.data, true
	}
	// runChunk walks rs.active[0] and removes the agents whose say ends;
	// give it the window (capped, so removals stay inside it), then close
	// the gap they leave.
	rs.active[0] = all[a:b:b]
	counted := rs.inspected[0]
	data, ok := rs.runChunk(protocol.PhaseRequest, rs.inl.data, rs.inl.last, false)
	if rs.inl.shown {
		rs.inspected[0] = counted // chunk 0 is counted once
	}
	rs.inl.shown = true
	win := len(rs.active[0])
	n := copy(all[a+win:], all[b:])
	rs.active[0] = all[:a+win+n]
	return data, ok
}

// finishInlined is the body phase of a request whose chunk 0 went through
// the header phase: chunk 0 for the agents that have not had it, then the
// rest of the body chunk by chunk, as for any buffered body. The body is
// whole in rs.inReq.
func (rs *reqState) finishInlined() bool {
	out := rs.reqOut[:0]
	data, ok := rs.chunk0Window(maxAgents)
	if ok {
		out = append(out, data...)
		if !rs.inl.last {
			out, ok = rs.inspectBuffered(protocol.PhaseRequest, rs.inReq[rs.inl.n:], out)
		}
	}
	rs.reqOut = out
	if !ok {
		return false
	}
	rs.reqBodyEOF = true
	rs.reqMode = reqBodyRaw
	return true
}

// replayPreRead hands the request body bytes read ahead to the reader of
// the usual path.
func (rs *reqState) replayPreRead() {
	if rs.inl.pre {
		rs.reqSrc.prefix = rs.inReq
	}
}

// readAhead reads the request body into rs.inReq, after the bytes read
// ahead before (if any), until it ends or holds more than limit bytes.
func (rs *reqState) readAhead(limit int) error {
	src := &rs.reqSrc
	in := rs.inReq[:0]
	if rs.inl.pre {
		in = rs.inReq
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
	rs.inReq, rs.inl.pre = in, true
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
func (rs *reqState) bufferAhead() bool {
	if !rs.hasReqBody {
		return true
	}
	limit := rs.aheadLimit()
	if limit <= 0 {
		return true
	}
	if cl := rs.reqSource(); cl > limit {
		return true // over every limit: not buffered (bufferBody)
	}
	if err := rs.readAhead(limit); err != nil {
		if staleConn(err) {
			rs.bodyReadFailed(protocol.PhaseRequest, err)
			return false
		}
		rs.inl.err = err
	}
	return true
}

// aheadLimit is the largest request body limit among the route's agents
// that may see the body, or 0 when none does or one of them streams it.
// Agents not begun yet count by their configuration and what their
// connection announced (as in inlineBounds); one whose capabilities are
// unknown (no live connection) counts as buffering, by its limit.
func (rs *reqState) aheadLimit() int {
	limit := 0
	for j := 0; j < rs.nslots; j++ {
		sl := &rs.slots[j]
		pol := &sl.ra.body[0]
		if pol.mode == bodyNone {
			continue
		}
		caps, known := rs.knownCaps(sl)
		if known && !caps.HandlesRequestBody {
			continue
		}
		if pol.mode == bodyStreaming || (pol.mode == bodyAuto && known && caps.SupportsStreaming) {
			return 0
		}
		limit = max(limit, pol.limit)
	}
	return limit
}
