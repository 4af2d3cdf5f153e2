package exchange

import (
	"github.com/zentinelproxy/sidecar/protocol"
)

// The client's response is staged here, whatever made it (the upstream,
// an agent's block or redirect, the sidecar itself), as a status, a
// header list and a body; the front end writes it out once Serve
// returns. Agents' response header operations apply to that list, so
// every response-phase agent sees the response as the agents before it
// left it, and the front end's engine is touched once.

// ResponseKind says how a staged response goes out.
type ResponseKind uint8

// Kinds of responses.
const (
	// ResponseNone: nothing to write (the client is gone, or the
	// connection went to a tunnel).
	ResponseNone ResponseKind = iota
	// ResponseFull: Status, Fields and the whole Body.
	ResponseFull
	// ResponseStream: Status and Fields, then the body from NextBody,
	// Size bytes long (-1: unknown), until StreamDone.
	ResponseStream
)

// Response is the response staged for the client. Its slices are valid
// until Finish (StreamDone for a streamed one).
type Response struct {
	Kind ResponseKind
	// Status and Reason (empty: the status's usual phrase) of the status
	// line; the front end answers in its own protocol version.
	Status int
	Reason []byte
	// Fields are the header fields, in order; Content-Length among them
	// is the upstream's and is replaced by the body's framing.
	Fields []Field
	Body   []byte
	Size   int64
	// Origin, when set, is the upstream response whose head the staged
	// one is, unchanged but for the fields named in Dropped (the
	// hop-by-hop ones): a front end on the upstream's own HTTP engine may
	// copy the head from it rather than field by field (for fasthttp, a
	// quarter of the cost). Front ends that cannot ignore it.
	Origin  UpstreamResponse
	Dropped [][]byte
}

// respState is the response staged for the client and the agents' say
// over it.
type respState struct {
	resp Response
	// Response header operations decided before the response existed;
	// their names and values live in opArena.
	respOps        []stashedOp
	respOpsApplied int // respOps already applied to resp
	respStashed    int // header block bytes the stashed operations add
	opArena        []byte
	respStarted    bool // the response head went to the front end (streaming)
	answered       bool // a local response (block, redirect, error) is staged
	respSeen       bool // the upstream response head was read
	respHasBody    bool // the upstream response has a body to relay
	respAbort      bool // cut the response off (headers already sent)
}

// stashedOp is a response header operation decided before the response
// exists; name and value live in opArena.
type stashedOp struct {
	op               protocol.HeaderOpKind
	slot             uint8
	nameOff, nameLen uint32
	valOff, valLen   uint32
}

func (r *respState) reset() {
	*r = respState{
		resp:    Response{Fields: trimList(r.resp.Fields, 4096), Dropped: trimNames(r.resp.Dropped)},
		respOps: r.respOps[:0],
		opArena: trim(r.opArena, 64<<10),
	}
}

func trimNames(l [][]byte) [][]byte {
	if cap(l) > 256 {
		return nil
	}
	clear(l)
	return l[:0]
}

// Response is the response staged for the client (Serve returned).
func (ex *Exchange) Response() *Response { return &ex.resp }

// Aborted reports that the response is to be cut off: its head is out,
// so the connection is closed mid-body (a close-delimited body's close
// is a reset, so that the client cannot take it for complete).
func (ex *Exchange) Aborted() bool { return ex.respAbort }

// stage replaces the staged response with a new one of status: the
// stashed operations apply to it again (local, block, redirect).
func (ex *Exchange) stage(status int) *Response {
	r := &ex.resp
	*r = Response{Kind: ResponseFull, Status: status, Fields: r.Fields[:0], Dropped: r.Dropped[:0]}
	ex.respOpsApplied = 0
	return r
}

// local stages a response made by the sidecar (errors, no route). The
// body is generic: details go to the log only.
func (ex *Exchange) local(status int, body, outcome string) {
	r := ex.stage(status)
	r.Fields = append(r.Fields, Field{Name: hdrContentType, Value: valueTextPlain})
	r.Body = s2b(body)
	ex.finishResponseHeaders()
	ex.answered = true
	ex.rejected = true
	ex.status = status
	if ex.outcome == "" {
		ex.outcome = outcome
	}
}

