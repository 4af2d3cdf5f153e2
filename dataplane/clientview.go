package dataplane

import (
	"github.com/zentinelproxy/sidecar/protocol"
)

// The client's view of a request (feature client_request, docs/protocol.md
// §4.5). An agent that negotiated it is shown the request as the client
// sent it, not as the sidecar forwards it: a WAF's rules are written for a
// web server's view ("POST without Content-Length or Transfer-Encoding",
// "Connection: keep-alive,keep-alive", "GET http://localhost HTTP/1.1"),
// and the upstream's header list answers them wrongly (hop-by-hop and
// framing headers gone, X-Forwarded-* added, the target rewritten).
//
// The view's header list (rs.chdr) is the client's raw header block in
// its order, values byte for byte, with two exceptions that keep one
// request one meaning: the Host is the canonical host the route matched
// (at the Host's place; first for an absolute-form target without Host),
// and the client's X-Sidecar-* headers are dropped. It is built on the
// first event that needs it, pointing into fasthttp's raw header block (no
// copy), and the agents' request header operations apply to it as to the
// upstream's list: every applied operation is recorded in rs.opLog
// (reqOp, applyReqOps) and replayed onto rs.chdr when the view is built,
// so the chain rule (each agent sees the request as the agents before it
// left it) holds for both views, and a route whose agents all take the
// upstream's view never builds this one.

// loggedOp is an applied request header operation; name and value live in
// rs.hdrArena.
type loggedOp struct {
	op          protocol.HeaderOpKind
	name, value []byte
}

// requestView makes rs.rh the view the next agent takes: the client's
// (client) or the upstream's. It rebuilds only when the request changed
// or the other view is in rs.rh.
func (rs *reqState) requestView(client bool) {
	if !rs.viewDirty && rs.viewClient == client {
		return
	}
	if client {
		rs.buildClientView()
	} else {
		rs.buildRequestView()
	}
}

// clientHeaders brings rs.chdr up to date: built from the client's header
// block on first use, then the operations not yet applied.
func (rs *reqState) clientHeaders() {
	if !rs.chdrBuilt {
		rs.chdrBuilt = true
		list := rs.chdr[:0]
		host := rs.hostBuf // canonical, port kept (canonicalHost); empty: none
		sawHost := false
		for k, v := range rs.ctx.Request.Header.AllInOrder() {
			switch {
			case foldEq(k, "host"):
				if sawHost {
					continue // fasthttp refuses a second Host; never two here
				}
				sawHost = true
				v = host
			case len(k) >= 10 && foldEq(k[:10], "x-sidecar-"):
				continue // only the sidecar speaks for itself
			}
			list = append(list, hkv{name: k, value: v})
		}
		if !sawHost && len(host) > 0 {
			// An absolute-form target without Host: its authority is the
			// host, shown first.
			list = append(list, hkv{})
			copy(list[1:], list)
			list[0] = hkv{name: nameHost, value: host}
		}
		rs.chdr = list
	}
	ops := rs.opLog[rs.chdrOps:]
	rs.chdrOps = len(rs.opLog)
	if len(ops) <= smallBatch {
		for _, o := range ops {
			rs.chdr = applyIn(rs.chdr, o.op, o.name, o.value)
		}
		return
	}
	x := &rs.hidx
	x.build(rs.chdr, len(ops))
	list := rs.chdr
	for _, o := range ops {
		list = x.apply(list, o.op, o.name, o.value)
	}
	rs.chdr = compact(list)
}

// buildClientView fills rs.rh with the client's view of the request.
func (rs *reqState) buildClientView() {
	rs.clientHeaders()
	h := &rs.ctx.Request.Header
	m := &rs.rh
	hdrs := m.Headers[:0]
	names := rs.names[:0]
	for _, kv := range rs.chdr {
		start := len(names)
		names = lower(names, kv.name)
		hdrs = append(hdrs, protocol.Header{Name: names[start:len(names):len(names)], Value: kv.value})
	}
	rs.names = names
	m.Headers = hdrs
	m.Method = h.Method()
	m.URI = h.RequestURI()
	m.RequestTarget = m.URI
	if len(rs.rawTarget) > 0 {
		m.RequestTarget = rs.rawTarget
	}
	m.HasBody = rs.hasReqBody
	md := &m.Metadata
	rs.commonMetadata(md)
	// What the upstream receives instead, from its header list as it
	// stands (the agents' operations included); a repeated field is
	// joined as RFC 9110 section 5.3 combines it.
	fwd := rs.fwdBuf[:0]
	var trace []byte
	var vals [3][]byte
	var nvals [3]int
	for _, kv := range rs.hdr {
		k := -1
		switch {
		case eqFold(kv.name, hdrXForwardedFor):
			k = 0
		case eqFold(kv.name, hdrXForwardedProto):
			k = 1
		case eqFold(kv.name, hdrXForwardedHost):
			k = 2
		case trace == nil && eqFold(kv.name, hdrTraceparent):
			trace = kv.value
		}
		if k < 0 {
			continue
		}
		nvals[k]++
		if nvals[k] == 1 {
			vals[k] = kv.value
			continue
		}
		// A join is written at the end of fwd; an earlier one of the
		// same name stays there unused until the buffer is reset.
		start := len(fwd)
		fwd = append(fwd, vals[k]...)
		fwd = append(fwd, commaSpace...)
		fwd = append(fwd, kv.value...)
		vals[k] = fwd[start:len(fwd):len(fwd)]
	}
	rs.fwdBuf = fwd
	md.Traceparent = trace
	md.UpstreamHost = rs.upHost
	md.ForwardedFor, md.ForwardedProto, md.ForwardedHost = vals[0], vals[1], vals[2]
	rs.viewDirty = false
	rs.viewClient = true
}

// commonMetadata fills the metadata both views carry alike.
func (rs *reqState) commonMetadata(md *protocol.Metadata) {
	md.CorrelationID = rs.corr
	md.ClientIP = rs.clientIP
	md.ClientPort = rs.clientPort
	md.Protocol = rs.ctx.Request.Header.Protocol()
	md.ServerName = rs.host
	md.RouteID = rs.rt.nameB
	md.UpstreamID = rs.rt.up.NameBytes()
	md.Timestamp = timestamp(rs.start)
	rs.serverAddr()
	md.ServerIP, md.ServerPort, md.ListenerID = rs.srvIP, rs.srvPort, rs.lstName
	rs.setTLSMetadata(md)
}

// serverAddr works out the listener facts of the request once: the local
// address of the client's connection and the listener's name. The
// address costs a look at the connection's cached net.Addr and its text
// (tens of nanoseconds), paid only by requests that have agents.
func (rs *reqState) serverAddr() {
	if rs.srvDone {
		return
	}
	rs.srvDone = true
	rs.srvIP, rs.srvPort = tcpAddrText(rs.srvBuf[:0], rs.ctx.LocalAddr())
	if rs.lst != nil {
		rs.lstName = append(rs.lstName[:0], rs.lst.cfg.Name...)
	}
}
