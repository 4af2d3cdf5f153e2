package http1

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/dataplane/internal/exchange"
	"github.com/zentinelproxy/sidecar/dataplane/internal/ratelog"
	"github.com/zentinelproxy/sidecar/internal/observe"
	"github.com/zentinelproxy/sidecar/internal/rawio"
	"github.com/zentinelproxy/sidecar/internal/yield"
)

// eofConn records that a read on the connection reached the end of the
// stream. fasthttp's streamed bodies report a peer that vanished mid-body
// as a plain io.EOF; a body that needed bytes past the connection's end is
// truncated, while a complete body never reads that far.
//
// On client connections it also counts the bytes read since the last line
// feed (lineRun), for reads into fasthttp's header buffer (at most hdrBuf
// bytes). When a request head does not fit that buffer, a run as long as
// the buffer means the request line itself never ended: 414, not 431.
//
// And a read that follows a write yields first (see Read).
//
// A client connection also holds its place in its listener's connection
// count (conns) until it closes or becomes a tunnel, and closes
// lingeringly when marked so (linger).
type eofConn struct {
	net.Conn
	eof     bool
	hdrBuf  int
	lineRun int
	// got: a byte of a request arrived (not set by a TLS handshake).
	got bool
	// pre are bytes read before fasthttp had the connection (the look
	// for an HTTP/2 preface, sniff.go), read again first.
	pre []byte

	// conns is the listener's connection set (nil on upstream
	// connections); state holds connHeld, connLinger and connClosed.
	conns *connSet
	state atomic.Uint32

	// On TLS listeners (tls.go): Conn is tls, raw the TCP socket under it
	// (a *rawio.Conn, as rw).
	raw    net.Conn
	tls    *tls.Conn
	hs     *hsConn
	lt     *listenerTLS
	hsDone bool
	facts  *exchange.TLSFacts

	// wrote is set by Write and taken by the next Read. Atomic because a
	// tunnelled connection (upgrade.go) is read and written at once.
	wrote atomic.Bool

	// rw counts the reads that had to wait (the socket itself, under TLS
	// too); nil when the connection is not a raw socket, and then every
	// read that follows a write yields. yield is touched by the reading
	// goroutine only.
	rw    *rawio.Conn
	yield yield.Policy

	// The client's address as the exchange uses it, worked out on the
	// connection's first request (net.TCPAddr.AddrPort and the text of
	// the IP cost about 1% of the proxy's CPU when done per request).
	// ip's capacity is its length: an append copies.
	ip       []byte
	port     int
	addrDone bool
	// info is what the exchange knows of the connection (connInfo).
	info     exchange.Conn
	infoDone bool
}

// connInfo is the connection's facts for the exchange, worked out on its
// first request: the client's and the local address, the TLS facts (the
// handshake is done by then) and the listener.
func (c *eofConn) connInfo(l *exchange.Listener) *exchange.Conn {
	if !c.infoDone {
		c.infoDone = true
		c.info.ClientIP, c.info.ClientPort = c.clientAddr()
		c.info.ServerIP, c.info.ServerPort = tcpAddrText(nil, c.LocalAddr())
		c.info.TLS = c.facts
		c.info.Listener = l
	}
	return &c.info
}

// clientAddr returns the text of the client's IP (nil when the peer is
// not TCP) and its port, read-only.
func (c *eofConn) clientAddr() ([]byte, int) {
	if !c.addrDone {
		c.addrDone = true
		c.ip, c.port = tcpAddrText(nil, c.RemoteAddr())
	}
	return c.ip, c.port
}

// tcpAddrText appends the text of a's IP (IPv4-mapped addresses as IPv4)
// to dst and returns it (nil when a is not TCP), with a's port.
func tcpAddrText(dst []byte, a net.Addr) ([]byte, int) {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return nil, 0
	}
	ap := ta.AddrPort()
	dst = ap.Addr().Unmap().AppendTo(dst)
	return dst[:len(dst):len(dst)], int(ap.Port())
}

// newEOFConn wraps an accepted connection; c is what the requests are
// read from (the TLS connection on a TLS listener), rw the socket.
func newEOFConn(c net.Conn, rw net.Conn, hdrBuf int) *eofConn {
	e := &eofConn{Conn: c, hdrBuf: hdrBuf}
	e.rw, _ = rw.(*rawio.Conn)
	return e
}

