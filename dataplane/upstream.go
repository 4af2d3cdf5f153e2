package dataplane

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/rawio"
	"github.com/zentinelproxy/sidecar/protocol"
)

// The upstream exchange uses fasthttp.HostClient for its connection pool
// (keep-alive, idle cleanup, MaxConns with a bounded wait, dialing) but
// drives the connection itself: the request's connection must be known
// to abort it when the client goes away, the request body is framed as
// it streams through the agents, and the response body is streamed out
// of the request handler without a goroutine or a closure per request.

var (
	crlf      = []byte("\r\n")
	lastChunk = []byte("0\r\n\r\n")
)

// upstreamError is a failure on the upstream connection; write says it
// happened while sending the request.
type upstreamError struct {
	err   error
	write bool
}

func (e *upstreamError) Error() string {
	if e.write {
		return "sending request to upstream: " + e.err.Error()
	}
	return "reading upstream response: " + e.err.Error()
}

func (e *upstreamError) Unwrap() error { return e.err }

// putConn hands a pooled connection back to its HostClient, or closes it.
// The connection's type is unexported, so it travels as any and is
// recovered from the type of HostClient.ReleaseConn.
func putConn[C any](v any, release, closeConn func(C), discard bool) {
	c, ok := v.(C)
	if !ok {
		return
	}
	if discard {
		closeConn(c)
	} else {
		release(c)
	}
}

// forward sends the request upstream and reads the response head. It
// reports whether the request goes on; false means a response is staged
// or the client is gone.
//
// An attempt that fails on a stale pooled connection is replayed on the
// same endpoint (replayable); one whose endpoint refused or broke the
// connection before the upstream could have acted on it goes to another
// endpoint, up to the upstream's endpoint_attempts (retryElsewhere).
func (rs *reqState) forward() bool {
	up := rs.rt.up
	rs.finishIdle(protocol.PhaseRequest)
	var tried [config.MaxEndpointAttempts]*endpoint
	ntried := 0
	ep := up.pick(nil)
	if rs.trace.sampled {
		rs.trace.upStart = int64(mono())
	}
	flushed := false
	for attempt := 0; ; attempt++ {
		tried[ntried] = ep
		ntried++
		ep.requests.Add(1)
		ep.inflight.Add(1)
		rs.upEP = ep
		cc, err := acquireConn(rs, ep, ep.hc.AcquireConn, ep.hc.CloseConn)
		if err != nil {
			ep.inflight.Add(-1)
			rs.upEP = nil
			if !errors.Is(err, fasthttp.ErrNoFreeConns) {
				up.failed(ep)
			}
			// Nothing was sent: any method may go elsewhere.
			if next := rs.nextEndpoint(tried[:ntried]); next != nil {
				ep = next
				continue
			}
			return rs.upstreamFailed(err)
		}
		conn := cc.Conn()
		rs.mu.Lock()
		gone := rs.cancelErr != nil
		if !gone {
			rs.upNet = conn
		}
		rs.mu.Unlock()
		if gone {
			ep.hc.CloseConn(cc)
			ep.inflight.Add(-1)
			rs.upEP = nil
			rs.outcome = "client gone"
			return false
		}
		reused := !cc.LastUseTime().IsZero()
		hold := reused && rs.reqMode == reqBodyNone && rs.idempotent()
		err = rs.sendRequest(conn, hold)
		if err != nil {
			var ue *upstreamError
			if errors.As(err, &ue) && !isTimeout(err) && rs.readHead(conn) == nil {
				// The upstream answered before taking the whole body
				// (an early 413, a redirect): relay its answer.
				rs.upCC = cc
				rs.upClose = true
				rs.endpointAnswered(ep)
				return true
			}
		} else {
			err = rs.readHead(conn)
		}
		if err == nil {
			rs.upCC = cc
			rs.endpointAnswered(ep)
			return true
		}
		rs.mu.Lock()
		rs.upNet = nil
		rs.mu.Unlock()
		ep.hc.CloseConn(cc)
		ep.inflight.Add(-1)
		rs.upEP = nil
		rs.upResp.Reset()
		var ce *clientError
		switch {
		case rs.answered || rs.respAbort:
			return false // an agent stopped the body
		case rs.canceled():
			rs.outcome = "client gone"
			return false
		case errors.As(err, &ce):
			rs.bodyReadFailed(protocol.PhaseRequest, ce.err)
			return false
		}
		if reused && attempt < maxReplays && rs.replayable(err) {
			// A pooled connection the upstream closed meanwhile: after an
			// upstream restart every idle one is dead, so drop them all at
			// the first such error rather than finding out one request at
			// a time. The retry then dials a fresh connection.
			if !flushed {
				flushed = true
				ep.hc.CloseIdleConnections()
				rs.srv.stats.upStale.Add(1)
			}
			rs.srv.stats.upRetries.Add(1)
			ntried-- // the same endpoint again
			continue
		}
		up.failed(ep)
		if !isTimeout(err) && rs.replayable(err) {
			if next := rs.nextEndpoint(tried[:ntried]); next != nil {
				ep = next
				continue
			}
		}
		return rs.upstreamFailed(err)
	}
}

