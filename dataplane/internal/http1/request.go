package http1

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/dataplane/internal/exchange"
	"github.com/zentinelproxy/sidecar/internal/observe"
	"github.com/zentinelproxy/sidecar/internal/rawio"
)

// request is one HTTP/1.1 request of a listener: the exchange it runs
// (embedded, pooled with it) and what the exchange's Front needs of
// fasthttp. It implements exchange.Front.
type request struct {
	ex   exchange.Exchange
	l    *Listener
	ctx  *fasthttp.RequestCtx
	nc   net.Conn // ctx.Conn(), read by the disconnect watcher
	conn *eofConn // nc, when it is one (always, behind a Listener)
	info exchange.Conn
	body reqBody
	out  respStream
	// rawTarget is the client's target when not origin-form; targetBuf
	// the rewritten one (normalize.go).
	rawTarget []byte
	targetBuf []byte
	scratch   []byte
}

var requests = sync.Pool{New: func() any {
	r := new(request)
	r.ex.Init(r)
	r.out.r = r
	return r
}}

// release returns r to the pool once its exchange finished.
func (r *request) release() {
	r.l, r.ctx, r.nc, r.conn = nil, nil, nil, nil
	r.info = exchange.Conn{}
	clear(r.body.tr)
	r.body = reqBody{tr: r.body.tr[:0]}
	r.out.reset()
	r.rawTarget = trim(r.rawTarget, 16<<10)
	r.targetBuf = trim(r.targetBuf, 16<<10)
	r.scratch = trim(r.scratch, 64<<10)
	requests.Put(r)
}

// trim empties b, dropping its storage when it grew past max so one huge
// request does not pin memory in the pool.
func trim(b []byte, max int) []byte {
	if cap(b) > max {
		return nil
	}
	return b[:0]
}

// handle is the listener's fasthttp handler.
func (l *Listener) handle(ctx *fasthttp.RequestCtx) {
	r := requests.Get().(*request)
	r.l, r.ctx = l, ctx
	r.nc = ctx.Conn()
	r.conn, _ = r.nc.(*eofConn)
	ex := &r.ex
	l.core.Begin(ex, ctx.Time())
	defer l.recoverPanic(r)
	if reason, outcome, ok := r.readHead(); ok {
		ex.Serve()
	} else {
		ex.Refuse(reason, outcome)
	}
	streaming := r.respond()
	if ex.CloseAfter() {
		// Asked for, a refused head, or unread body bytes that would be
		// parsed as the next request: closed lingeringly, the client may
		// still be sending.
		ctx.SetConnectionClose()
		if r.conn != nil {
			r.conn.markLinger()
		}
	}
	if !streaming {
		ex.Finish()
		r.release()
	}
}

// recoverPanic keeps one broken request from taking the process down.
// The request is abandoned, not pooled.
func (l *Listener) recoverPanic(r *request) {
	p := recover()
	if p == nil {
		return
	}
	l.log.Error().Uint64("req", r.ex.ID()).Bytes("corr", r.ex.Correlation()).Interface("panic", p).Msg("request handler panicked")
	r.ex.Abandon()
	ctx := r.ctx
	ctx.Response.Reset()
	ctx.SetStatusCode(fasthttp.StatusInternalServerError)
	ctx.SetBodyString("internal error")
	ctx.SetConnectionClose()
	if r.conn != nil {
		r.conn.markLinger()
	}
}

var hdrContentLength = []byte("Content-Length")

// readHead fills the exchange's head from fasthttp's parse, after the
// normalisation that depends on it (normalize.go). ok is false for a
// head refused for reason (observe.RejectReasons).
func (r *request) readHead() (reason int, outcome string, ok bool) {
	req := &r.ctx.Request
	h := &req.Header
	hd := r.ex.Head()
	if t := h.RequestURI(); len(t) > 0 && t[0] != '/' {
		// The client's target, for agents that see the client's view,
		// before normalizeTarget rewrites an absolute-form one: one copy
		// for these rare requests.
		r.rawTarget = append(r.rawTarget[:0], t...)
		hd.RawTarget = r.rawTarget
	}
	targetOK := r.normalizeTarget()
	// Before the fields are read: reading them joins a folded line to the
	// one before, in fasthttp's buffer.
	folded, bareLF := false, false
	if targetOK {
		folded, bareLF = headLines(h.RawHeaders())
	}
	hd.Method = h.Method()
	hd.Target = h.RequestURI()
	hd.Host = h.Host()
	hd.Proto = h.Protocol()
	hd.HTTP11 = h.IsHTTP11()
	hd.ContentLength = int64(h.ContentLength())
	hd.ContentLengthValue = nil
	hd.Trailer = nil
	fields := hd.Fields[:0]
	for k, v := range h.AllInOrder() {
		if len(k) == len(hdrContentLength) && hd.ContentLengthValue == nil && foldEq(k, "content-length") {
			hd.ContentLengthValue = v
		}
		if len(k) == len("trailer") && hd.Trailer == nil && foldEq(k, "trailer") {
			hd.Trailer = v
		}
		fields = append(fields, exchange.Field{Name: k, Value: v})
	}
	hd.Fields = fields
	hd.Path = r.ctx.Path()
	switch {
	case !targetOK:
		return observe.RejectTarget, "bad request target", false
	case folded:
		return observe.RejectObsFold, "folded header line", false
	case bareLF:
		return observe.RejectParse, "bare LF in the head", false
	}
	return 0, "", true
}

