package exchange

import (
	"unsafe"

	"github.com/zentinelproxy/sidecar/protocol"
)

// Headers the exchange sets or reads, in their canonical spelling.
var (
	hdrXForwardedFor   = []byte("X-Forwarded-For")
	hdrXForwardedProto = []byte("X-Forwarded-Proto")
	hdrXForwardedHost  = []byte("X-Forwarded-Host")
	hdrXRequestID      = []byte("X-Request-Id")
	hdrXCorrelationID  = []byte("X-Correlation-Id")
	hdrLocation        = []byte("Location")
	hdrContentType     = []byte("Content-Type")
	hdrContentLength   = []byte("Content-Length")
	nameHost           = []byte("host")
	nameContentLength  = []byte("content-length")

	hdrFailOpen   = []byte(HeaderFailOpen)
	hdrInspection = []byte(HeaderInspection)

	valueSkipped   = []byte("skipped")
	valueHTTP      = []byte("http")
	valueTextPlain = []byte("text/plain; charset=utf-8")
	commaSpace     = []byte(", ")
)

// Marker headers the dataplane adds.
const (
	// HeaderFailOpen is set on the upstream request and the response when
	// an agent failed open; one value per agent.
	HeaderFailOpen = "X-Sidecar-Fail-Open"
	// HeaderInspection is "skipped" when a body went uninspected because it
	// exceeded a buffered agent's limit.
	HeaderInspection = "X-Sidecar-Inspection"
)

// s2b is the bytes of s, shared: they must never be written to.
func s2b(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// hopByHop are the connection-level headers a proxy never forwards, in
// lower case, plus the Proxy-* family checked by prefix: what hopName
// checks, by length.
var hopByHop = []string{
	"connection", "keep-alive", "proxy-connection", "proxy-authenticate",
	"proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade",
}

// tchar is the token alphabet of RFC 9110 section 5.6.2.
var tchar = func() (t [256]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
	}
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

// validToken reports whether b is a non-empty HTTP token.
func validToken(b []byte) bool {
	if len(b) == 0 || len(b) > 256 {
		return false
	}
	for _, c := range b {
		if !tchar[c] {
			return false
		}
	}
	return true
}

// fieldVChar is what a header value may carry (RFC 9110 section 5.5):
// VCHAR, obs-text, SP and HTAB. Every other control byte is out, not only
// CR, LF and NUL: a DEL, ESC or VT that an agent slips into a value is
// forwarded by some servers, refused by others, and written raw into
// their logs and terminals.
var fieldVChar = func() (t [256]bool) {
	for c := 0x21; c <= 0xff; c++ {
		t[c] = c != 0x7f
	}
	t[' '], t['\t'] = true, true
	return t
}()

// validValue reports whether b is an RFC 9110 field-value: field-vchars,
// SP and HTAB, with no SP or HTAB at either end (a parser strips them, so
// the value an agent meant and the one the peer reads would differ).
func validValue(b []byte) bool {
	if n := len(b); n > 0 && (b[0] == ' ' || b[0] == '\t' || b[n-1] == ' ' || b[n-1] == '\t') {
		return false
	}
	for _, c := range b {
		if !fieldVChar[c] {
			return false
		}
	}
	return true
}

// lower appends the ASCII lower-case form of b to dst.
func lower(dst, b []byte) []byte {
	for _, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		dst = append(dst, c)
	}
	return dst
}

// refusal says why a header operation is refused ("" when it is allowed),
// for a name in any case: the fields no agent sets and no trailer section
// carries (TrailerAllowed).
func refusal(name []byte) string {
	switch {
	case hopName(name):
		return "hop-by-hop header"
	case foldEq(name, "host"):
		return "host header"
	case foldEq(name, "content-length"):
		return "content-length header"
	case len(name) >= 10 && foldEq(name[:10], "x-sidecar-"):
		return "sidecar marker header"
	}
	return ""
}