// maxDiscards bounds the pooled connections one request may find closed
// or holding stray bytes before it dials instead (the pool's idle
// connections are dropped at that point).
const maxDiscards = 16

// acquireConn takes a connection to ep from its pool (or dials one). A
// pooled connection is looked at before a request is written on it: one
// the upstream closed while it sat idle (EOF, reset) or one with bytes
// waiting that no request asked for is closed and the next taken. The
// stray bytes would otherwise be read as the answer to the request
// written next, and every later request on that connection would get the
// answer to the one before it (HTTP/1.1 has no request ids).
//
// The look is one recvfrom(2) with MSG_PEEK|MSG_DONTWAIT per reused
// connection (rawio.Conn.Pending). nginx and HAProxy learn the same from
// their event loops, for which a readable idle connection is an event;
// here the runtime's poller keeps that readiness to itself, so it costs
// the system call. In exchange, a request without a body on a reused
// connection always has its write held to the read of the answer
// (holdWrites): the peek sees the FIN that a held read would miss, so
// the rule that held only connections used within the last few
// milliseconds is gone, and its clock read with it.
//
// The pool's connection type is unexported: it is inferred from the
// HostClient's methods (acquire and closeConn), as in putConn.
func acquireConn[C pooledConn](rs *reqState, ep *endpoint, acquire func(time.Duration, bool) (C, error), closeConn func(C)) (C, error) {
	flushed := false
	for n := 0; ; n++ {
		cc, err := acquire(0, false)
		if err != nil || cc.LastUseTime().IsZero() {
			return cc, err
		}
		rc := rawOf(cc.Conn())
		if rc == nil {
			return cc, nil
		}
		data, perr := rc.Pending()
		if !data && perr == nil {
			return cc, nil
		}
		closeConn(cc)
		if data {
			rs.srv.stats.upUnsolicited.Add(1)
		} else {
			rs.srv.stats.upClosed.Add(1)
		}
		if (perr != nil && !flushed) || n+1 == maxDiscards {
			// A pooled connection the upstream closed while idle: after
			// an upstream restart (or its idle timeout) the older idle
			// ones are closed too, the pool being used last in, first
			// out. Drop them all rather than finding out one at a time.
			flushed = true
			ep.hc.CloseIdleConnections()
			rs.srv.stats.upStale.Add(1)
		}
	}
}

// pooledConn is what acquireConn needs of a pooled connection.
type pooledConn interface {
	Conn() net.Conn
	LastUseTime() time.Time
}

// rawOf is the socket under an upstream connection (beneath its TLS, if
// any), or nil when it is not a raw socket.
func rawOf(c net.Conn) *rawio.Conn {
	if uc, ok := c.(*upConn); ok {
		c = uc.Conn
	}
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	rc, _ := c.(*rawio.Conn)
	return rc
}

// nextEndpoint is the endpoint of the next attempt after tried failed, or
// nil when the attempts are spent or no endpoint is left.
func (rs *reqState) nextEndpoint(tried []*endpoint) *endpoint {
	up := rs.rt.up
	if len(tried) >= up.attempts || rs.canceled() {
		return nil
	}
	next := up.pick(tried)
	if next != nil {
		rs.srv.stats.upEndpointRetries.Add(1)
	}
	return next
}

// endpointAnswered feeds the answer's status to the passive health check.
func (rs *reqState) endpointAnswered(ep *endpoint) {
	if rs.trace.sampled {
		rs.trace.upEnd = int64(mono())
		rs.trace.upAddr = ep.addr
	}
	if rs.upResp.StatusCode() >= 500 {
		rs.rt.up.got5xx(ep)
	} else {
		ep.succeeded()
	}
}

// upstreamHost is the Host the upstream gets for a request whose (already
// normalised) Host is host.
func (rt *route) upstreamHost(host []byte) []byte {
	switch {
	case rt.hostMode == hostLiteral:
		return rt.hostLit
	case rt.hostMode == hostUpstream || len(host) == 0:
		return rt.up.hostHdr
	}
	return host
}