// Conn implements exchange.Front.
func (r *request) Conn() *exchange.Conn {
	if r.conn != nil {
		return r.conn.connInfo(&r.l.facts)
	}
	// A connection the listener did not wrap (tests driving a handler).
	i := &r.info
	i.ClientIP, i.ClientPort = tcpAddrText(nil, r.nc.RemoteAddr())
	i.ServerIP, i.ServerPort = tcpAddrText(nil, r.nc.LocalAddr())
	i.Listener = &r.l.facts
	return i
}

// Gone implements exchange.Front: a peek at the client's socket.
func (r *request) Gone() bool { return peerClosed(r.nc) }

// peerClosed reports whether the client closed its end of c. A socket
// with unread data (a pipelined request, an unread body) reads as open.
var peerClosed = func(c net.Conn) bool { return peekClosed(c) }

// Body implements exchange.Front.
func (r *request) Body() exchange.Source {
	s := r.ctx.Request.BodyStream()
	if s == nil {
		return nil
	}
	b := &r.body
	*b = reqBody{r: s, conn: r.nc, ec: r.conn, idle: r.l.cfg.BodyTimeout, buf: bodyStreamReader.reader(s), tr: b.tr[:0]}
	if h := &r.ctx.Request.Header; h.ContentLength() == -1 {
		// Chunked: fasthttp appends the trailer section's fields to the
		// header once it read the last chunk (Trailers).
		b.hdr = h
		b.nhead = headLen(h)
	}
	if r.conn != nil {
		b.sock = r.conn.rw
	}
	return b
}

// respond writes the response the exchange staged into fasthttp's. It
// reports whether the body is streamed (the exchange then lives on until
// the stream ends).
func (r *request) respond() bool {
	res := r.ex.Response()
	switch res.Kind {
	case exchange.ResponseFull:
		r.writeHead(res)
		r.ctx.Response.SetBody(res.Body)
		// An upstream body the agents buffered goes with a
		// Content-Length: no trailer section.
		r.ex.TrailersDropped()
	case exchange.ResponseStream:
		r.writeHead(res)
		r.out.reset()
		if res.Size < 0 && !r.ex.Head().HTTP11 {
			r.closeDelimited()
			return true
		}
		// Of unknown length, fasthttp frames the body chunked: the
		// upstream's trailers can follow it (respStream.end).
		r.out.chunked = res.Size < 0
		r.ctx.Response.SetBodyStream(&r.out, int(res.Size))
		return true
	}
	return false
}

// writeHead puts the staged status and headers on fasthttp's response.
// The response is the sidecar's message, sent in its own version (RFC
// 9110 §6.2, RFC 9112 §6.1) whatever the upstream spoke: an HTTP/1.0
// status line on a chunked body is read by clients as a body delimited
// by the close that never comes on a kept-alive connection.
func (r *request) writeHead(res *exchange.Response) {
	h := &r.ctx.Response.Header
	if o, ok := res.Origin.(headCopier); ok && len(res.Dropped) == 0 {
		// The upstream's head as it came, with no hop-by-hop field to
		// leave out: copied whole. (fasthttp's delete does not keep the
		// order of the fields it leaves, that of fields of one name
		// included: a head with fields to leave out goes field by field.)
		o.CopyHeadTo(h)
		h.SetNoDefaultContentType(true)
		if !h.IsHTTP11() {
			h.SetProtocol(protoHTTP11)
		}
		return
	}
	h.SetNoDefaultContentType(true)
	h.SetStatusCode(res.Status)
	if len(res.Reason) > 0 {
		h.SetStatusMessage(res.Reason)
	}
	for _, f := range res.Fields {
		h.AddBytesKV(f.Name, f.Value)
	}
}

// headCopier is an upstream response read by fasthttp (the upstream
// side's), whose head fasthttp copies whole (exchange.Response.Origin).
type headCopier interface {
	CopyHeadTo(dst *fasthttp.ResponseHeader)
}

// protoHTTP11 is the version of every response the sidecar sends.
var protoHTTP11 = []byte("HTTP/1.1")