// Write implements net.Conn, noting that a write happened.
func (c *eofConn) Write(p []byte) (int, error) {
	c.wrote.Store(true)
	return c.Conn.Write(p)
}

var errNoSyscallConn = errors.New("dataplane: connection has no socket")

func (c *eofConn) Read(p []byte) (int, error) {
	if c.tls != nil && !c.hsDone {
		if err := c.handshake(); err != nil {
			return 0, err
		}
	}
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		c.got = true
		if bytes.IndexByte(p[:n], '\n') < 0 {
			c.lineRun += n
		}
		return n, nil
	}
	probe, w0 := false, uint32(0)
	if c.wrote.Load() {
		// A read right after a response waits for the client's next
		// request, which has rarely arrived yet: read at once, it meets
		// EAGAIN and the goroutine parks in the poller, a wasted system
		// call and a second wake-up. Yielding once lets the goroutines
		// already runnable go first; under load the request has usually
		// arrived by then. Below that load it has not, and the yield is
		// a cost: c.yield keeps it only while it pays.
		c.wrote.Store(false)
		if c.rw == nil || c.yield.Before() {
			yield.Gosched(c)
			if c.rw != nil {
				probe, w0 = true, c.rw.Waits()
			}
		}
	}
	n, err := c.Conn.Read(p)
	if probe {
		// Paid: the request was there. Under TLS one Read may take more
		// than one read(2), and a record split across segments whose
		// second half had not arrived counts as unpaid: a bias towards
		// not yielding, the cheaper mistake.
		c.yield.After(c.rw.Waits() == w0)
	}
	if err == io.EOF || (err == io.ErrUnexpectedEOF && c.tls != nil) {
		// TLS reports a FIN without close_notify as unexpected.
		c.eof = true
	}
	if n > 0 {
		c.got = true
		if len(p) <= c.hdrBuf {
			// Reads larger than the header buffer bypass it (body reads);
			// header reads find their line feed within the first bytes.
			if i := bytes.IndexByte(p[:n], '\n'); i < 0 {
				c.lineRun += n
			} else {
				c.lineRun = 0
			}
		}
	}
	return n, err
}

// requestLineTooLong reports whether the header buffer filled without a
// line feed: the request line (URI) is what did not fit.
func (c *eofConn) requestLineTooLong() bool { return c.hdrBuf > 0 && c.lineRun >= c.hdrBuf }

// SyscallConn exposes the socket for the disconnect check.
func (c *eofConn) SyscallConn() (syscall.RawConn, error) {
	if c.raw != nil {
		// TLS: peek the TCP socket under it.
		if sc, ok := c.raw.(syscall.Conn); ok {
			return sc.SyscallConn()
		}
		return nil, errNoSyscallConn
	}
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errNoSyscallConn
}

// States of a client connection (eofConn.state).
const (
	connHeld   = 1 << iota // holds a place in its listener's count
	connLinger             // to be closed lingeringly (markLinger)
	connClosed             // Close ran
)

// connSet is a listener's client connections: their count against
// max_connections, and the bounds and counters of their ends.
//
// A connection takes its place when accepted and gives it back exactly
// once: when it closes (after its lingering close, if any: it holds a
// descriptor until then), or when it becomes a tunnel (max_tunnels
// bounds those; the dataplane's fdlimit.go keeps both within the
// descriptor budget).
// fasthttp closes every connection it served or hijacked through Close,
// TLS handshake failures included; state makes a second Close (a
// shutdown closing an idle connection, then its worker) a no-op.
type connSet struct {
	name        string
	max         int64
	lingerFor   time.Duration
	lingerBytes int64

	open                                   atomic.Int64
	accepted, refused, idleClosed          atomic.Uint64
	lingered, lingerTimeouts, lingerCapped atomic.Uint64
	lingerDiscarded                        atomic.Uint64
	lingering                              atomic.Int64 // marked, not yet closed (Shutdown waits)
	refusedLog                             ratelog.Every
}

func newConnSet(name string, maxConns int, lingerFor time.Duration, lingerBytes int64) *connSet {
	return &connSet{name: name, max: int64(maxConns), lingerFor: lingerFor, lingerBytes: lingerBytes}
}

