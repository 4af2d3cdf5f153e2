package exchange

import (
	"bytes"

	"github.com/zentinelproxy/sidecar/internal/observe"
	"github.com/zentinelproxy/sidecar/protocol"
)

// The upstream request's headers are kept in a list of their own, built
// from the client's header fields in their order and wire form; the
// upstream writes them as they are. An engine's own request header would
// re-serialize what it understands (fasthttp parses Cookie headers and
// writes them back without their quotes, for one), and a proxy must
// forward what it does not change byte for byte.

// reqFacts are what the request head says, normalised.
type reqFacts struct {
	host       []byte // canonical (canonHost), no port: routing, server_name
	hostFull   []byte // the Host as it stands: canonical with the client's port once canonicalHost ran
	hostBuf    []byte
	corr       []byte
	corrGen    bool
	corrBuf    [32]byte
	corrStore  []byte
	hasReqBody bool
	closeConn  bool // close the client connection after the response
	clientCL   bool // the client sent a Content-Length header
	upgrade    bool // an Upgrade request to tunnel on a 101 (upgrade.go)
	upHost     []byte
}

func (f *reqFacts) reset() {
	*f = reqFacts{hostBuf: f.hostBuf[:0], corrStore: f.corrStore[:0]}
}

// fwdHeaders are the header lists of the request: the upstream's (hdr),
// and the client's view with the agents' operations applied (chdr,
// clientview.go).
type fwdHeaders struct {
	hdr       []Field
	hdrArena  []byte
	xffBuf    []byte
	chdr      []Field    // the client's header list, the operations applied
	chdrBuilt bool       // chdr was built for this request
	chdrOps   int        // opLog entries applied to chdr
	opLog     []loggedOp // the agents' applied request header operations
	fwdBuf    []byte     // joined X-Forwarded-* values
	hidx      hdrIndex   // scratch for large batches of header operations
	scratch   []byte
}

func (h *fwdHeaders) reset() {
	opLog := h.opLog
	if cap(opLog) > 4096 {
		opLog = nil
	} else {
		clear(opLog)
		opLog = opLog[:0]
	}
	hidx := h.hidx
	if cap(hidx.slots) > 1<<14 {
		hidx = hdrIndex{}
	}
	*h = fwdHeaders{
		hdr:      h.hdr[:0],
		hdrArena: trim(h.hdrArena, 64<<10),
		xffBuf:   trim(h.xffBuf, 4<<10),
		chdr:     trimList(h.chdr, 4096),
		opLog:    opLog,
		fwdBuf:   trim(h.fwdBuf, 4<<10),
		hidx:     hidx,
		scratch:  trim(h.scratch, 64<<10),
	}
}

// keep copies b into the header arena. Slices handed out earlier stay
// valid when the arena grows: they keep the old array, which is never
// written again.
func (ex *Exchange) keep(b []byte) []byte {
	start := len(ex.hdrArena)
	ex.hdrArena = append(ex.hdrArena, b...)
	return ex.hdrArena[start:len(ex.hdrArena):len(ex.hdrArena)]
}

// delHdr removes every header called name.
func (ex *Exchange) delHdr(name []byte) { ex.hdr = delIn(ex.hdr, name) }

// setHdr replaces the headers called name with one (at the first one's
// place, or at the end). value must outlive the request.
func (ex *Exchange) setHdr(name, value []byte) { ex.hdr = setIn(ex.hdr, name, value) }

// reqOp applies an agent's (already validated) request header operation
// to the upstream request and records it for the client's view
// (clientview.go).
func (ex *Exchange) reqOp(op protocol.HeaderOpKind, name, value []byte) {
	name = ex.keep(name)
	if op != protocol.HeaderRemove {
		value = ex.keep(value)
	} else {
		value = nil
	}
	ex.hdr = applyIn(ex.hdr, op, name, value)
	ex.opLog = append(ex.opLog, loggedOp{op: op, name: name, value: value})
	ex.viewDirty = true
}

