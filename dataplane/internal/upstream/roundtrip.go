package upstream

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/dataplane/internal/exchange"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/rawio"
)

// The upstream side of an exchange (exchange.Upstream): fasthttp's
// HostClient is the connection pool (keep-alive, idle cleanup, MaxConns
// with a bounded wait, dialing), but the request is driven here: the
// connection in use must be known to abort it when the client goes away
// (exchange.Guard), the request body is framed as the exchange produces
// it through the agents, and the response body is read as the client's
// front end writes it, without a goroutine or a closure per request.

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

// Timeout reports a timeout of the connection (504).
func (e *upstreamError) Timeout() bool { return isTimeout(e.err) }

// acquireError is a failure to get a connection: none free within
// max_conn_wait (exchange.ErrUpstreamBusy, 503), a dial that timed out
// (504) or failed.
type acquireError struct{ err error }

func (e *acquireError) Error() string { return e.err.Error() }
func (e *acquireError) Unwrap() error { return e.err }
func (e *acquireError) Timeout() bool { return isTimeout(e.err) }

// ConnectFailure reports a connection that could not be made (not a
// full pool): nothing was sent, a route may retry on it.
func (e *acquireError) ConnectFailure() bool { return !errors.Is(e.err, fasthttp.ErrNoFreeConns) }
func (e *acquireError) Is(target error) bool {
	return target == exchange.ErrUpstreamBusy && errors.Is(e.err, fasthttp.ErrNoFreeConns)
}

// producerError carries an error of the request body's producer (the
// client's body, the agents) through the writer: it ends the call as it
// is, never retried.
type producerError struct{ err error }

func (e *producerError) Error() string { return e.err.Error() }

// errCanceled: the request was canceled before its connection was
// attached.
var errCanceled = errors.New("request canceled")

// call is one request's use of an upstream: the connection, the
// response read from it and its body, pooled. It is the exchange's
// UpstreamResponse and the Source of the response body.
type call struct {
	resp fasthttp.Response
	// tryWriteFn is tryWrite, bound once.
	tryWriteFn func(uintptr) bool
	callState
}

// callState is the rest of a call, reset whole when it is recycled.
type callState struct {
	up    *Upstream
	req   *exchange.UpstreamRequest
	guard exchange.Guard
	cc    any // *fasthttp.clientConn; its type is unexported
	ep    *Endpoint
	conn  net.Conn
	sock  *rawio.Conn // the socket under conn (nil: not a raw socket)
	wrap  eofConn     // conn as the response reader sees it
	sent  sentConn    // the request's writes
	br    *bufio.Reader
	body  io.Reader // the response body stream (nil: none)
	head  exchange.ResponseHead
	// close: the connection is not to be reused (the response said so,
	// or it answered before the whole request was sent).
	close      bool
	untilClose bool // the body ends with the connection
	// nhead is how many of the response header's fields (All) the head
	// had, the trailing Connection: close excepted: fasthttp appends a
	// chunked body's trailers to them. tr are the trailers, once read.
	nhead   int
	tr      []exchange.Field
	trRead  bool
	chunked bool // the request body is framed chunked

	// The body's writes on a plain socket (writeWatching, early.go).
	wsock *rawio.Conn
	wrc   syscall.RawConn
	wbuf  []byte
	wn    int
	werr  syscall.Errno
}

var calls = sync.Pool{New: func() any {
	c := new(call)
	c.tryWriteFn = c.tryWrite
	return c
}}

// RoundTrip implements exchange.Upstream.
//
// An attempt that fails on a stale pooled connection is replayed on the
// same endpoint (replayable); one whose endpoint refused or broke the
// connection before the upstream could have acted on it goes to another
// endpoint, up to the upstream's endpoint_attempts.
func (up *Upstream) RoundTrip(req *exchange.UpstreamRequest) (exchange.UpstreamResponse, error) {
	if up.h2 {
		return up.roundTripH2(req)
	}
	c := calls.Get().(*call)
	c.up, c.req, c.guard = up, req, req.Guard
	if err := c.forward(); err != nil {
		c.recycle()
		return nil, err
	}
	c.readHeadFields()
	return c, nil
}