func (cs *connSet) snapshot() observe.ConnStats {
	return observe.ConnStats{
		Listener: cs.name, Open: cs.open.Load(), Accepted: cs.accepted.Load(),
		RefusedMaxConnections: cs.refused.Load(), IdleClosed: cs.idleClosed.Load(),
		LingeringCloses: cs.lingered.Load(), LingeringTimeouts: cs.lingerTimeouts.Load(),
		LingeringCapped: cs.lingerCapped.Load(), LingeringBytes: cs.lingerDiscarded.Load(),
	}
}

// admit takes a place for a new connection, or reports that max are
// taken.
func (cs *connSet) admit() bool {
	cs.accepted.Add(1)
	if cs.open.Add(1) > cs.max {
		cs.open.Add(-1)
		return false
	}
	return true
}

// hold makes c a client connection of cs, holding the place admit took.
func (c *eofConn) hold(cs *connSet) {
	c.conns = cs
	c.state.Store(connHeld)
}

// release gives the connection's place back, once.
func (c *eofConn) release() {
	if c.conns != nil && c.state.And(^uint32(connHeld))&connHeld != 0 {
		c.conns.open.Add(-1)
	}
}

// markLinger asks for a lingering close: the connection is to be closed
// while the client may still be sending (a request refused before its
// body was read, a request head refused). Closing a socket with unread
// bytes, or with bytes still arriving, makes the kernel answer with a
// reset, and a client whose write fails on it (Go's net/http, for one)
// loses the answer it was sent.
func (c *eofConn) markLinger() {
	if c.conns != nil && c.state.Or(connLinger)&connLinger == 0 {
		c.conns.lingering.Add(1)
	}
}

// Close implements net.Conn: once, lingeringly when marked so. The
// connection's place is given back before its socket closes: a client
// that sees the close and connects again finds it free.
func (c *eofConn) Close() error {
	cs := c.conns
	if cs == nil {
		return c.Conn.Close()
	}
	old := c.state.Or(connClosed)
	if old&connClosed != 0 {
		return nil
	}
	// A client that ended its side (eof) sends nothing more.
	lingered := old&connLinger != 0
	if lingered && !c.eof {
		c.linger(cs)
	}
	c.release()
	err := c.Conn.Close()
	if lingered {
		cs.lingering.Add(-1)
	}
	return err
}

var lingerBufs = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}

// linger is the first half of a close the way nginx's lingering_close
// does it: it shuts down the write side (the client reads the end of the
// answer) and reads and discards what the client still sends until it
// closes, for at most lingerFor and lingerBytes. Bytes past those bounds
// are the client's loss (the close that follows resets the connection):
// a client cannot hold a connection this way.
func (c *eofConn) linger(cs *connSet) {
	sock := c.Conn
	if c.raw != nil {
		sock = c.raw
		if c.facts != nil {
			_ = c.tls.CloseWrite() // close_notify, then the TCP FIN below
		}
	}
	under := sock
	if rc, ok := sock.(*rawio.Conn); ok {
		under = rc.Conn
	}
	hc, ok := under.(interface{ CloseWrite() error })
	if !ok || hc.CloseWrite() != nil {
		return
	}
	cs.lingered.Add(1)
	_ = sock.SetReadDeadline(time.Now().Add(cs.lingerFor))
	bp := lingerBufs.Get().(*[]byte)
	var n int64
	for {
		k, err := sock.Read(*bp)
		n += int64(k)
		if n >= cs.lingerBytes {
			cs.lingerCapped.Add(1)
			break
		}
		if err != nil {
			if isTimeout(err) {
				cs.lingerTimeouts.Add(1)
			}
			break
		}
	}
	lingerBufs.Put(bp)
	cs.lingerDiscarded.Add(uint64(n))
}