// reqBody is the client's request body as the exchange reads it
// (exchange.Source): fasthttp's body stream, the bufio.Reader under it
// and the socket under that (coalesce.go), the connection's deadlines.
type reqBody struct {
	r        io.Reader
	buf      *bufio.Reader
	sock     *rawio.Conn
	conn     net.Conn
	ec       *eofConn
	idle     time.Duration
	extended time.Time
	// hdr is the request header of a chunked body, which had nhead
	// fields before the body (headLen); tr its trailers as fields.
	hdr   *fasthttp.RequestHeader
	nhead int
	tr    []exchange.Field
}

// headLen is the number of h's fields All yields before a trailer
// section's, which fasthttp appends after the head's (only Connection:
// close follows them).
func headLen(h *fasthttp.RequestHeader) int {
	n := h.Len()
	if h.ConnectionClose() {
		n--
	}
	return n
}

// Trailers implements exchange.TrailerSource: the fields of a chunked
// body's trailer section (fasthttp refuses the body for one it forbids,
// such as Content-Length or Host).
func (b *reqBody) Trailers() []exchange.Field {
	if b.hdr == nil {
		return nil
	}
	end := headLen(b.hdr)
	if end <= b.nhead {
		return nil
	}
	tr := b.tr[:0]
	i := 0
	for k, v := range b.hdr.All() {
		if i >= b.nhead && i < end {
			tr = append(tr, exchange.Field{Name: k, Value: v})
		}
		i++
	}
	b.tr = tr
	return tr
}

func (b *reqBody) Read(p []byte) (int, error) { return b.r.Read(p) }

// Pending reports whether bytes of the body have already been received:
// in the reader under the stream, or, with that empty, in the socket.
func (b *reqBody) Pending() bool {
	if b.buf == nil {
		return false
	}
	if b.buf.Buffered() > 0 {
		return true
	}
	if b.sock == nil {
		return false
	}
	data, _ := b.sock.Pending() // EOF or an error: the next Read meets it
	return data
}

// Buffered implements exchange.Source.
func (b *reqBody) Buffered(rest int64) bool {
	if b.conn == nil || b.idle <= 0 {
		return true
	}
	return b.buf != nil && rest >= 0 && int64(b.buf.Buffered()) >= rest
}

// ExtendRead moves the read deadline to body_timeout from now, at most
// every quarter of it.
func (b *reqBody) ExtendRead() {
	now := time.Now()
	if now.Sub(b.extended) > b.idle/4 {
		b.extended = now
		_ = b.conn.SetReadDeadline(now.Add(b.idle))
	}
}

// SetReadDeadline implements exchange.Source.
func (b *reqBody) SetReadDeadline(t time.Time) {
	b.extended = time.Time{}
	_ = b.conn.SetReadDeadline(t)
}

// Truncated implements exchange.Source.
func (b *reqBody) Truncated() bool { return b.ec != nil && b.ec.eof }

// respStream is the client response body: fasthttp pulls it as it
// writes, which is when the upstream body is read and shown to the
// agents (exchange.NextBody), so memory stays at one chunk however large
// the body.
type respStream struct {
	r       *request
	pending []byte
	eof     bool
	chunked bool // fasthttp frames the body chunked
	extend  time.Time
	written int64
	// hijack and guard: an HTTP/1.0 client's body of unknown length
	// (closeDelimited); hijack is 1 once the handler or the guard ran.
	hijack atomic.Int32
	guard  *time.Timer
}

func (b *respStream) reset() {
	b.guard = nil
	b.pending = nil
	b.eof = false
	b.chunked = false
	b.extend = time.Time{}
	b.written = 0
}

// SupportsBodyWriteTo tells fasthttp to call WriteTo.
func (b *respStream) SupportsBodyWriteTo() bool { return true }

// WriteTo writes the whole body to w (fasthttp's connection writer or its
// chunked framer, which flushes every chunk).
func (b *respStream) WriteTo(w io.Writer) (int64, error) {
	var total int64
	ex := &b.r.ex
	for !b.eof {
		data, last, err := ex.NextBody()
		if err != nil {
			return total, err
		}
		if len(data) > 0 {
			b.touch()
			n, err := w.Write(data)
			total += int64(n)
			b.written += int64(n)
			if err != nil {
				return total, err
			}
		}
		b.eof = last
	}
	b.end()
	return total, nil
}

// seenName reports a field of tr named name (in any case).
func seenName(tr []exchange.Field, name []byte) bool {
	for _, f := range tr {
		if bytes.EqualFold(f.Name, name) {
			return true
		}
	}
	return false
}

