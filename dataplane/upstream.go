package dataplane

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"syscall"

	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/dataplane/internal/clock"
	"github.com/zentinelproxy/sidecar/dataplane/internal/upstream"
	"github.com/zentinelproxy/sidecar/internal/config"
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
	var tried [config.MaxEndpointAttempts]*upstream.Endpoint
	ntried := 0
	ep := up.Pick(nil)
	if rs.trace.sampled {
		rs.trace.upStart = int64(clock.Mono())
	}
	flushed := false
	for attempt := 0; ; attempt++ {
		tried[ntried] = ep
		ntried++
		ep.Begin()
		rs.upEP = ep
		hc := ep.Client()
		cc, err := upstream.AcquireConn(ep, &rs.srv.stats.up, hc.AcquireConn, hc.CloseConn)
		if err != nil {
			ep.End()
			rs.upEP = nil
			if !errors.Is(err, fasthttp.ErrNoFreeConns) {
				up.Failed(ep)
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
			hc.CloseConn(cc)
			ep.End()
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
		hc.CloseConn(cc)
		ep.End()
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
				hc.CloseIdleConnections()
				rs.srv.stats.up.Stale.Add(1)
			}
			rs.srv.stats.up.Retries.Add(1)
			ntried-- // the same endpoint again
			continue
		}
		up.Failed(ep)
		if !isTimeout(err) && rs.replayable(err) {
			if next := rs.nextEndpoint(tried[:ntried]); next != nil {
				ep = next
				continue
			}
		}
		return rs.upstreamFailed(err)
	}
}

// nextEndpoint is the endpoint of the next attempt after tried failed, or
// nil when the attempts are spent or no endpoint is left.
func (rs *reqState) nextEndpoint(tried []*upstream.Endpoint) *upstream.Endpoint {
	up := rs.rt.up
	if len(tried) >= up.Attempts() || rs.canceled() {
		return nil
	}
	next := up.Pick(tried)
	if next != nil {
		rs.srv.stats.up.EndpointRetries.Add(1)
	}
	return next
}

// endpointAnswered feeds the answer's status to the passive health check.
func (rs *reqState) endpointAnswered(ep *upstream.Endpoint) {
	if rs.trace.sampled {
		rs.trace.upEnd = int64(clock.Mono())
		rs.trace.upAddr = ep.Addr()
	}
	rs.rt.up.Answered(ep, rs.upResp.StatusCode())
}

// upstreamHost is the Host the upstream gets for a request whose (already
// normalised) Host is host.
func (rt *route) upstreamHost(host []byte) []byte {
	switch {
	case rt.hostMode == hostLiteral:
		return rt.hostLit
	case rt.hostMode == hostUpstream || len(host) == 0:
		return rt.up.HostHeader()
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
	hc := rs.upEP.Client()
	upstream.ExtendWrite(conn, up.Config().IdleTimeout)
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
			upstream.HoldWrites(conn)
		}
		if ferr := bw.Flush(); ferr != nil {
			err = &upstreamError{err: ferr, write: true}
		}
	}
	hc.ReleaseWriter(bw)
	return err
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
	idle := rs.rt.up.Config().IdleTimeout
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
		upstream.ExtendWrite(conn, idle)
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
	hc := rs.upEP.Client()
	upstream.ExtendRead(conn, up.Config().ResponseTimeout)
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
	hc := rs.upEP.Client()
	rs.upEP.End()
	rs.upEP = nil
	discard := aborted || rs.upClose || !rs.upBodyDone
	if !discard && rs.upBR != nil && rs.upBR.Buffered() > 0 {
		// Bytes past the end of the response answer no request: the
		// connection is done (acquireConn explains why).
		discard = true
		rs.srv.stats.up.Unsolicited.Add(1)
	}
	_ = rs.upResp.CloseBodyStream()
	if rs.upBR != nil {
		hc.ReleaseReader(rs.upBR)
		rs.upBR = nil
	}
	upstream.PutConn(rs.upCC, hc.ReleaseConn, hc.CloseConn, discard)
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
	if ok, suppressed := rs.rt.up.LogErr().Allow(); ok {
		e := rs.logFields(s.log.Error()).Str("upstream", rs.rt.up.Name()).Err(err)
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