// eofListener wraps accepted connections in eofConn (one allocation per
// connection, none per request), enforces max_connections and keeps
// accepting through resource exhaustion.
//
// A connection past max_connections is closed at once, unanswered,
// counted and logged (at most once per acceptLogEvery). fasthttp's own
// limit (Server.Concurrency) writes a 503 right after accept: a client
// reads that as the answer to whatever it sends next, or logs it as an
// unsolicited response on an idle connection.
//
// fasthttp ends Serve on any accept error that is not a timeout, and the
// sidecar used to take that for a failed listener and shut down: running
// out of file descriptors (EMFILE) under a burst of idle connections
// stopped the process. Like net/http and nginx, the listener logs (rate
// limited), backs off from 5ms doubling to 1s, and accepts again once
// descriptors free up; connections already open keep being served.
type eofListener struct {
	net.Listener
	hdrBuf int
	tls    *listenerTLS // nil: plain
	conns  *connSet
	log    zerolog.Logger
	stats  *Counters
	closed atomic.Bool
	// detached: Close leaves the socket open for another listener
	// (Listener.Detach).
	detached atomic.Bool
	// exhausted rate-limits the exhaustion warning.
	exhausted ratelog.Every
}

// Accept backoff bounds (net/http's).
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
	acceptLogEvery   = 10 * time.Second
)

func (l *eofListener) Accept() (net.Conn, error) {
	var delay time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil && l.detached.Load() {
			// Woken by Detach's deadline: this listener is done with the
			// socket, which stays open.
			return nil, net.ErrClosed
		}
		if err == nil {
			if l.conns != nil && !l.conns.admit() {
				l.refuse(c)
				continue
			}
			var e *eofConn
			if l.tls != nil {
				e = l.wrapTLS(c)
			} else {
				rc := rawio.Wrap(c)
				e = newEOFConn(rc, rc, l.hdrBuf)
			}
			if l.conns != nil {
				e.hold(l.conns)
			}
			return e, nil
		}
		if !acceptRetryable(err) || l.closed.Load() {
			return nil, err
		}
		if delay == 0 {
			delay = acceptBackoffMin
		} else if delay *= 2; delay > acceptBackoffMax {
			delay = acceptBackoffMax
		}
		if l.stats != nil {
			l.stats.acceptErrors.Add(1)
		}
		l.logExhausted(err, delay)
		time.Sleep(delay)
	}
}

// Close stops the listener; an Accept backing off returns at its next try.
func (l *eofListener) Close() error {
	l.closed.Store(true)
	if l.detached.Load() {
		return nil
	}
	return l.Listener.Close()
}

// deadliner is a listening socket whose Accept a deadline can wake
// (*net.TCPListener, *net.UnixListener).
type deadliner interface{ SetDeadline(time.Time) error }

// detach stops accepting without closing the socket: a past deadline
// wakes the Accept in progress, which returns net.ErrClosed.
func (l *eofListener) detach() bool {
	d, ok := l.Listener.(deadliner)
	if !ok {
		return false
	}
	l.detached.Store(true)
	return d.SetDeadline(time.Unix(1, 0)) == nil
}

func (l *eofListener) logExhausted(err error, delay time.Duration) {
	ok, n := l.exhausted.Allow(acceptLogEvery)
	if !ok {
		return
	}
	e := l.log.Warn().Err(err).Dur("retry_in", delay).Str("address", l.Addr().String())
	if n > 0 {
		e = e.Uint64("suppressed", n)
	}
	e.Msg("accept failed (out of file descriptors or memory?); backing off, existing connections keep being served")
}

// refuse closes a connection accepted past max_connections without a
// byte written.
func (l *eofListener) refuse(c net.Conn) {
	cs := l.conns
	cs.refused.Add(1)
	_ = c.Close()
	ok, n := cs.refusedLog.Allow(acceptLogEvery)
	if !ok {
		return
	}
	e := l.log.Warn().Str("listener", cs.name).Int64("max_connections", cs.max).Str("client", c.RemoteAddr().String())
	if n > 0 {
		e = e.Uint64("suppressed", n)
	}
	e.Msg("connection refused: max_connections are open; closed unanswered")
}

// acceptRetryable reports the accept errors that are about resources, not
// the listener: the process or system is out of descriptors or buffers,
// or the connection was aborted before it was accepted.
func acceptRetryable(err error) bool {
	if errors.Is(err, net.ErrClosed) {
		return false
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM,
			syscall.ECONNABORTED, syscall.EAGAIN, syscall.EINTR, syscall.EPROTO, syscall.EPERM:
			return true
		}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	return errors.Is(err, os.ErrDeadlineExceeded)
}
