package exchange

import (
	"math/rand/v2"
)

// W3C trace context (https://www.w3.org/TR/trace-context/). A valid
// incoming traceparent, and its tracestate, go on to the agents (request
// metadata) and the upstream. A malformed traceparent is removed with its
// tracestate, a malformed tracestate alone, each counted. A request left
// without one gets a fresh traceparent when tracing.generate is set or
// spans are exported. When spans are exported and the request is
// sampled, the traceparent the agents and the upstream see names the
// sidecar's upstream span as parent.

var (
	hdrTraceparent = []byte("traceparent")
	hdrTracestate  = []byte("tracestate")
)

// traceparentLen is the length of a version 00 traceparent.
const traceparentLen = 55

// maxTracestateMembers is the W3C bound on tracestate list members.
const maxTracestateMembers = 32

// traceState is one request's trace context.
type traceState struct {
	traceID  [16]byte
	parentID [8]byte // the caller's span (zero when generated)
	spanID   [8]byte // the sidecar's request span
	upSpanID [8]byte // the sidecar's upstream span
	flags    byte
	valid    bool // the request has a trace context (incoming or generated)
	sampled  bool // its spans are exported
	buf      [traceparentLen]byte
	// Upstream span times (mono) and endpoint, set when sampled.
	upStart, upEnd int64
	upAddr         string
}

func isLowerHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f'
}

// decodeHex decodes lower-case hex src into dst (len(src) == 2*len(dst)).
func decodeHex(dst, src []byte) bool {
	for i := range dst {
		h, l := src[2*i], src[2*i+1]
		if !isLowerHex(h) || !isLowerHex(l) {
			return false
		}
		dst[i] = unhex(h)<<4 | unhex(l)
	}
	return true
}

func unhex(c byte) byte {
	if c <= '9' {
		return c - '0'
	}
	return c - 'a' + 10
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// parseTraceparent parses a traceparent header value strictly: version
// 00 is exactly 55 characters; a later version is at least that, and
// what follows the flags starts with "-"; version ff is invalid; hex is
// lower case; neither id may be all zeros.
func parseTraceparent(v []byte) (traceID [16]byte, parentID [8]byte, flags byte, ok bool) {
	if len(v) < traceparentLen || v[2] != '-' || v[35] != '-' || v[52] != '-' {
		return
	}
	var ver [1]byte
	if !decodeHex(ver[:], v[0:2]) || ver[0] == 0xff {
		return
	}
	if ver[0] == 0 && len(v) != traceparentLen {
		return
	}
	if len(v) > traceparentLen && v[traceparentLen] != '-' {
		return
	}
	var fl [1]byte
	if !decodeHex(traceID[:], v[3:35]) || !decodeHex(parentID[:], v[36:52]) || !decodeHex(fl[:], v[53:55]) {
		return
	}
	if allZero(traceID[:]) || allZero(parentID[:]) {
		return
	}
	return traceID, parentID, fl[0], true
}

// tracestateMembers checks a tracestate header value and counts its
// non-empty list members.
func tracestateMembers(v []byte) (int, bool) {
	n := 0
	for len(v) > 0 {
		var m []byte
		if i := indexByte(v, ','); i >= 0 {
			m, v = v[:i], v[i+1:]
		} else {
			m, v = v, nil
		}
		m = trimOWS(m)
		if len(m) == 0 {
			continue // empty members are allowed and ignored
		}
		if !validMember(m) {
			return n, false
		}
		n++
	}
	return n, true
}

func indexByte(b []byte, c byte) int {
	for i := range b {
		if b[i] == c {
			return i
		}
	}
	return -1
}

func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

func keyChar(c byte) bool {
	return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '*' || c == '/'
}

// validMember checks key=value: key is simple (lcalpha then up to 255
// key characters) or tenant@system (tenant: lcalpha or digit then up to
// 240; system: lcalpha then up to 13); value is 1–256 printable ASCII
// characters other than "," and "=", not ending in a space.
func validMember(m []byte) bool {
	eq := indexByte(m, '=')
	if eq <= 0 {
		return false
	}
	key, val := m[:eq], m[eq+1:]
	if at := indexByte(key, '@'); at >= 0 {
		tenant, system := key[:at], key[at+1:]
		if len(tenant) == 0 || len(tenant) > 241 || len(system) == 0 || len(system) > 14 {
			return false
		}
		if c := tenant[0]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9') {
			return false
		}
		if c := system[0]; !('a' <= c && c <= 'z') {
			return false
		}
		for _, c := range tenant[1:] {
			if !keyChar(c) {
				return false
			}
		}
		for _, c := range system[1:] {
			if !keyChar(c) {
				return false
			}
		}
	} else {
		if len(key) > 256 || !('a' <= key[0] && key[0] <= 'z') {
			return false
		}
		for _, c := range key[1:] {
			if !keyChar(c) {
				return false
			}
		}
	}
	if len(val) == 0 || len(val) > 256 || val[len(val)-1] == ' ' {
		return false
	}
	for _, c := range val {
		if c < 0x20 || c > 0x7e || c == ',' || c == '=' {
			return false
		}
	}
	return true
}

