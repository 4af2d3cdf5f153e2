// Package wafagent is a deliberately tiny web-application-firewall agent:
// it blocks requests whose query string or body contains a script tag or a
// classic SQL injection probe. It shows request body inspection: the agent
// asks for each chunk (needs_more) and decides on the whole body.
//
// It is an example, not a WAF: real rule sets normalize far more encodings.
package wafagent

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// rule is one forbidden pattern, lower-case, matched after URL decoding.
type rule struct {
	id, tag string
	pattern []byte
}

var rules = []rule{
	{"xss-1", "xss", []byte("<script")},
	{"xss-2", "xss", []byte("javascript:")},
	{"sqli-1", "sqli", []byte("' or 1=1")},
	{"sqli-2", "sqli", []byte("' or '1'='1")},
	{"sqli-3", "sqli", []byte("union select")},
}

// carry is how many raw bytes of a chunk are kept to find a pattern split
// across chunks: the longest pattern, percent-encoded.
var carry = func() int {
	n := 0
	for _, r := range rules {
		n = max(n, 3*len(r.pattern))
	}
	return n
}()

// Handler is the WAF agent. Create it with New.
type Handler struct {
	mu     sync.Mutex
	bodies map[uint64]*bodyState
	swept  time.Time
}

type bodyState struct {
	tail []byte
	seen time.Time
}

// New returns the WAF agent.
func New() *Handler { return &Handler{bodies: make(map[uint64]*bodyState)} }

var _ sdk.Handler = (*Handler)(nil)

// Capabilities implements sdk.Handler: request headers and bodies.
func (h *Handler) Capabilities() protocol.Capabilities {
	return protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true, SupportsCancellation: true}
}

// OnRequestHeaders implements sdk.Handler: check the query string.
func (h *Handler) OnRequestHeaders(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
	if i := bytes.IndexByte(m.URI, '?'); i >= 0 {
		if r := match(m.URI[i+1:]); r != nil {
			block(d, r)
		}
	}
	return nil
}

// OnRequestBody implements sdk.Handler: check each chunk together with the
// end of the previous one; allow after the last chunk.
func (h *Handler) OnRequestBody(_ context.Context, m *protocol.BodyChunk, reply *sdk.BodyReply) error {
	now := time.Now()
	h.mu.Lock()
	st := h.bodies[m.RequestID]
	if st == nil {
		h.sweep(now)
		st = &bodyState{}
		h.bodies[m.RequestID] = st
	}
	st.seen = now
	h.mu.Unlock()

	scan := append(st.tail, m.Data...)
	r := match(scan)
	if r == nil && !m.IsLast {
		st.tail = append(st.tail[:0], scan[max(0, len(scan)-carry):]...)
		reply.NeedMore()
		return nil
	}
	h.mu.Lock()
	delete(h.bodies, m.RequestID)
	h.mu.Unlock()
	if r != nil {
		block(&reply.Decision, r)
	}
	return nil
}

// OnResponseHeaders implements sdk.Handler (not asked for).
func (h *Handler) OnResponseHeaders(context.Context, *protocol.ResponseHeaders, *protocol.Decision) error {
	return nil
}

// OnResponseBody implements sdk.Handler (not asked for).
func (h *Handler) OnResponseBody(_ context.Context, _ *protocol.BodyChunk, r *sdk.BodyReply) error {
	r.Pass()
	return nil
}

// sweep forgets bodies whose request went away mid-body. h.mu is held.
func (h *Handler) sweep(now time.Time) {
	const ttl = 2 * time.Minute
	if now.Sub(h.swept) < ttl/4 {
		return
	}
	h.swept = now
	for id, st := range h.bodies {
		if now.Sub(st.seen) > ttl {
			delete(h.bodies, id)
		}
	}
}

var blockBody = []byte("request blocked by wafagent\n")

func block(d *protocol.Decision, r *rule) {
	d.Kind = protocol.DecisionBlock
	d.Status = 403
	d.Body = blockBody
	d.BlockHeaders = d.BlockHeaders.Add([]byte("x-blocked-by"), []byte("wafagent"))
	d.Audit.Tags = append(d.Audit.Tags, []byte(r.tag))
	d.Audit.RuleIDs = append(d.Audit.RuleIDs, []byte(r.id))
}

// match URL-decodes b (twice, against double encoding), lower-cases it and
// returns the first rule it breaks.
func match(b []byte) *rule {
	l := bytes.ToLower(unescape(unescape(b)))
	for i := range rules {
		if bytes.Contains(l, rules[i].pattern) {
			return &rules[i]
		}
	}
	return nil
}

// unescape decodes %XX and '+' and keeps malformed escapes as they are, so
// that one stray '%' cannot switch decoding off for a whole body.
func unescape(b []byte) []byte {
	if bytes.IndexByte(b, '%') < 0 && bytes.IndexByte(b, '+') < 0 {
		return b
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '+':
			out = append(out, ' ')
		case c == '%' && i+2 < len(b) && unhex(b[i+1]) >= 0 && unhex(b[i+2]) >= 0:
			out = append(out, byte(unhex(b[i+1])<<4|unhex(b[i+2])))
			i += 2
		default:
			out = append(out, c)
		}
	}
	return out
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c - 'a' + 10)
	case 'A' <= c && c <= 'F':
		return int(c - 'A' + 10)
	}
	return -1
}
