package http1

import (
	"bytes"
)

// Request-head normalisation that depends on fasthttp's parse: what the
// front end checks and rewrites after fasthttp parsed a head and before
// the exchange sees it (the exchange then canonicalises the Host and
// builds the header lists, the same for any front end). fasthttp already
// refuses most broken framing (two Content-Length values, unknown
// transfer codings, bare CR, NUL and controls in names and values, a
// duplicate Host); this closes what a reverse proxy in front of a
// security control must close on top:
//
//   - An absolute-form target ("GET http://admin.example/x") names the
//     authority that counts (RFC 9112 section 3.2.2: it replaces Host).
//     It is rewritten to origin-form with that authority as Host before
//     routing, so the route, the agents and the upstream all see the same
//     host and path. A target with userinfo, a fragment, another scheme or
//     no authority is refused with 400. "*" passes for OPTIONS only. An
//     origin-form target with a fragment ("/public#/../admin") is refused
//     too: a client never sends one (RFC 9110 section 7.1), and a server
//     that reads '#' as a path byte would clean it to another path than
//     the one the route matched.
//   - A folded header line (obs-fold, RFC 9112 section 5.2) is refused
//     with 400: fasthttp would join it to the previous header, which is
//     allowed, but a line that starts with whitespace is more often an
//     attempt to hide a header from one parser than a client from 1999.
//
// The exchange refuses the rest (a Host that is not a valid authority;
// Transfer-Encoding with Content-Length) and honours "close" anywhere in
// a Connection token list.

// normalizeTarget rewrites an absolute-form request target to origin-form
// and its authority into Host. It returns false for a target the sidecar
// refuses.
func (r *request) normalizeTarget() bool {
	req := &r.ctx.Request
	h := &req.Header
	uri := h.RequestURI()
	if len(uri) > 0 && uri[0] == '/' {
		return bytes.IndexByte(uri, '#') < 0
	}
	if len(uri) == 1 && uri[0] == '*' {
		return h.IsOptions()
	}
	authority, path, ok := splitAbsolute(uri)
	if !ok {
		return false
	}
	// The rewritten target and host are copied before fasthttp's buffers
	// they point into are overwritten.
	buf := append(r.targetBuf[:0], authority...)
	n := len(buf)
	if len(path) == 0 || path[0] == '?' {
		buf = append(buf, '/')
	}
	buf = append(buf, path...)
	r.targetBuf = buf
	h.SetHostBytes(buf[:n])
	req.SetRequestURIBytes(buf[n:])
	r.l.stats.absoluteForm.Add(1)
	return true
}

// splitAbsolute splits an absolute http(s) URI into its authority and
// the rest (path and query). Userinfo, fragments, other schemes and an
// empty authority are refused; the authority is checked as the Host it
// becomes (by the exchange), so a bad one is counted as a bad Host.
func splitAbsolute(uri []byte) (authority, rest []byte, ok bool) {
	switch {
	case len(uri) > 7 && foldEq(uri[:7], "http://"):
		uri = uri[7:]
	case len(uri) > 8 && foldEq(uri[:8], "https://"):
		uri = uri[8:]
	default:
		return nil, nil, false
	}
	end := len(uri)
	for i, c := range uri {
		if c == '/' || c == '?' {
			end = i
			break
		}
	}
	authority, rest = uri[:end], uri[end:]
	for _, c := range uri {
		if c == '#' {
			return nil, nil, false
		}
	}
	if len(authority) == 0 || bytes.IndexByte(authority, '@') >= 0 {
		return nil, nil, false
	}
	return authority, rest, true
}

// hasObsFold reports whether a raw header block has a line that starts
// with a space or tab (a continuation of the previous header).
func hasObsFold(raw []byte) bool {
	folded, _ := headLines(raw)
	return folded
}

// headLines reports, in one pass over a raw header block, whether a line
// starts with a space or tab (obs-fold) and whether a line ends with a
// bare LF. fasthttp's parse takes a bare LF for a line end, but the
// in-order field list the exchange reads (AllInOrder) needs CRLFs, and
// yields nothing for such a block ("X: 1\nContent-Length: 1\n\r\n"):
// a head that two readings of one parser see two ways is refused.
func headLines(raw []byte) (folded, bareLF bool) {
	for off := 0; ; {
		i := bytes.IndexByte(raw[off:], '\n')
		if i < 0 {
			return
		}
		i += off
		if i == 0 || raw[i-1] != '\r' {
			bareLF = true
		}
		if i+1 >= len(raw) {
			return
		}
		if c := raw[i+1]; c == ' ' || c == '\t' {
			folded = true
		}
		off = i + 1
	}
}

// foldEq compares b to the lower-case ASCII string s, ignoring b's case.
func foldEq(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}