// maxReplays bounds the retries of one request on stale pooled
// connections. Each costs one failed read on a dead socket; after the
// first, the idle pool has been dropped, so only connections released by
// other requests meanwhile can still be stale.
const maxReplays = 8

// replayable reports whether a failed attempt on a reused keep-alive
// connection may be retried on another: nothing of the body was consumed
// and either the method is idempotent or the upstream never took the
// request (writing failed before any of it went out).
func (rs *reqState) replayable(err error) bool {
	switch rs.reqMode {
	case reqBodyPass, reqBodyPipe:
		if rs.reqSrc.n > 0 {
			return false
		}
	}
	if !staleConn(err) {
		return false
	}
	var ue *upstreamError
	if errors.As(err, &ue) && ue.write && !rs.upSent.wrote {
		// Not a byte of the request went out: any method may go again.
		// Once some did, the upstream may have read the head and acted
		// on it (answering and closing before the rest of a large body,
		// the answer lost to the reset): only an idempotent one may.
		return true
	}
	return rs.idempotent()
}

// idempotent reports whether the request's method is idempotent.
func (rs *reqState) idempotent() bool {
	h := &rs.ctx.Request.Header
	return h.IsGet() || h.IsHead() || h.IsOptions() || h.IsPut() || h.IsDelete() || h.IsTrace()
}

// staleConn reports the errors of a keep-alive connection the upstream
// closed while it sat in the pool.
func staleConn(err error) bool {
	var nr fasthttp.ErrNothingRead
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.As(err, &nr) || errors.Is(err, fasthttp.ErrConnectionClosed)
}

// sentConn is the upstream connection as the request writer sees it: it
// remembers whether any write moved bytes out.
type sentConn struct {
	net.Conn
	wrote bool
}

func (c *sentConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.wrote = true
	}
	return n, err
}

// sendRequest writes the request head and body; with hold, the last
// write goes out with the read of the response (holdWrites).
func (rs *reqState) sendRequest(conn net.Conn, hold bool) error {
	up := rs.rt.up
	hc := rs.upEP.hc
	extendWrite(conn, up.cfg.IdleTimeout)
	rs.reqSent = true
	rs.upSent = sentConn{Conn: conn}
	bw := hc.AcquireWriter(&rs.upSent)
	err := rs.writeHead(bw)
	if err != nil {
		err = &upstreamError{err: err, write: true}
	} else {
		err = rs.writeBody(bw, conn)
	}
	if err == nil {
		if hold {
			holdWrites(conn)
		}
		if ferr := bw.Flush(); ferr != nil {
			err = &upstreamError{err: ferr, write: true}
		}
	}
	hc.ReleaseWriter(bw)
	return err
}

// holdWrites has the request's last write go out with the read of the
// response (rawio.Conn.HoldWrites): the read that would find nothing yet
// (EAGAIN) is not made, one system call fewer per request, which costs
// 1.2–1.5 µs on a paravirtualized guest. Only for a request without a
// body and a replayable method, on a reused connection: a failed write
// then shows at the read, where staleConn still recognises it and
// replayable still allows the retry.
//
// A held read does not look at the socket before it waits, so it would
// not see a FIN that came while the connection sat idle: a peer that
// closed fully answers the held request with a reset, which wakes the
// read, but one that only half-closed and keeps reading (Apache's
// lingering close of an expired keep-alive connection) answers nothing,
// and the request would wait for its response timeout. acquireConn's
// peek, just before, is what sees that FIN; what remains is a FIN that
// arrives in the microseconds between the peek and the write.
func holdWrites(conn net.Conn) {
	if uc, ok := conn.(*upConn); ok {
		if rc, ok := uc.Conn.(*rawio.Conn); ok {
			rc.HoldWrites()
		}
	}
}