// end runs once the body's last piece was taken: the upstream's trailers
// go in the chunked body's trailer section (RFC 9112 §7.1.2), which
// fasthttp writes after the last chunk from the fields of the response
// header its Trailer list names (the head is out by now: neither is
// written again). A body in another framing has no trailer section.
func (b *respStream) end() {
	ex := &b.r.ex
	if !b.chunked {
		ex.TrailersDropped()
		return
	}
	tr := ex.Trailers()
	if len(tr) == 0 {
		return
	}
	h := &b.r.ctx.Response.Header
	for i, f := range tr {
		if seenName(tr[:i], f.Name) {
			// A second field of the name: one line, its values joined
			// (RFC 9110 §5.3).
			b.r.scratch = append(append(append(b.r.scratch[:0], h.PeekBytes(f.Name)...), ", "...), f.Value...)
			h.SetBytesKV(f.Name, b.r.scratch)
			continue
		}
		if h.AddTrailerBytes(f.Name) != nil {
			continue
		}
		// The value the trailer section shows is the first of the name.
		h.DelBytes(f.Name)
		h.AddBytesKV(f.Name, f.Value)
	}
}

// Read implements io.Reader for callers that do not use WriteTo.
func (b *respStream) Read(p []byte) (int, error) {
	for len(b.pending) == 0 {
		if b.eof {
			return 0, io.EOF
		}
		data, last, err := b.r.ex.NextBody()
		if err != nil {
			return 0, err
		}
		b.pending, b.eof = data, last
		if last {
			b.end()
		}
	}
	n := copy(p, b.pending)
	b.pending = b.pending[n:]
	b.written += int64(n)
	return n, nil
}

// CloseWithError is called by fasthttp once the body is written or the
// write failed; err is the write error. It ends the request.
func (b *respStream) CloseWithError(err error) error {
	r := b.r
	r.ex.StreamDone(b.written, err)
	if !b.extend.IsZero() {
		_ = r.nc.SetWriteDeadline(time.Time{})
	}
	r.ex.Finish()
	r.release()
	return nil
}

func (b *respStream) touch() {
	r := b.r
	idle := r.l.cfg.BodyTimeout
	now := time.Now()
	if now.Sub(b.extend) > idle/4 {
		b.extend = now
		_ = r.nc.SetWriteDeadline(now.Add(idle))
	}
}

// closeDelimited sends a body of unknown length to an HTTP/1.0 client,
// which cannot read chunked framing (RFC 9112 §7.1: a server must not
// send it to a client that did not say HTTP/1.1): no Content-Length, no
// Transfer-Encoding, the end of the body is the close of the connection.
// fasthttp frames every body stream of unknown length as chunked, so the
// response is written through ctx.Hijack: head and body by respStream,
// on the client's connection, which fasthttp closes once it is done.
func (r *request) closeDelimited() {
	h := &r.ctx.Response.Header
	h.SetContentLength(-1) // drops a Content-Length the agents may change
	h.Del(fasthttp.HeaderTransferEncoding)
	h.SetContentLength(-2) // identity, with Connection: close
	b := &r.out
	b.hijack.Store(0)
	// fasthttp skips the hijack handler only when it cannot reset the
	// connection's deadline or flush earlier responses: the guard then
	// ends the request.
	b.guard = time.AfterFunc(r.l.cfg.ReadTimeout, b.abandonHijack)
	r.ctx.HijackSetNoResponse(true)
	r.ctx.Hijack(b.hijacked)
}

// hijacked is the hijack handler of closeDelimited: head, body, close.
func (b *respStream) hijacked(c net.Conn) {
	if !b.hijack.CompareAndSwap(0, 1) {
		return
	}
	b.guard.Stop()
	r := b.r
	r.scratch = r.ctx.Response.Header.AppendBytes(r.scratch[:0])
	b.touch()
	_, err := c.Write(r.scratch)
	if err == nil {
		_, err = b.WriteTo(c)
	}
	if r.ex.Aborted() {
		// A close-delimited body cut off looks complete: a reset says
		// it is not.
		resetOnClose(r.nc)
	}
	_ = b.CloseWithError(err)
}

// abandonHijack ends a request whose hijack handler never ran.
func (b *respStream) abandonHijack() {
	if !b.hijack.CompareAndSwap(0, 1) {
		return
	}
	b.r.ex.ClientGone()
	_ = b.CloseWithError(nil)
}

// resetOnClose makes the close of the client connection c a reset
// (SO_LINGER 0) when it is TCP.
func resetOnClose(c net.Conn) {
	for {
		switch t := c.(type) {
		case *net.TCPConn:
			_ = t.SetLinger(0)
			return
		case *eofConn:
			c = t.Conn
			if t.raw != nil {
				c = t.raw
			}
		case *rawio.Conn:
			c = t.Conn
		default:
			return
		}
	}
}