// finishResponseHeaders applies the response operations decided earlier
// and the sidecar's markers to the client response.
func (ex *Exchange) finishResponseHeaders() {
	ex.applyStashed()
	if ex.rs.nAllowed > 0 || len(ex.rs.rlFields) > 0 {
		ex.limitFields()
	}
	r := &ex.resp
	for i := 0; i < ex.nFailed; i++ {
		r.Fields = append(r.Fields, Field{Name: hdrFailOpen, Value: ex.slots[ex.failedOpen[i]].ra.a.nameB})
	}
	if ex.skipped[0] || ex.skipped[1] {
		r.Fields = setFirst(r.Fields, hdrInspection, valueSkipped)
	}
	if ex.nFailed > 0 || ex.skipped[0] || ex.skipped[1] {
		r.Origin = nil
	}
}

// setFirst sets the value of the first header called name, or adds one
// (the others of the name stay).
func setFirst(list []Field, name, value []byte) []Field {
	for k := range list {
		if eqFold(list[k].Name, name) {
			list[k].Value = value
			return list
		}
	}
	return append(list, Field{Name: name, Value: value})
}

// fromUpstream stages the upstream's response head for the client: its
// status and reason, its headers minus the hop-by-hop ones (and those
// its Connection header names). Nothing is copied: the fields point into
// the upstream's response, which lives until Finish.
func (ex *Exchange) fromUpstream(h *ResponseHead) {
	r := ex.stage(h.Status)
	r.Reason = h.Reason
	r.Origin = ex.res
	list := r.Fields
	names := ex.scratch[:0] // what Connection fields name (rare: a second pass)
	for _, f := range h.Fields {
		if hopName(f.Name) {
			if foldEq(f.Name, "connection") {
				names = appendTokens(names, f.Value)
			}
			r.Dropped = append(r.Dropped, f.Name)
			continue
		}
		list = append(list, f)
	}
	if len(names) > 0 {
		kept := list[:0]
		for _, f := range list {
			if listed(names, f.Name) {
				r.Dropped = append(r.Dropped, f.Name)
				continue
			}
			kept = append(kept, f)
		}
		list = kept
	}
	r.Fields = list
	ex.scratch = names[:0]
	if len(ex.rt.ext.respOps) > 0 {
		ex.applyRouteRespOps()
	}
}

// block stages agent i's block response. A block once the response has
// started streaming can only cut the response off.
func (ex *Exchange) block(i int, d *protocol.Decision, status int) {
	ex.core.stats.blocked.Add(1)
	ex.decider = i
	ex.redirected = false
	ex.outcome = "blocked by " + ex.slots[i].ra.a.name
	if ex.respStarted {
		ex.abortResponse()
		return
	}
	r := ex.stage(status)
	hasType := false
	var ref refusals
	for k := range d.BlockHeaders {
		bh := &d.BlockHeaders[k]
		// The same rules as every agent header operation, Location's
		// included: a block cannot send what a redirect may not.
		if ex.refuseOp(&ref, protocol.HeaderAdd, bh.Name, bh.Value) {
			continue
		}
		if string(ex.scratch) == "content-type" {
			hasType = true
		}
		r.Fields = append(r.Fields, Field{Name: bh.Name, Value: bh.Value})
	}
	ex.reportRefused(i, &ref)
	if !hasType && len(d.Body) > 0 {
		r.Fields = append(r.Fields, Field{Name: hdrContentType, Value: valueTextPlain})
	}
	r.Body = d.Body
	ex.finishResponseHeaders()
	ex.answered = true
	ex.status = status
}

// redirect stages agent i's redirect.
func (ex *Exchange) redirect(i int, d *protocol.Decision, status int) {
	ex.core.stats.blocked.Add(1)
	ex.decider = i
	ex.redirected = true
	ex.outcome = "redirected by " + ex.slots[i].ra.a.name
	if ex.respStarted {
		ex.abortResponse()
		return
	}
	r := ex.stage(status)
	r.Fields = append(r.Fields, Field{Name: hdrLocation, Value: d.RedirectURL})
	ex.finishResponseHeaders()
	ex.answered = true
	ex.status = status
}

// abortResponse marks a response that must be cut off: its headers are
// already on their way, so the connection is closed mid-body.
func (ex *Exchange) abortResponse() {
	ex.respAbort = true
	ex.core.stats.aborted.Add(1)
}

// buildResponseView fills ex.rsh from the client response as it stands.
func (ex *Exchange) buildResponseView() {
	r := &ex.resp
	m := &ex.rsh
	hdrs := m.Headers[:0]
	names := ex.names[:0]
	for _, f := range r.Fields {
		start := len(names)
		names = lower(names, f.Name)
		hdrs = append(hdrs, protocol.Header{Name: names[start:len(names):len(names)], Value: f.Value})
	}
	ex.names = names
	m.Headers = hdrs
	m.StatusCode = r.Status
	m.HasBody = ex.respHasBody
}