// writeBody writes the request body in the planned mode, framing it as
// chunked when its size may change on the way.
func (rs *reqState) writeBody(bw *bufio.Writer, conn net.Conn) error {
	switch rs.reqMode {
	case reqBodyNone:
		return nil
	case reqBodyRaw:
		if len(rs.shadowConvs) > 0 {
			rs.shadowRequestBody(rs.reqOut)
		}
		if _, err := bw.Write(rs.reqOut); err != nil {
			return &upstreamError{err: err, write: true}
		}
		return nil
	}
	chunked := rs.upChunked
	pipe := rs.reqMode == reqBodyPipe
	idle := rs.rt.up.cfg.IdleTimeout
	for {
		buf := rs.chunkBuf(protocol.PhaseRequest)
		n, last, err := rs.reqSrc.read(buf, rs.fill(protocol.PhaseRequest))
		if err != nil {
			return &clientError{err: err}
		}
		data := buf[:n]
		if pipe && len(rs.active[0]) > 0 {
			var ok bool
			if data, ok = rs.runChunk(protocol.PhaseRequest, data, last, true); !ok {
				return errStopped
			}
		}
		if last {
			rs.reqBodyEOF = true
		}
		if len(rs.shadowConvs) > 0 && (len(data) > 0 || last) {
			total := rs.total[0]
			if pipe {
				total = -1 // the agents may change its length
			}
			rs.shadowBody(protocol.PhaseRequest, data, last, total)
		}
		extendWrite(conn, idle)
		if len(data) > 0 {
			var werr error
			if chunked {
				_, werr = bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(len(data)), 16))
				if werr == nil {
					_, werr = bw.Write(crlf)
				}
			}
			if werr == nil {
				_, werr = bw.Write(data)
			}
			if werr == nil && chunked {
				_, werr = bw.Write(crlf)
			}
			if werr == nil && !last {
				// Forward what we have: the next read may wait on the client.
				werr = bw.Flush()
			}
			if werr != nil {
				return &upstreamError{err: werr, write: true}
			}
		}
		if last {
			break
		}
	}
	if chunked {
		if _, err := bw.Write(lastChunk); err != nil {
			return &upstreamError{err: err, write: true}
		}
	}
	return nil
}

// readHead reads the upstream response's status line and headers; the
// body is left on the connection as a stream.
func (rs *reqState) readHead(conn net.Conn) error {
	up := rs.rt.up
	hc := rs.upEP.hc
	extendRead(conn, up.cfg.ResponseTimeout)
	rs.upWrap = eofConn{Conn: conn}
	br := hc.AcquireReader(&rs.upWrap)
	resp := &rs.upResp
	resp.Reset()
	resp.StreamBody = true
	resp.SkipBody = rs.ctx.Request.Header.IsHead()
	resp.Header.SetNoDefaultContentType(true)
	if err := resp.ReadLimitBody(br, 0); err != nil {
		hc.ReleaseReader(br)
		return &upstreamError{err: err}
	}
	rs.upBR = br
	return nil
}

// releaseUpstream returns the upstream connection to the pool when its
// response was read to the end, and closes it otherwise.
func (rs *reqState) releaseUpstream() {
	if rs.upCC == nil {
		return
	}
	rs.mu.Lock()
	aborted := rs.upAborted
	rs.upNet = nil
	rs.mu.Unlock()
	hc := rs.upEP.hc
	rs.upEP.inflight.Add(-1)
	rs.upEP = nil
	discard := aborted || rs.upClose || !rs.upBodyDone
	if !discard && rs.upBR != nil && rs.upBR.Buffered() > 0 {
		// Bytes past the end of the response answer no request: the
		// connection is done (acquireConn explains why).
		discard = true
		rs.srv.stats.upUnsolicited.Add(1)
	}
	_ = rs.upResp.CloseBodyStream()
	if rs.upBR != nil {
		hc.ReleaseReader(rs.upBR)
		rs.upBR = nil
	}
	putConn(rs.upCC, hc.ReleaseConn, hc.CloseConn, discard)
	rs.upCC = nil
}

// upNetConn is the upstream connection of the request.
func (rs *reqState) upNetConn() net.Conn {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.upNet
}

// upstreamFailed answers 502, 503 or 504 for an upstream failure.
func (rs *reqState) upstreamFailed(err error) bool {
	s := rs.srv
	if rs.canceled() {
		rs.outcome = "client gone"
		return false
	}
	if ok, suppressed := rs.rt.up.logErr.allow(); ok {
		e := rs.logFields(s.log.Error()).Str("upstream", rs.rt.up.name).Err(err)
		if suppressed > 0 {
			e = e.Uint64("suppressed", suppressed)
		}
		e.Msg("upstream failed")
	}
	rs.upFailed = true
	switch {
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		s.stats.upErrors.Add(1)
		s.obs.Upstream(rs.rt.idx, false)
		rs.local(fasthttp.StatusServiceUnavailable, "service unavailable", "upstream busy")
	case isTimeout(err):
		s.stats.upTimeouts.Add(1)
		s.obs.Upstream(rs.rt.idx, true)
		rs.local(fasthttp.StatusGatewayTimeout, "gateway timeout", "upstream timeout")
	default:
		s.stats.upErrors.Add(1)
		s.obs.Upstream(rs.rt.idx, false)
		rs.local(fasthttp.StatusBadGateway, "bad gateway", "upstream error")
	}
	return false
}

func isTimeout(err error) bool {
	if errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, fasthttp.ErrDialTimeout) || errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
