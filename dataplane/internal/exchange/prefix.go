package exchange

import (
	"bytes"
	"slices"

	"github.com/zentinelproxy/sidecar/internal/observe"
	"github.com/zentinelproxy/sidecar/protocol"
)

// Bodies over a buffered agent's limit (over_limit prefix and stream).
//
// prefix: the agent decides on the first `limit` bytes of the request
// body, read before the upstream is contacted, as a buffered body whose
// last chunk says is_last (total_size tells the real length when known).
// The rest goes to the upstream without being shown to it, and the
// upstream request says X-Sidecar-Inspection: partial. Memory stays at
// the buffer limit however large the body.
//
// stream: the agent keeps inspecting: it is switched to streaming for
// this body, so it gets every chunk, the buffered ones first, and each is
// forwarded once answered.

// flagReqPrefix marks an agent that inspects only the request body's
// prefix (slot flags, exchange.go).
const flagReqPrefix uint16 = 1 << 15 // the top bit: far from the iota flags

var valuePartial = []byte("partial")

// overLimit applies agent i's over-limit action, when it has one other
// than reject and skip, to a body of phase p over its limit. It reports
// whether it did; kept says the agent stays in the phase's pipeline.
func (ex *Exchange) overLimit(i int, p protocol.Phase) (handled, kept bool) {
	sl := &ex.slots[i]
	pol := &sl.ra.body[p]
	switch {
	case pol.stream:
		sl.mode[p] = bodyStreaming
		sl.ra.a.fo.stream.Add(1)
		return true, true
	case pol.prefix && p == protocol.PhaseRequest:
		sl.flags |= flagReqPrefix
		sl.ra.a.fo.prefix.Add(1)
		return true, false
	}
	return false, false
}

// inspectPrefixes runs each prefix agent, in chain order, over the first
// limit bytes of the buffered request body in, and returns the body's
// buffered part as they left it. mutated reports that it changed (its
// length may differ from the client's framing).
func (ex *Exchange) inspectPrefixes(in []byte) (out []byte, mutated, ok bool) {
	maxLim := 0
	for i := 0; i < ex.nslots; i++ {
		if sl := &ex.slots[i]; sl.flags&flagReqPrefix != 0 && sl.flags&flagFailed == 0 {
			maxLim = max(maxLim, sl.limit(protocol.PhaseRequest))
		}
	}
	if maxLim == 0 {
		return in, false, true
	}
	// A body whose Content-Length is over every limit was not read ahead:
	// read the largest prefix now.
	src := &ex.reqSrc
	for len(in) < maxLim && !src.eof {
		want := min(maxLim-len(in), 64<<10)
		in = slices.Grow(in, want)
		n, _, err := src.read(in[len(in):len(in)+want], true)
		in = in[:len(in)+n]
		if err != nil {
			ex.setBufIn(protocol.PhaseRequest, in)
			ex.bodyReadFailed(protocol.PhaseRequest, err)
			return nil, false, false
		}
	}
	ex.setBufIn(protocol.PhaseRequest, in)
	var any bool
	var rest [maxAgents]uint8
	nrest := copy(rest[:], ex.active[0])
	for i := 0; i < ex.nslots; i++ {
		sl := &ex.slots[i]
		if sl.flags&flagReqPrefix == 0 || sl.flags&flagFailed != 0 {
			continue
		}
		any = true
		lim := min(sl.limit(protocol.PhaseRequest), len(in))
		ex.active[0] = append(ex.active[0][:0], uint8(i))
		got, ok := ex.inspectBuffered(protocol.PhaseRequest, in[:lim], ex.reqOut[:0])
		ex.reqOut = got
		if !ok {
			return nil, false, false
		}
		if !bytes.Equal(got, in[:lim]) {
			mutated = true
		}
		// The next agent sees the body as this one left it: swap the
		// buffers (got, then the part not shown, becomes the input).
		got = append(got, in[lim:]...)
		ex.reqOut, ex.inReq = in[:0], got
		in = got
	}
	ex.active[0] = append(ex.active[0][:0], rest[:nrest]...)
	if any && !ex.skipped[0] {
		ex.setHdr(hdrInspection, valuePartial)
		ex.viewDirty = true
	}
	return in, mutated, true
}

// Bodies returns the over-limit counters of every current agent with a
// prefix or stream action on some route.
func (c *Core) Bodies() []observe.BodyStatus {
	t := c.tbl.Load()
	on := make(map[*agentEntry]bool)
	for _, r := range t.routes {
		for k := range r.agents {
			ra := &r.agents[k]
			for _, b := range ra.body {
				if b.prefix || b.stream {
					on[ra.a] = true
				}
			}
		}
	}
	var out []observe.BodyStatus
	for _, a := range t.agents {
		if on[a] {
			out = append(out, observe.BodyStatus{Agent: a.name, Prefix: a.fo.prefix.Load(), Stream: a.fo.stream.Load()})
		}
	}
	return out
}