// checkOp validates one header operation; scratch receives the lower-case
// name. It returns the reason for a refusal or "".
func checkOp(scratch []byte, op *protocol.HeaderOp) ([]byte, string) {
	if !validToken(op.Name) {
		return scratch, "invalid header name"
	}
	scratch = lower(scratch[:0], op.Name)
	if r := refusal(scratch); r != "" {
		return scratch, r
	}
	if op.Op != protocol.HeaderRemove && !validValue(op.Value) {
		return scratch, "header value is not an RFC 9110 field-value"
	}
	if op.Op != protocol.HeaderRemove && string(scratch) == "location" && !validRedirect(op.Value) {
		return scratch, "location is not an absolute http(s) URL or a /path"
	}
	return scratch, ""
}

// hopName reports whether a header name (any case) is hop-by-hop. It
// runs for every field of every request and response: the length picks
// the one or two names to compare with (hopByHop, and the Proxy-*
// family).
func hopName(k []byte) bool {
	if len(k) > 6 && foldEq(k[:6], "proxy-") {
		return true
	}
	switch len(k) {
	case 2:
		return foldEq(k, "te")
	case 7:
		return foldEq(k, "trailer") || foldEq(k, "upgrade")
	case 10:
		return foldEq(k, "connection") || foldEq(k, "keep-alive")
	case 17:
		return foldEq(k, "transfer-encoding")
	}
	return false
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

// appendTokens appends the comma-separated tokens of a Connection value,
// NUL-terminated, skipping "close" and "keep-alive" (handled as flags).
func appendTokens(dst, v []byte) []byte {
	for len(v) > 0 {
		var tok []byte
		tok, v = nextToken(v)
		if len(tok) == 0 || foldEq(tok, "close") || foldEq(tok, "keep-alive") || !validToken(tok) {
			continue
		}
		dst = append(dst, tok...)
		dst = append(dst, 0)
	}
	return dst
}

// eachName calls f with each NUL-terminated name in names.
func eachName(names []byte, f func([]byte)) {
	for len(names) > 0 {
		i := 0
		for names[i] != 0 {
			i++
		}
		f(names[:i])
		names = names[i+1:]
	}
}

// listed reports whether name is one of the NUL-terminated names.
func listed(names, name []byte) bool {
	for len(names) > 0 {
		i := 0
		for names[i] != 0 {
			i++
		}
		if eqFold(names[:i], name) {
			return true
		}
		names = names[i+1:]
	}
	return false
}

// eqFold compares two header names ASCII case-insensitively.
func eqFold(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x != y {
			if 'A' <= x && x <= 'Z' {
				x += 'a' - 'A'
			}
			if 'A' <= y && y <= 'Z' {
				y += 'a' - 'A'
			}
			if x != y {
				return false
			}
		}
	}
	return true
}

// delIn removes every header called name from list.
func delIn(list []Field, name []byte) []Field {
	out := list[:0]
	for _, kv := range list {
		if !eqFold(kv.Name, name) {
			out = append(out, kv)
		}
	}
	return out
}

// setIn replaces the headers called name in list with one (at the first
// one's place, or at the end).
func setIn(list []Field, name, value []byte) []Field {
	out := list[:0]
	found := false
	for _, kv := range list {
		if eqFold(kv.Name, name) {
			if found {
				continue
			}
			found = true
			kv.Value = value
		}
		out = append(out, kv)
	}
	if !found {
		out = append(out, Field{Name: name, Value: value})
	}
	return out
}

// applyIn applies one request header operation to list; name and value
// must outlive the request.
func applyIn(list []Field, op protocol.HeaderOpKind, name, value []byte) []Field {
	switch op {
	case protocol.HeaderSet:
		return setIn(list, name, value)
	case protocol.HeaderAdd:
		return append(list, Field{Name: name, Value: value})
	case protocol.HeaderRemove:
		return delIn(list, name)
	}
	return list
}