// LogAllow implements exchange.Upstream.
func (up *Upstream) LogAllow() (bool, uint64) { return up.logErr.Allow() }

func (c *call) forward() error {
	up := c.up
	var tried [config.MaxEndpointAttempts]*Endpoint
	ntried := 0
	ep := up.pick(nil)
	flushed := false
	for attempt := 0; ; attempt++ {
		tried[ntried] = ep
		ntried++
		ep.begin()
		c.ep = ep
		hc := ep.hc
		cc, err := acquireConn(ep, up.stats, hc.AcquireConn, hc.CloseConn)
		if err != nil {
			ep.end()
			c.ep = nil
			if !errors.Is(err, fasthttp.ErrNoFreeConns) {
				up.failed(ep)
			}
			// Nothing was sent: any method may go elsewhere.
			if next := c.nextEndpoint(tried[:ntried]); next != nil {
				ep = next
				continue
			}
			return &acquireError{err: err}
		}
		conn := cc.Conn()
		if !c.guard.Attach(conn) {
			hc.CloseConn(cc)
			ep.end()
			c.ep = nil
			return errCanceled
		}
		c.conn = conn
		reused := !cc.LastUseTime().IsZero()
		hold := reused && c.req.Body == nil && c.req.Idempotent
		err = c.send(conn, hold)
		if err != nil {
			var ue *upstreamError
			if errors.As(err, &ue) && !isTimeout(err) && c.readHead(conn) == nil {
				// The upstream answered before taking the whole body
				// (an early 413, a redirect): relay its answer. The
				// write failed, or found it waiting (early.go).
				c.cc = cc
				c.close = true
				c.answered(ep)
				return nil
			}
		} else {
			err = c.readHead(conn)
		}
		if err == nil {
			c.cc = cc
			c.answered(ep)
			return nil
		}
		c.guard.Detach()
		c.conn = nil
		if c.br != nil {
			hc.ReleaseReader(c.br) // early.go may have started to read
			c.br = nil
		}
		hc.CloseConn(cc)
		ep.end()
		c.ep = nil
		c.resp.Reset()
		var pe *producerError
		switch {
		case errors.As(err, &pe):
			return pe.err // the client's body or an agent stopped it
		case c.guard.Canceled():
			return err
		}
		if reused && attempt < maxReplays && c.replayable(err) {
			// A pooled connection the upstream closed meanwhile: after an
			// upstream restart every idle one is dead, so drop them all at
			// the first such error rather than finding out one request at
			// a time. The retry then dials a fresh connection.
			if !flushed {
				flushed = true
				hc.CloseIdleConnections()
				up.stats.Stale.Add(1)
			}
			up.stats.Retries.Add(1)
			ntried-- // the same endpoint again
			continue
		}
		up.failed(ep)
		if !isTimeout(err) && c.replayable(err) {
			if next := c.nextEndpoint(tried[:ntried]); next != nil {
				ep = next
				continue
			}
		}
		return err
	}
}

// nextEndpoint is the endpoint of the next attempt after tried failed, or
// nil when the attempts are spent or no endpoint is left.
func (c *call) nextEndpoint(tried []*Endpoint) *Endpoint {
	up := c.up
	if len(tried) >= up.attempts || c.guard.Canceled() {
		return nil
	}
	next := up.pick(tried)
	if next != nil {
		up.stats.EndpointRetries.Add(1)
	}
	return next
}

// answered feeds the answer's status to the passive health check.
func (c *call) answered(ep *Endpoint) {
	if c.resp.StatusCode() >= 500 {
		c.up.got5xx(ep)
	} else {
		ep.succeeded()
	}
}

// maxReplays bounds the retries of one request on stale pooled
// connections. Each costs one failed read on a dead socket; after the
// first, the idle pool has been dropped, so only connections released by
// other requests meanwhile can still be stale.
const maxReplays = 8

// replayable reports whether a failed attempt on a reused keep-alive
// connection may be retried on another: nothing of the client's body was
// consumed and either the method is idempotent or the upstream never
// took the request (writing failed before any of it went out).
func (c *call) replayable(err error) bool {
	if c.req.Body != nil && c.req.Body.Consumed() {
		return false
	}
	if !staleConn(err) {
		return false
	}
	var ue *upstreamError
	if errors.As(err, &ue) && ue.write && !c.sent.wrote {
		// Not a byte of the request went out: any method may go again.
		// Once some did, the upstream may have read the head and acted
		// on it (answering and closing before the rest of a large body,
		// the answer lost to the reset): only an idempotent one may.
		return true
	}
	return c.req.Idempotent
}

