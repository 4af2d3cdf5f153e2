// Package h2conn wraps the connections x/net/http2 serves (the HTTP/2
// front end's clients) and dials (HTTP/2 upstreams): reads buffered,
// writes held and coalesced by a drain goroutine.
package h2conn

import (
	"bufio"
	"crypto/tls"
	"net"
	"runtime"
	"sync"
	"time"
)

// Conn is a connection as x/net/http2's server or client reads and
// writes it: reads buffered, writes coalesced.
//
// x/net's Framer reads each frame straight from the connection, its
// 9-byte header and then its payload: two read(2) per frame, where the
// frames a client sends together (h2load -m 10: ten HEADERS in one
// segment) need one read. The buffer takes what arrived in one read.
//
// x/net flushes its write buffer whenever its write queue runs empty,
// and on one CPU it runs empty after every frame: a stream's HEADERS
// and DATA go out in two write(2), each a system call and, on loopback,
// the peer's receive path besides (about 6 per request with the
// upstream's). Write keeps the bytes and a drain goroutine writes them
// once the goroutines already runnable have run (runtime.Gosched): the
// other streams' frames finished meanwhile go out in the same write.
// When nothing else is runnable the drain writes at once, so an idle
// connection's answer is not delayed.
type Conn struct {
	net.Conn
	r *bufio.Reader

	mu   sync.Mutex
	cond sync.Cond // a change of writing, pend or err
	// pend are the bytes written and not yet sent, spare the buffer the
	// drain sent last (both back to pendPool when the drain ends: an
	// idle connection holds none).
	pend, spare *pendBuf
	// writing: a drain goroutine runs (or a large write is being sent
	// directly); err is the write error that ended the connection.
	writing bool
	err     error
	closed  bool
	// writeTimeout (SetWriteTimeout) bounds each write the drain makes;
	// zero: the deadlines the caller sets.
	writeTimeout time.Duration
	// drainFn is c.drain as a func value made once: go c.drain() would
	// allocate the bound method's closure at every start (about 2 per
	// gRPC call, the front's and the upstream's).
	drainFn func()
	// stop is the connection's close, once.
	stop sync.Once
}

const (
	// readBufSize is the read buffer of a connection: a burst of
	// frames (a HEADERS frame is tens of bytes); larger reads bypass it.
	readBufSize = 4 << 10
	// maxPending bounds the bytes a connection holds unsent: past it
	// Write waits for the drain, so a client that stops reading stops
	// the server's writes as before, with less than maxPending +
	// directWrite more buffered. The frames of a hundred small
	// responses are about 10KiB.
	maxPending = 16 << 10
	// directWrite: a write this large waits for what is held to go out,
	// then is sent at once (a large DATA frame gains nothing from
	// waiting, and is not copied).
	directWrite = 16 << 10
	// closeDrain bounds how long Close waits for the held bytes to go
	// out (the last frames, a GOAWAY) to a client that does not read.
	closeDrain = time.Second
)

type pendBuf struct{ b []byte }

var pendPool = sync.Pool{New: func() any { return &pendBuf{b: make([]byte, 0, 8<<10)} }}

// held is the number of bytes held unsent; c.mu held.
func (c *Conn) held() int {
	if c.pend == nil {
		return 0
	}
	return len(c.pend.b)
}

// New wraps c for x/net: a TLS connection keeps its
// ConnectionState, which x/net checks (RFC 9113 §9.2).
func New(c net.Conn) (*Conn, net.Conn) {
	w := &Conn{Conn: c, r: bufio.NewReaderSize(c, readBufSize)}
	w.cond.L = &w.mu
	w.drainFn = w.drain
	if cs, ok := c.(connectionStater); ok {
		return w, tlsConn{w, cs}
	}
	return w, w
}

type connectionStater interface {
	ConnectionState() tls.ConnectionState
}

// tlsConn is a Conn over TLS.
type tlsConn struct {
	*Conn
	cs connectionStater
}

func (c tlsConn) ConnectionState() tls.ConnectionState { return c.cs.ConnectionState() }

// SetWriteTimeout makes every write to the connection fail when no byte
// of it went for d, and the caller's write deadlines ignored. A
// deadline set around Write (x/net's client with WriteByteTimeout) would
// bound the copy into the held bytes, not their sending by the drain:
// the drain sets its own before each write. Call it before the first
// Write.
func (c *Conn) SetWriteTimeout(d time.Duration) { c.writeTimeout = d }