// randomID fills b with random bytes, never all zeros.
func randomID(b []byte) {
	for {
		for i := 0; i < len(b); i += 8 {
			x := rand.Uint64()
			for j := i; j < len(b) && j < i+8; j++ {
				b[j] = byte(x)
				x >>= 8
			}
		}
		if !allZero(b) {
			return
		}
	}
}

const hexDigits = "0123456789abcdef"

// formatTraceparent writes a version 00 traceparent into buf.
func formatTraceparent(buf *[traceparentLen]byte, traceID *[16]byte, spanID *[8]byte, flags byte) {
	buf[0], buf[1], buf[2] = '0', '0', '-'
	i := 3
	for _, c := range traceID {
		buf[i], buf[i+1] = hexDigits[c>>4], hexDigits[c&15]
		i += 2
	}
	buf[i] = '-'
	i++
	for _, c := range spanID {
		buf[i], buf[i+1] = hexDigits[c>>4], hexDigits[c&15]
		i += 2
	}
	buf[i], buf[i+1], buf[i+2] = '-', hexDigits[flags>>4], hexDigits[flags&15]
}

// traceContext checks the request's trace context headers in the
// upstream header list and settles the request's trace (see above).
// maybe is false when prepareRequest's scan of the headers saw neither:
// then, with tracing off, there is nothing to look at.
func (ex *Exchange) traceContext(maybe bool) {
	if !maybe && !ex.core.traceGen(ex.tbl) {
		return
	}
	tr := &ex.trace
	var tp []byte
	ntp, nts, members := 0, 0, 0
	tsOK := true
	for _, kv := range ex.hdr {
		switch len(kv.Name) {
		case len(hdrTraceparent):
			if eqFold(kv.Name, hdrTraceparent) {
				ntp++
				tp = kv.Value
			}
		case len(hdrTracestate):
			if eqFold(kv.Name, hdrTracestate) {
				nts++
				n, ok := tracestateMembers(kv.Value)
				members += n
				tsOK = tsOK && ok
			}
		}
	}
	if ntp == 0 && nts == 0 && !ex.core.traceGen(ex.tbl) {
		return
	}
	s := ex.core
	if ntp == 1 {
		tr.traceID, tr.parentID, tr.flags, tr.valid = parseTraceparent(tp)
	}
	if ntp > 0 && !tr.valid {
		// Several traceparent headers are as malformed as a bad one.
		s.stats.traceInvalid.Add(1)
		ex.delHdr(hdrTraceparent)
	}
	if nts > 0 && (!tr.valid || !tsOK || members > maxTracestateMembers) {
		if tr.valid {
			s.stats.tracestateInvalid.Add(1)
		}
		ex.delHdr(hdrTracestate)
	}
	exp := s.spans
	rewrite := false
	if !tr.valid {
		if !s.traceGen(ex.tbl) {
			return
		}
		randomID(tr.traceID[:])
		tr.parentID = [8]byte{}
		tr.flags = 0
		tr.valid = true
		if exp != nil && exp.sample() {
			tr.flags = 1
		}
		randomID(tr.spanID[:])
		s.stats.traceGenerated.Add(1)
		rewrite = true
	}
	if exp != nil && tr.flags&1 != 0 {
		tr.sampled = true
		if !rewrite {
			randomID(tr.spanID[:])
		}
		randomID(tr.upSpanID[:])
		formatTraceparent(&tr.buf, &tr.traceID, &tr.upSpanID, tr.flags&1)
		ex.setHdr(hdrTraceparent, tr.buf[:])
	} else if rewrite {
		formatTraceparent(&tr.buf, &tr.traceID, &tr.spanID, tr.flags&1)
		ex.setHdr(hdrTraceparent, tr.buf[:])
	} else if len(tp) != traceparentLen {
		// A later version: passed on as version 00, without whatever the
		// client put after the flags (up to a whole header buffer).
		formatTraceparent(&tr.buf, &tr.traceID, &tr.parentID, tr.flags&1)
		ex.setHdr(hdrTraceparent, tr.buf[:])
	}
}

// traceGen reports whether requests without a valid traceparent get one.
func (c *Core) traceGen(t *Table) bool {
	return c.spans != nil || (t != nil && t.cfg != nil && t.cfg.Tracing.Generate)
}