// staleConn reports the errors of a keep-alive connection the upstream
// closed while it sat in the pool.
func staleConn(err error) bool {
	var nr fasthttp.ErrNothingRead
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.As(err, &nr) || errors.Is(err, fasthttp.ErrConnectionClosed)
}

// isTimeout reports a timeout error, fasthttp's included.
func isTimeout(err error) bool {
	if errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, fasthttp.ErrDialTimeout) || errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// sentConn is the upstream connection as the request writer sees it: it
// remembers whether any write moved bytes out. With watch, writes that
// find the socket full look for an early answer (early.go).
type sentConn struct {
	net.Conn
	wrote bool
	watch *call
}

func (c *sentConn) Write(p []byte) (int, error) {
	var n int
	var err error
	if c.watch != nil {
		n, err = c.watch.writeWatching(p)
	} else {
		n, err = c.Conn.Write(p)
	}
	if n > 0 {
		c.wrote = true
	}
	return n, err
}

// eofConn records that a read on the connection reached the end of the
// stream: fasthttp's streamed bodies report a peer that vanished mid-body
// as a plain io.EOF, while a complete body never reads that far.
type eofConn struct {
	net.Conn
	eof bool
}

func (c *eofConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err == io.EOF {
		c.eof = true
	}
	return n, err
}