// SetWriteDeadline implements net.Conn; ignored after SetWriteTimeout.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if c.writeTimeout > 0 {
		return nil
	}
	return c.Conn.SetWriteDeadline(t)
}

// SetDeadline implements net.Conn: the write deadline as SetWriteDeadline.
func (c *Conn) SetDeadline(t time.Time) error {
	if c.writeTimeout > 0 {
		return c.Conn.SetReadDeadline(t)
	}
	return c.Conn.SetDeadline(t)
}

// send writes p to the connection, within writeTimeout if set and the
// connection is not closing (Close set its deadline, closeDrain).
func (c *Conn) send(p []byte, closing bool) (int, error) {
	if c.writeTimeout > 0 && !closing {
		_ = c.Conn.SetWriteDeadline(time.Now().Add(c.writeTimeout))
	}
	return c.Conn.Write(p)
}

// Read implements net.Conn, from the read buffer.
func (c *Conn) Read(p []byte) (int, error) { return c.r.Read(p) }

// Write implements net.Conn: p is kept and sent by the drain (or at once
// when large and nothing is held). Its error is the one that ended the
// connection, from an earlier write.
func (c *Conn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	large := len(p) >= directWrite
	c.mu.Lock()
	for c.err == nil && !c.closed && (c.held() >= maxPending || large && c.writing) {
		c.cond.Wait()
	}
	switch {
	case c.err != nil:
		err := c.err
		c.mu.Unlock()
		return 0, err
	case c.closed:
		c.mu.Unlock()
		return 0, net.ErrClosed
	}
	if large {
		c.writing = true
		c.mu.Unlock()
		n, err := c.send(p, false)
		c.mu.Lock()
		c.wrote(err)
		if c.held() > 0 && c.err == nil {
			// Another Write came meanwhile (x/net writes one at a time,
			// so only after a close).
			go c.drainFn()
		} else {
			c.writing = false
			c.cond.Broadcast()
		}
		c.mu.Unlock()
		return n, err
	}
	if c.pend == nil {
		c.pend = pendPool.Get().(*pendBuf)
	}
	c.pend.b = append(c.pend.b, p...)
	if !c.writing {
		c.writing = true
		go c.drainFn()
	}
	c.mu.Unlock()
	return len(p), nil
}

// wrote records the outcome of a write; c.mu held.
func (c *Conn) wrote(err error) {
	if err != nil && c.err == nil {
		c.err = err
		// The reader is stopped too, so that x/net's serve loop ends
		// even when it writes nothing more.
		c.closeConn()
	}
}

// drain sends what Write kept until nothing is left.
func (c *Conn) drain() {
	// The goroutines already runnable (the handlers of other streams
	// finishing their responses) go first: what they write joins this
	// write. Without the yield (a new goroutine runs next) the sidecar-h2
	// and sidecar-uds-h2 rows cost 7% (3–7%) more CPU per request,
	// measured at the same time (bench/peers -together).
	runtime.Gosched()
	c.mu.Lock()
	for c.held() > 0 && c.err == nil {
		b := c.pend
		c.pend, c.spare = c.spare, nil
		closing := c.closed
		c.mu.Unlock()
		_, err := c.send(b.b, closing)
		c.mu.Lock()
		c.wrote(err)
		b.b = b.b[:0]
		if c.pend == nil {
			c.pend = b
		} else {
			c.spare = b
		}
		c.cond.Broadcast()
	}
	for _, b := range [...]*pendBuf{c.pend, c.spare} {
		if b != nil && cap(b.b) <= 2*maxPending {
			b.b = b.b[:0]
			pendPool.Put(b)
		}
	}
	c.pend, c.spare = nil, nil
	c.writing = false
	c.cond.Broadcast()
	c.mu.Unlock()
}

// Close implements net.Conn: what is held goes out first, for at most
// closeDrain.
func (c *Conn) Close() error {
	c.mu.Lock()
	c.closed = true
	if c.writing {
		_ = c.Conn.SetWriteDeadline(time.Now().Add(closeDrain))
		for c.writing {
			c.cond.Wait()
		}
	}
	c.mu.Unlock()
	return c.closeConn()
}

// Abort closes the connection without sending what is held.
func (c *Conn) Abort() { _ = c.closeConn() }

func (c *Conn) closeConn() error {
	var err error
	c.stop.Do(func() { err = c.Conn.Close() })
	return err
}