// prepareRequest builds the upstream request's header list from the
// head: the client's headers minus hop-by-hop ones (and those its
// Connection header names), minus the framing headers the upstream sets
// and the client's X-Sidecar-* headers, plus the forwarding headers; and
// canonicalises the Host. It returns false when the head is refused (a
// 400 is staged).
func (ex *Exchange) prepareRequest() bool {
	if bytes.IndexByte(ex.head.Path, '\\') >= 0 {
		// A backslash, raw (not a URI byte, RFC 3986) or as %5C: a
		// route matches `/public\..\admin` under /public, but an
		// upstream that reads a backslash as '/' (IIS, some Windows
		// stacks) cleans it to /admin, a path no route or agent checked.
		ex.refuseHead(observe.RejectTarget, "backslash in the path")
		return false
	}
	trust := ex.lst.TrustForwarded
	hdr := ex.hdr[:0]
	conn := ex.scratch[:0] // NUL-terminated names the Connection header lists
	xff := ex.xffBuf[:0]
	hasProto, hasHost, hasCL, hasTE := false, false, false, false
	traceHdrs := false // a traceparent or tracestate header (trace.go)
	for _, f := range ex.head.Fields {
		k, v := f.Name, f.Value
		switch {
		case hopName(k):
			switch {
			case foldEq(k, "connection"):
				conn = appendTokens(conn, v)
				if hasToken(v, "close") {
					ex.closeConn = true
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
			// Host is written first from the route's host mode; the
			// upstream frames the body; the front end answered
			// 100-continue.
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
		hdr = append(hdr, Field{Name: k, Value: v})
	}
	ex.clientCL = hasCL
	if hasTE && hasCL {
		ex.hdr, ex.scratch, ex.xffBuf = hdr[:0], conn[:0], xff[:0]
		ex.refuseHead(observe.RejectFraming, "both Transfer-Encoding and Content-Length")
		return false
	}
	if !ex.canonicalHost() {
		ex.hdr, ex.scratch, ex.xffBuf = hdr[:0], conn[:0], xff[:0]
		ex.refuseHead(observe.RejectHost, "invalid Host")
		return false
	}
	ex.hdr = hdr
	eachName(conn, ex.delHdr)
	ex.scratch = conn[:0]
	ip := ex.conn.ClientIP
	if len(ip) > 0 {
		if len(xff) > 0 {
			xff = append(xff, commaSpace...)
		}
		xff = append(xff, ip...)
	}
	ex.xffBuf = xff
	if len(xff) > 0 {
		ex.hdr = append(ex.hdr, Field{Name: hdrXForwardedFor, Value: xff})
	}
	if !hasProto {
		ex.hdr = append(ex.hdr, Field{Name: hdrXForwardedProto, Value: ex.forwardedProto()})
	}
	if host := ex.hostFull; len(host) > 0 && !hasHost {
		ex.hdr = append(ex.hdr, Field{Name: hdrXForwardedHost, Value: host})
	}
	if ex.corrGen {
		ex.setHdr(hdrXRequestID, ex.corr)
	}
	ex.traceContext(traceHdrs)
	ex.viewDirty = true
	return true
}

// canonicalHost puts the request's Host in its canonical form
// (canonHost) and sets ex.host, the form routing matches: from here on
// the route, the agents (the Host header and server_name),
// X-Forwarded-Host and the upstream's Host all carry one spelling of the
// host. It returns false for a Host the sidecar refuses. No Host
// (HTTP/1.0) stays none.
func (ex *Exchange) canonicalHost() bool {
	host := ex.head.Host
	if len(host) == 0 {
		return true
	}
	canon, n, ok := canonHost(ex.hostBuf[:0], host)
	if !ok {
		return false
	}
	ex.hostBuf = canon
	ex.host, ex.hostFull = canon[:n], canon
	return true
}

var valueHTTPS = []byte("https")

// forwardedProto is the X-Forwarded-Proto of the listener's requests.
func (ex *Exchange) forwardedProto() []byte {
	if ex.lst.TLS {
		return valueHTTPS
	}
	return valueHTTP
}

// refuseHead answers a request head the sidecar refuses: 400, connection
// closed (what follows on the connection cannot be trusted to be framed
// the way the sender meant), counted.
func (ex *Exchange) refuseHead(reason int, outcome string) {
	ex.core.stats.rejected[reason].Add(1)
	ex.closeConn = true
	ex.local(400, "bad request", outcome)
}

// idempotent reports whether the request's method is idempotent.
func (ex *Exchange) idempotent() bool {
	switch string(ex.head.Method) {
	case "GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE":
		return true
	}
	return false
}
