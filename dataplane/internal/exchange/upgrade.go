package exchange

import (
	"errors"
)

// Upgrade requests (WebSocket and any other Connection: upgrade
// protocol) go through the agents like every request: RequestHeaders
// shows the upgrade and connection headers, and a block is answered
// without contacting the upstream. The request is forwarded with
// Connection: upgrade and its Upgrade header; when the upstream answers
// 101 the front end relays it and hands the connection to a tunnel
// (Front.Tunnel): from then on the bytes go both ways uninspected, the
// agents see no frames, no response event and no body. Any other answer
// is an ordinary response, and the upstream connection is not reused.
//
// Only a bodiless GET over HTTP/1.1 whose Connection lists upgrade (and
// not close) and that has an Upgrade header naming no HTTP version (h2c,
// h2, HTTP/…: requests inside such a tunnel would bypass the agents) is
// an upgrade; anything else loses both headers as before (hop-by-hop).

var (
	hdrConnection = []byte("Connection")
	hdrUpgrade    = []byte("Upgrade")
	valueUpgrade  = []byte("Upgrade")
)

// prepareUpgrade decides whether the request is an upgrade and, when it
// is, puts Connection: upgrade and its Upgrade header back on the
// upstream request (prepareRequest removed them as hop-by-hop). It
// returns false when the upgrade is refused (a 503 is staged).
func (ex *Exchange) prepareUpgrade() bool {
	h := &ex.head
	if string(h.Method) != "GET" || !h.HTTP11 || ex.hasReqBody || ex.closeConn {
		return true
	}
	// Upgrade first: an ordinary request has none.
	up := ex.headField(hdrUpgrade)
	if len(up) == 0 {
		return true
	}
	if !hasToken(ex.headField(hdrConnection), "upgrade") || !validHeaderValue(up) || carriesHTTP(up) {
		return true
	}
	if !ex.front.TunnelRoom() {
		ex.local(503, "service unavailable", "too many tunnels")
		return false
	}
	ex.upgrade = true
	ex.hdr = append(ex.hdr, Field{Name: hdrConnection, Value: valueUpgrade}, Field{Name: hdrUpgrade, Value: up})
	ex.viewDirty = true
	return true
}

// carriesHTTP reports an Upgrade list that names HTTP itself (h2c, h2,
// HTTP/2.0 …): a tunnel for it would carry requests that no agent sees.
// Such a request goes on as an ordinary one, without the upgrade.
func carriesHTTP(up []byte) bool {
	for len(up) > 0 {
		var t []byte
		t, up = nextToken(up)
		// protocol-name ["/" protocol-version]
		for i, c := range t {
			if c == '/' {
				t = t[:i]
				break
			}
		}
		if foldEq(t, "h2c") || foldEq(t, "h2") || foldEq(t, "http") {
			return true
		}
	}
	return false
}

// validHeaderValue reports a value free of CR, LF and NUL (an HTTP/1
// parser already refuses them in a head; this keeps the 101 writer
// honest).
func validHeaderValue(v []byte) bool {
	for _, c := range v {
		if c == '\r' || c == '\n' || c == 0 {
			return false
		}
	}
	return true
}

// errUnaskedSwitch is an upstream's 101 to a request that asked for no
// upgrade: relaying it would leave the client and the proxy disagreeing
// about what the connection carries.
var errUnaskedSwitch = errors.New("upstream answered 101 Switching Protocols to a request without an upgrade")

// upgraded handles the upstream's answer to an upgrade request, or a 101
// to any other. It reports whether the request goes on as an ordinary
// response.
func (ex *Exchange) upgraded() bool {
	if ex.res.Head().Status != 101 {
		// The upstream refused the upgrade: relay its answer. Whether its
		// connection is reused is, as for any answer, what the answer
		// says (Connection: close) and whether its body was read whole.
		return true
	}
	if !ex.upgrade {
		return ex.upstreamFailed(errUnaskedSwitch)
	}
	ex.tunnel()
	return false
}

// tunnel takes over after a 101 from the upstream: it detaches the
// upstream connection from the request and hands both sides to the
// front end's tunnel. No response goes through the request path.
func (ex *Exchange) tunnel() {
	h := ex.res.Head()
	t, ok := ex.res.Detach()
	if !ok {
		ex.outcome = "client gone"
		return
	}
	// The client's 101: the upstream's headers minus the hop-by-hop ones
	// and Content-Length, then Connection: Upgrade and the upstream's
	// Upgrade (the request's when the upstream named none).
	t.Upgrade = nil
	for _, f := range h.Fields {
		if eqFold(f.Name, hdrUpgrade) {
			t.Upgrade = f.Value
			break
		}
	}
	if len(t.Upgrade) == 0 || !validHeaderValue(t.Upgrade) {
		t.Upgrade = ex.headField(hdrUpgrade)
	}
	fields := ex.resp.Fields[:0]
	for _, f := range h.Fields {
		if hopName(f.Name) || foldEq(f.Name, "content-length") {
			continue
		}
		fields = append(fields, f)
	}
	ex.resp.Fields = fields
	t.Fields = fields
	if err := ex.front.Tunnel(&t); err != nil {
		t.Release()
		ex.local(503, "service unavailable", "too many tunnels")
		return
	}
	ex.resp = Response{Kind: ResponseNone, Status: 101, Fields: fields[:0]}
	ex.status = 101
	ex.outcome = "upgraded"
}
