package upstream

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/internal/rawio"
)

// An upstream may answer before it has read the whole request body: an
// early 413, a 401 or a redirect, sent with Connection: close, after
// which it stops reading. The request's writes then fill the socket's
// buffer and wait for room that never comes until the upstream closes the
// connection (Go's net/http waits 500 ms, others longer) or the write
// times out (idle_timeout, 60 s by default), and the answer waits with
// them. As RFC 9112 (section 9.5) asks of a client that sends a body, a
// write that finds the socket full looks for the answer: a complete final
// response already received that refuses the body (an error, or
// Connection: close) is relayed at once, the rest of the body is not
// sent, and the connection is closed afterwards. A
// response that is not complete yet (a head that streams its body, a body
// not all received), or a success on a connection the upstream keeps,
// leaves the body to be sent, as before: an upstream may answer while it
// still reads.
//
// A write that finds room costs nothing more: the look is made only when
// the socket's buffer is full (EAGAIN), one recvfrom(2) with MSG_PEEK.
// While the buffer stays full, the look is repeated every earlyWatch.
// Only plain TCP and Unix sockets are watched: a TLS connection's writes
// go through its record layer, which a write deadline that expires
// breaks for good.

// earlyWatch is how often a write waiting for room looks for an answer
// that came after the buffer filled: the upstream stopped reading, then
// answered. An answer there before the buffer filled is seen at once.
const earlyWatch = 50 * time.Millisecond

// errEarlyAnswer stops the request's writes: the upstream's complete
// response is waiting, read from the connection instead.
var errEarlyAnswer = errors.New("upstream answered before the request body was sent")

// plainSock is the raw socket an upstream connection writes to directly
// (no TLS in between), or nil.
func plainSock(c net.Conn) *rawio.Conn {
	if uc, ok := c.(*upConn); ok {
		c = uc.Conn
	}
	rc, _ := c.(*rawio.Conn)
	return rc
}

// watchWrites has the body's writes look for an early answer when the
// socket is full (writeWatching); false when the connection is not a
// plain socket.
func (c *call) watchWrites(conn net.Conn) bool {
	sock := plainSock(conn)
	if sock == nil {
		return false
	}
	rc, err := sock.SyscallConn()
	if err != nil {
		return false
	}
	c.wsock, c.wrc = sock, rc
	return true
}

// tryWrite is the RawConn.Write callback of writeWatching: it writes what
// fits and never asks the poller to wait.
func (c *call) tryWrite(fd uintptr) bool {
	c.werr = rawio.WriteFrom(int(fd), c.wbuf, &c.wn)
	return true
}

// writeWatching writes p as the socket takes it; when the socket is full,
// it waits for room in steps of earlyWatch and looks for the upstream's
// answer before each (earlyAnswer), within the write's idle timeout of no
// progress.
func (c *call) writeWatching(p []byte) (int, error) {
	c.wbuf, c.wn, c.werr = p, 0, 0
	err := c.wrc.Write(c.tryWriteFn)
	n, errno := c.wn, c.werr
	c.wbuf = nil
	switch {
	case err != nil:
		return n, err
	case errno == 0:
		return n, nil
	case errno != syscall.EAGAIN:
		return n, &net.OpError{Op: "write", Net: c.conn.LocalAddr().Network(), Source: c.conn.LocalAddr(), Addr: c.conn.RemoteAddr(), Err: os.NewSyscallError("write", errno)}
	}
	idle := c.up.cfg.IdleTimeout
	limit := time.Now().Add(idle)
	for {
		if c.earlyAnswer() {
			return n, errEarlyAnswer
		}
		now := time.Now()
		if !now.Before(limit) {
			_ = c.conn.SetWriteDeadline(limit) // the write's own timeout
		} else {
			step := now.Add(earlyWatch)
			if limit.Before(step) {
				step = limit
			}
			_ = c.conn.SetWriteDeadline(step)
		}
		m, err := c.wsock.Write(p[n:])
		n += m
		if err == nil {
			// The next write's first attempt must not meet the step's
			// deadline.
			_ = c.conn.SetWriteDeadline(time.Now().Add(idle))
			return n, nil
		}
		if !isTimeout(err) || !now.Before(limit) {
			return n, err
		}
		if m > 0 {
			limit = time.Now().Add(idle) // progress: the idle timeout starts again
		}
	}
}

// earlyAnswer reports whether a complete final response is waiting on the
// connection: it reads what was received into the response reader (which
// readHead then parses) and looks at it without consuming it.
func (c *call) earlyAnswer() bool {
	data, _ := c.wsock.Pending()
	if !data {
		return false
	}
	br := c.br
	if br == nil {
		c.wrap = eofConn{Conn: c.conn}
		br = c.ep.hc.AcquireReader(&c.wrap)
		c.br = br
	}
	n := br.Buffered()
	if n >= br.Size() {
		return false // a head larger than the reader: left to readHead
	}
	// The read deadline in force may be long past (an idle pooled
	// connection's); the read below finds data and does not wait.
	extendRead(c.conn, c.up.cfg.ResponseTimeout)
	if _, err := br.Peek(n + 1); err != nil {
		return false // met by readHead
	}
	b, _ := br.Peek(br.Buffered())
	return completeAnswer(b, c.req.Head)
}

// scanners parse a received head without consuming it.
var scanners = sync.Pool{New: func() any { return new(headScanner) }}

type headScanner struct {
	h  fasthttp.ResponseHeader
	r  bytes.Reader
	br *bufio.Reader
}

var headEnd = []byte("\r\n\r\n")

// completeAnswer reports whether b starts with a complete final response
// that ends the request: interim (1xx) heads, a final head that is an
// error (4xx, 5xx) or closes the connection (RFC 9112, 9.5: the server does
// not wish to receive the body), and all of its body when its length is
// known (Content-Length, or none). A chunked body or one delimited by the
// close of the connection counts as not complete; so does a 101.
func completeAnswer(b []byte, head bool) bool {
	s := scanners.Get().(*headScanner)
	defer scanners.Put(s)
	for {
		end := bytes.Index(b, headEnd)
		if end < 0 {
			return false
		}
		end += len(headEnd)
		s.r.Reset(b[:end])
		if s.br == nil || s.br.Size() < end {
			s.br = bufio.NewReaderSize(&s.r, max(end, 4096))
		} else {
			s.br.Reset(&s.r)
		}
		s.h.Reset()
		s.h.SetNoDefaultContentType(true)
		if err := s.h.Read(s.br); err != nil {
			return false
		}
		st := s.h.StatusCode()
		if st >= 100 && st < 200 && st != fasthttp.StatusSwitchingProtocols {
			b = b[end:]
			continue
		}
		if st < 200 {
			return false
		}
		if st < 400 && !s.h.ConnectionClose() {
			// A success or a redirect on a connection the upstream keeps
			// may still want the body (it has to read it anyway to read
			// the next request): the body goes on.
			return false
		}
		cl := s.h.ContentLength()
		switch {
		case head || st == fasthttp.StatusNoContent || st == fasthttp.StatusNotModified || cl == 0:
			return true
		case cl > 0:
			return int64(len(b)-end) >= int64(cl)
		}
		return false
	}
}