// send writes the request head and body; with hold, the last write goes
// out with the read of the response (holdWrites).
func (c *call) send(conn net.Conn, hold bool) error {
	hc := c.ep.hc
	extendWrite(conn, c.up.cfg.IdleTimeout)
	c.sent = sentConn{Conn: conn}
	if c.req.Body != nil && c.watchWrites(conn) {
		c.sent.watch = c
	}
	bw := hc.AcquireWriter(&c.sent)
	err := c.writeHead(bw)
	if err != nil {
		err = &upstreamError{err: err, write: true}
	} else {
		err = c.writeBody(bw, conn)
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

// writeHead writes the request head, noting whether the body is framed
// chunked.
func (c *call) writeHead(bw *bufio.Writer) error {
	var err error
	c.chunked, err = WriteHead(bw, c.req)
	return err
}

// WriteHead writes r's request line and headers in HTTP/1.1 as the
// exchange made them, the Host first, with the framing header of its
// body: its Content-Length when known (the client's own without a body),
// else Transfer-Encoding: chunked (chunked reports it).
func WriteHead(bw *bufio.Writer, r *exchange.UpstreamRequest) (chunked bool, err error) {
	bw.Write(r.Method)
	bw.WriteByte(' ')
	bw.Write(r.Target)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.Write(r.Host)
	bw.Write(crlf)
	for _, kv := range r.Fields {
		bw.Write(kv.Name)
		bw.WriteString(": ")
		bw.Write(kv.Value)
		bw.Write(crlf)
	}
	switch {
	case r.Body == nil:
		if len(r.ContentLength) > 0 {
			bw.WriteString("Content-Length: ")
			bw.Write(r.ContentLength)
			bw.Write(crlf)
		}
	case r.BodyLen >= 0:
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(bw.AvailableBuffer(), r.BodyLen, 10))
		bw.Write(crlf)
	default:
		chunked = true
		bw.WriteString("Transfer-Encoding: chunked\r\n")
		if len(r.Trailer) > 0 {
			writeTrailerNames(bw, r.Trailer)
		}
	}
	_, err = bw.Write(crlf)
	return chunked, err
}

// writeBody writes the request body as the exchange produces it, framed
// chunked when its length is unknown; each piece but the last is flushed
// (the next may wait on the client).
func (c *call) writeBody(bw *bufio.Writer, conn net.Conn) error {
	body := c.req.Body
	if body == nil {
		return nil
	}
	idle := c.up.cfg.IdleTimeout
	for {
		data, last, err := body.Next()
		if err != nil {
			return &producerError{err: err}
		}
		extendWrite(conn, idle)
		if len(data) > 0 {
			var werr error
			if c.chunked {
				_, werr = bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(len(data)), 16))
				if werr == nil {
					_, werr = bw.Write(crlf)
				}
			}
			if werr == nil {
				_, werr = bw.Write(data)
			}
			if werr == nil && c.chunked {
				_, werr = bw.Write(crlf)
			}
			if werr == nil && !last {
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
	if c.chunked {
		// The last chunk, and the client's trailers in the trailer
		// section (RFC 9112 §7.1.2).
		tr := body.Trailers(true)
		if len(tr) == 0 {
			if _, err := bw.Write(lastChunk); err != nil {
				return &upstreamError{err: err, write: true}
			}
			return nil
		}
		bw.WriteString("0\r\n")
		for _, f := range tr {
			bw.Write(f.Name)
			bw.WriteString(": ")
			bw.Write(f.Value)
			bw.Write(crlf)
		}
		if _, err := bw.Write(crlf); err != nil {
			return &upstreamError{err: err, write: true}
		}
		return nil
	}
	// A body with a Content-Length has no trailer section.
	body.Trailers(false)
	return nil
}

// writeTrailerNames writes the Trailer field announcing the trailer
// names of the client's list that may go on (none: no field).
func writeTrailerNames(bw *bufio.Writer, names []byte) {
	n := 0
	for name := range exchange.TrailerNames(names) {
		if n == 0 {
			bw.WriteString("Trailer: ")
		} else {
			bw.WriteString(", ")
		}
		bw.Write(name)
		n++
	}
	if n > 0 {
		bw.Write(crlf)
	}
}

// readHead reads the upstream response's status line and headers; the
// body is left on the connection as a stream.
func (c *call) readHead(conn net.Conn) error {
	hc := c.ep.hc
	d := c.up.cfg.ResponseTimeout
	if c.req.ResponseTimeout > 0 {
		d = c.req.ResponseTimeout
	}
	extendRead(conn, d)
	br := c.br // what early.go read of the answer, if it looked
	if br == nil {
		c.wrap = eofConn{Conn: conn}
		br = hc.AcquireReader(&c.wrap)
	}
	resp := &c.resp
	resp.Reset()
	resp.StreamBody = true
	resp.SkipBody = c.req.Head
	resp.Header.SetNoDefaultContentType(true)
	if err := resp.ReadLimitBody(br, 0); err != nil {
		hc.ReleaseReader(br)
		c.br = nil
		return &upstreamError{err: err}
	}
	c.br = br
	return nil
}

// readHeadFields fills the response head for the exchange: the fields
// point into the response's header, which is left alone until Release.
func (c *call) readHeadFields() {
	h := &c.resp.Header
	hd := &c.head
	hd.Status = h.StatusCode()
	hd.Reason = h.StatusMessage()
	fields := hd.Fields[:0]
	for k, v := range h.All() {
		fields = append(fields, exchange.Field{Name: k, Value: v})
	}
	hd.Fields = fields
	c.nhead = len(fields)
	if h.ConnectionClose() {
		c.nhead--
	}
	cl := h.ContentLength()
	hd.ContentLength = int64(cl)
	c.body = c.resp.BodyStream()
	hd.HasBody = c.body != nil && !c.req.Head && cl != 0
	c.untilClose = cl == -2
	c.close = h.ConnectionClose()
	c.sock = rawOf(c.conn)
}

// Head implements exchange.UpstreamResponse.
func (c *call) Head() *exchange.ResponseHead { return &c.head }

// Trailers implements exchange.TrailerSource: the fields of a chunked
// body's trailer section, which fasthttp appends to the response header
// once it read the last chunk (after the head's; only Connection: close
// follows them in All).
func (c *call) Trailers() []exchange.Field {
	if c.head.ContentLength != -1 || c.trRead {
		return c.tr
	}
	c.trRead = true
	h := &c.resp.Header
	end := h.Len()
	if h.ConnectionClose() {
		end--
	}
	if end <= c.nhead {
		return nil
	}
	i := 0
	for k, v := range h.All() {
		if i >= c.nhead && i < end {
			c.tr = append(c.tr, exchange.Field{Name: k, Value: v})
		}
		i++
	}
	return c.tr
}

// CopyHeadTo copies the response head to a front end's fasthttp response
// (exchange.Response.Origin).
func (c *call) CopyHeadTo(dst *fasthttp.ResponseHeader) { c.resp.Header.CopyTo(dst) }

// Endpoint implements exchange.UpstreamResponse.
func (c *call) Endpoint() string {
	if c.ep == nil {
		return ""
	}
	return c.ep.addr
}

// Body implements exchange.UpstreamResponse.
func (c *call) Body() exchange.Source {
	if c.body == nil {
		return nil
	}
	return c
}

// Release implements exchange.UpstreamResponse: the connection goes back
// to its pool when its response was read to the end, and is closed
// otherwise.
func (c *call) Release(reuse bool) {
	if c.cc != nil {
		aborted := c.guard.Detach()
		hc := c.ep.hc
		c.ep.end()
		discard := aborted || c.close || !reuse
		if !discard && c.br != nil && c.br.Buffered() > 0 {
			// Bytes past the end of the response answer no request: the
			// connection is done (acquireConn explains why).
			discard = true
			c.up.stats.Unsolicited.Add(1)
		}
		_ = c.resp.CloseBodyStream()
		if c.br != nil {
			hc.ReleaseReader(c.br)
			c.br = nil
		}
		putConn(c.cc, hc.ReleaseConn, hc.CloseConn, discard)
	}
	c.recycle()
}

// Detach implements exchange.UpstreamResponse: it takes the connection
// out of the call for a tunnel after a 101.
func (c *call) Detach() (exchange.Tunnel, bool) {
	aborted := c.guard.Detach()
	gone := aborted || c.guard.Canceled()
	cc, br, ep, conn := c.cc, c.br, c.ep, c.conn
	c.cc, c.br, c.conn = nil, nil, nil
	_ = c.resp.CloseBodyStream()
	hc := ep.hc
	// Bytes the upstream sent after its head are already in the reader,
	// which reads through c.wrap (pooled with c): copy them out.
	var pre []byte
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		pre = append([]byte(nil), b...)
	}
	hc.ReleaseReader(br)
	// The tunnel counts as in flight on its endpoint until it ends.
	release := func() {
		putConn(cc, hc.ReleaseConn, hc.CloseConn, true)
		ep.end()
	}
	if gone || conn == nil {
		release()
		return exchange.Tunnel{}, false
	}
	return exchange.Tunnel{Conn: conn, Pre: pre, Release: release}, true
}

// recycle returns c to the pool.
func (c *call) recycle() {
	c.resp.Reset()
	c.callState = callState{head: exchange.ResponseHead{Fields: trimFields(c.head.Fields)}, tr: trimFields(c.tr)}
	calls.Put(c)
}

func trimFields(l []exchange.Field) []exchange.Field {
	if cap(l) > 4096 {
		return nil
	}
	clear(l)
	return l[:0]
}

// Read implements exchange.Source: the response body.
func (c *call) Read(p []byte) (int, error) { return c.body.Read(p) }

// Pending implements exchange.Source: bytes of the body were already
// received, in the reader or the socket beneath it.
func (c *call) Pending() bool {
	if c.br == nil {
		return false
	}
	if c.br.Buffered() > 0 {
		return true
	}
	if c.sock == nil {
		return false
	}
	data, _ := c.sock.Pending() // EOF or an error: the next Read meets it
	return data
}

// Buffered implements exchange.Source.
func (c *call) Buffered(rest int64) bool {
	if c.conn == nil || c.up.cfg.IdleTimeout <= 0 {
		return true
	}
	return c.br != nil && rest >= 0 && int64(c.br.Buffered()) >= rest
}

// ExtendRead implements exchange.Source: the body's idle timeout.
func (c *call) ExtendRead() { extendRead(c.conn, c.up.cfg.IdleTimeout) }

// SetReadDeadline implements exchange.Source.
func (c *call) SetReadDeadline(t time.Time) { _ = c.conn.SetReadDeadline(t) }

// Truncated implements exchange.Source.
func (c *call) Truncated() bool { return !c.untilClose && c.wrap.eof }
