package dataplane

import (
	"bufio"
	"bytes"
	"strconv"

	"github.com/zentinelproxy/sidecar/protocol"
)

// The upstream request's headers are kept in a list of their own, built
// from the client's raw header block in its order and wire form, and the
// request head is written by hand. fasthttp's own request header would
// re-serialize what it understands (it parses Cookie headers and writes
// them back without their quotes, for one), and a proxy must forward what
// it does not change byte for byte.

// hkv is one upstream request header. Name and value point into the
// client's raw header block, static names, or reqState.hdrArena.
type hkv struct {
	name, value []byte
}

// keep copies b into the header arena. Slices handed out earlier stay
// valid when the arena grows: they keep the old array, which is never
// written again.
func (rs *reqState) keep(b []byte) []byte {
	start := len(rs.hdrArena)
	rs.hdrArena = append(rs.hdrArena, b...)
	return rs.hdrArena[start:len(rs.hdrArena):len(rs.hdrArena)]
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

// delHdr removes every header called name.
func (rs *reqState) delHdr(name []byte) { rs.hdr = delIn(rs.hdr, name) }

// setHdr replaces the headers called name with one (at the first one's
// place, or at the end). value must outlive the request.
func (rs *reqState) setHdr(name, value []byte) { rs.hdr = setIn(rs.hdr, name, value) }

// delIn removes every header called name from list.
func delIn(list []hkv, name []byte) []hkv {
	out := list[:0]
	for _, kv := range list {
		if !eqFold(kv.name, name) {
			out = append(out, kv)
		}
	}
	return out
}

// setIn replaces the headers called name in list with one (at the first
// one's place, or at the end).
func setIn(list []hkv, name, value []byte) []hkv {
	out := list[:0]
	found := false
	for _, kv := range list {
		if eqFold(kv.name, name) {
			if found {
				continue
			}
			found = true
			kv.value = value
		}
		out = append(out, kv)
	}
	if !found {
		out = append(out, hkv{name: name, value: value})
	}
	return out
}

// applyIn applies one request header operation to list; name and value
// must outlive the request.
func applyIn(list []hkv, op protocol.HeaderOpKind, name, value []byte) []hkv {
	switch op {
	case protocol.HeaderSet:
		return setIn(list, name, value)
	case protocol.HeaderAdd:
		return append(list, hkv{name: name, value: value})
	case protocol.HeaderRemove:
		return delIn(list, name)
	}
	return list
}

// reqOp applies an agent's (already validated) request header operation
// to the upstream request and records it for the client's view
// (clientview.go).
func (rs *reqState) reqOp(op protocol.HeaderOpKind, name, value []byte) {
	name = rs.keep(name)
	if op != protocol.HeaderRemove {
		value = rs.keep(value)
	} else {
		value = nil
	}
	rs.hdr = applyIn(rs.hdr, op, name, value)
	rs.opLog = append(rs.opLog, loggedOp{op: op, name: name, value: value})
	rs.viewDirty = true
}

// prepareRequest normalises the request head (normalize.go) and builds
// the upstream request's header list: the client's headers minus
// hop-by-hop ones (and those its Connection header names), minus the
// framing headers the body writer sets and the client's X-Sidecar-*
// headers, plus the forwarding headers. It returns false when the head is
// refused (a 400 is staged).
func (rs *reqState) prepareRequest() bool {
	if t := rs.ctx.Request.Header.RequestURI(); len(t) > 0 && t[0] != '/' {
		// The client's target, for agents that see the client's view
		// (clientview.go), before normalizeTarget rewrites an
		// absolute-form one: one copy for these rare requests.
		rs.rawTarget = append(rs.rawTarget[:0], t...)
	}
	if !rs.normalizeTarget() {
		rs.refuseHead(rejectTarget, "bad request target")
		return false
	}
	h := &rs.ctx.Request.Header
	if hasObsFold(h.RawHeaders()) {
		rs.refuseHead(rejectObsFold, "folded header line")
		return false
	}
	trust := rs.lst.cfg.TrustForwarded
	hdr := rs.hdr[:0]
	conn := rs.scratch[:0] // NUL-terminated names the Connection header lists
	xff := rs.xffBuf[:0]
	hasProto, hasHost, hasCL, hasTE := false, false, false, false
	traceHdrs := false // a traceparent or tracestate header (trace.go)
	for k, v := range h.AllInOrder() {
		switch {
		case hopName(k):
			switch {
			case foldEq(k, "connection"):
				conn = appendTokens(conn, v)
				if hasToken(v, "close") {
					rs.closeConn = true
				}
			case foldEq(k, "transfer-encoding"):
				hasTE = true
			}
			continue
		case foldEq(k, "content-length"):
			hasCL = true
			continue
		case len(k) >= 10 && foldEq(k[:10], "x-sidecar-"):
			// The sidecar's own markers: only the sidecar sets them, so
			// neither the agents nor the upstream take a client's for one.
			continue
		case foldEq(k, "host"), foldEq(k, "expect"):
			// Host is written first from the route's host mode; the body
			// writer frames the body; the listener answered 100-continue.
			continue
		case foldEq(k, "x-forwarded-for"):
			if trust {
				if len(xff) > 0 {
					xff = append(xff, commaSpace...)
				}
				xff = append(xff, v...)
			}
			continue
		case foldEq(k, "x-forwarded-proto"):
			if !trust {
				continue
			}
			hasProto = true
		case foldEq(k, "x-forwarded-host"):
			if !trust {
				continue
			}
			hasHost = true
		case foldEq(k, "forwarded"):
			// RFC 7239's form of the same claims (for=, proto=, host=).
			if !trust {
				continue
			}
		}
		if !traceHdrs && (eqFold(k, hdrTraceparent) || eqFold(k, hdrTracestate)) {
			traceHdrs = true
		}
		hdr = append(hdr, hkv{name: k, value: v})
	}
	rs.clientCL = hasCL
	if hasTE && hasCL {
		rs.hdr, rs.scratch, rs.xffBuf = hdr[:0], conn[:0], xff[:0]
		rs.refuseHead(rejectFraming, "both Transfer-Encoding and Content-Length")
		return false
	}
	if !rs.canonicalHost() {
		rs.hdr, rs.scratch, rs.xffBuf = hdr[:0], conn[:0], xff[:0]
		rs.refuseHead(rejectHost, "invalid Host")
		return false
	}
	rs.hdr = hdr
	eachName(conn, rs.delHdr)
	rs.scratch = conn[:0]
	var ip []byte
	// The connection's address, worked out once per connection: a
	// connection's peer never changes (no PROXY protocol here; one that
	// came would have to set it per connection too).
	if ec, ok := rs.ctx.Conn().(*eofConn); ok {
		ip, rs.clientPort = ec.clientAddr()
	} else {
		ip, rs.clientPort = tcpAddrText(rs.ipBuf[:0], rs.ctx.RemoteAddr())
	}
	rs.clientIP = ip
	if len(ip) > 0 {
		if len(xff) > 0 {
			xff = append(xff, commaSpace...)
		}
		xff = append(xff, ip...)
	}
	rs.xffBuf = xff
	if len(xff) > 0 {
		rs.hdr = append(rs.hdr, hkv{name: hdrXForwardedFor, value: xff})
	}
	if !hasProto {
		rs.hdr = append(rs.hdr, hkv{name: hdrXForwardedProto, value: rs.forwardedProto()})
	}
	if host := h.Host(); len(host) > 0 && !hasHost {
		rs.hdr = append(rs.hdr, hkv{name: hdrXForwardedHost, value: host})
	}
	if rs.corrGen {
		rs.setHdr(hdrXRequestID, rs.corr)
	}
	rs.traceContext(traceHdrs)
	rs.viewDirty = true
	return true
}

// canonicalHost rewrites the request's Host to its canonical form
// (canonHost) and sets rs.host, the form routing matches: from here on
// the route, the agents (the Host header and server_name), X-Forwarded-Host
// and the upstream's Host all carry one spelling of the host. It returns
// false for a Host the sidecar refuses. No Host (HTTP/1.0) stays none.
func (rs *reqState) canonicalHost() bool {
	h := &rs.ctx.Request.Header
	host := h.Host()
	if len(host) == 0 {
		return true
	}
	canon, n, ok := canonHost(rs.hostBuf[:0], host)
	if !ok {
		return false
	}
	rs.hostBuf = canon
	rs.host = canon[:n]
	if !bytes.Equal(canon, host) {
		// Only for a Host not already canonical: fasthttp copies it into
		// its own buffer, which has room (canonical is never longer).
		h.SetHostBytes(canon)
	}
	return true
}

// writeHead writes the upstream request line and headers, with the
// framing header of the planned body.
func (rs *reqState) writeHead(bw *bufio.Writer) error {
	h := &rs.ctx.Request.Header
	bw.Write(h.Method())
	bw.WriteByte(' ')
	bw.Write(h.RequestURI())
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.Write(rs.upHost)
	bw.Write(crlf)
	for _, kv := range rs.hdr {
		bw.Write(kv.name)
		bw.WriteString(": ")
		bw.Write(kv.value)
		bw.Write(crlf)
	}
	rs.upChunked = false
	switch rs.reqMode {
	case reqBodyNone:
		// Only a Content-Length the client sent (fasthttp reports 0 for
		// any method but GET and HEAD without one).
		if cl := h.PeekBytes(hdrContentLength); len(cl) > 0 && rs.clientCL {
			bw.WriteString("Content-Length: ")
			bw.Write(cl)
			bw.Write(crlf)
		}
	case reqBodyRaw:
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(len(rs.reqOut)), 10))
		bw.Write(crlf)
	case reqBodyPass:
		if cl := h.ContentLength(); cl >= 0 {
			bw.WriteString("Content-Length: ")
			bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(cl), 10))
			bw.Write(crlf)
		} else {
			rs.upChunked = true
		}
	case reqBodyPipe:
		rs.upChunked = true
	}
	if rs.upChunked {
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	}
	_, err := bw.Write(crlf)
	return err
}
