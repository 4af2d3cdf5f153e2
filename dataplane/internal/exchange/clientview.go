package exchange

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
// The view's header list (ex.chdr) is the client's raw header block in
// its order, values byte for byte, with two exceptions that keep one
// request one meaning: the Host is the canonical host the route matched
// (at the Host's place; first for an absolute-form target without Host),
// and the client's X-Sidecar-* headers are dropped. It is built on the
// first event that needs it, pointing into the head's fields (no
// copy), and the agents' request header operations apply to it as to the
// upstream's list: every applied operation is recorded in ex.opLog
// (reqOp, applyReqOps) and replayed onto ex.chdr when the view is built,
// so the chain rule (each agent sees the request as the agents before it
// left it) holds for both views, and a route whose agents all take the
// upstream's view never builds this one.

// loggedOp is an applied request header operation; name and value live in
// ex.hdrArena.
type loggedOp struct {
	op          protocol.HeaderOpKind
	name, value []byte
}

// requestView makes ex.rh the view the next agent takes: the client's
// (client) or the upstream's. It rebuilds only when the request changed
// or the other view is in ex.rh.
func (ex *Exchange) requestView(client bool) {
	if !ex.viewDirty && ex.viewClient == client {
		return
	}
	if client {
		ex.buildClientView()
	} else {
		ex.buildRequestView()
	}
}

// clientHeaders brings ex.chdr up to date: built from the client's header
// block on first use, then the operations not yet applied.
func (ex *Exchange) clientHeaders() {
	if !ex.chdrBuilt {
		ex.chdrBuilt = true
		list := ex.chdr[:0]
		host := ex.hostBuf // canonical, port kept (canonicalHost); empty: none
		sawHost := false
		for _, f := range ex.head.Fields {
			k, v := f.Name, f.Value
			switch {
			case foldEq(k, "host"):
				if sawHost {
					continue // a front end refuses a second Host; never two here
				}
				sawHost = true
				v = host
			case len(k) >= 10 && foldEq(k[:10], "x-sidecar-"):
				continue // only the sidecar speaks for itself
			}
			list = append(list, Field{Name: k, Value: v})
		}
		if !sawHost && len(host) > 0 {
			// An absolute-form target without Host: its authority is the
			// host, shown first.
			list = append(list, Field{})
			copy(list[1:], list)
			list[0] = Field{Name: nameHost, Value: host}
		}
		ex.chdr = list
	}
	ops := ex.opLog[ex.chdrOps:]
	ex.chdrOps = len(ex.opLog)
	if len(ops) <= smallBatch {
		for _, o := range ops {
			ex.chdr = applyIn(ex.chdr, o.op, o.name, o.value)
		}
		return
	}
	x := &ex.hidx
	x.build(ex.chdr, len(ops))
	list := ex.chdr
	for _, o := range ops {
		list = x.apply(list, o.op, o.name, o.value)
	}
	ex.chdr = compact(list)
}

// buildClientView fills ex.rh with the client's view of the request.
func (ex *Exchange) buildClientView() {
	ex.clientHeaders()
	h := &ex.head
	m := &ex.rh
	hdrs := m.Headers[:0]
	names := ex.names[:0]
	for _, kv := range ex.chdr {
		start := len(names)
		names = lower(names, kv.Name)
		hdrs = append(hdrs, protocol.Header{Name: names[start:len(names):len(names)], Value: kv.Value})
	}
	ex.names = names
	m.Headers = hdrs
	m.Method = h.Method
	// uri is the target the upstream gets (a route's rewrite applied) in
	// both views; request_target is the client's.
	m.URI = ex.fwdTarget()
	m.RequestTarget = h.Target
	if len(h.RawTarget) > 0 {
		m.RequestTarget = h.RawTarget
	}
	m.HasBody = ex.hasReqBody
	md := &m.Metadata
	ex.commonMetadata(md)
	// What the upstream receives instead, from its header list as it
	// stands (the agents' operations included); a repeated field is
	// joined as RFC 9110 section 5.3 combines it.
	fwd := ex.fwdBuf[:0]
	var trace []byte
	var vals [3][]byte
	var nvals [3]int
	for _, kv := range ex.hdr {
		k := -1
		switch {
		case eqFold(kv.Name, hdrXForwardedFor):
			k = 0
		case eqFold(kv.Name, hdrXForwardedProto):
			k = 1
		case eqFold(kv.Name, hdrXForwardedHost):
			k = 2
		case trace == nil && eqFold(kv.Name, hdrTraceparent):
			trace = kv.Value
		}
		if k < 0 {
			continue
		}
		nvals[k]++
		if nvals[k] == 1 {
			vals[k] = kv.Value
			continue
		}
		// A join is written at the end of fwd; an earlier one of the
		// same name stays there unused until the buffer is reset.
		start := len(fwd)
		fwd = append(fwd, vals[k]...)
		fwd = append(fwd, commaSpace...)
		fwd = append(fwd, kv.Value...)
		vals[k] = fwd[start:len(fwd):len(fwd)]
	}
	ex.fwdBuf = fwd
	md.Traceparent = trace
	md.UpstreamHost = ex.upHost
	md.ForwardedFor, md.ForwardedProto, md.ForwardedHost = vals[0], vals[1], vals[2]
	ex.viewDirty = false
	ex.viewClient = true
}

// commonMetadata fills the metadata both views carry alike.
func (ex *Exchange) commonMetadata(md *protocol.Metadata) {
	c := ex.conn
	md.CorrelationID = ex.corr
	md.ClientIP = c.ClientIP
	md.ClientPort = c.ClientPort
	md.Protocol = ex.head.Proto
	md.ServerName = ex.host
	md.RouteID = ex.rt.nameB
	md.UpstreamID = ex.rt.up.NameBytes()
	md.Timestamp = timestamp(ex.start)
	md.ServerIP, md.ServerPort, md.ListenerID = c.ServerIP, c.ServerPort, ex.lst.Name
	md.Path = ex.head.Path
	if f := c.TLS; f != nil {
		md.TLSVersion, md.TLSCipher, md.TLSServerName = f.Version, f.Cipher, f.ServerName
		md.TLSClientSubject, md.TLSClientSAN = f.ClientSubject, f.ClientSAN
	} else {
		md.TLSVersion, md.TLSCipher, md.TLSServerName, md.TLSClientSubject, md.TLSClientSAN = nil, nil, nil, nil, nil
	}
}
