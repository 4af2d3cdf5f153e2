package upstream

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/zentinelproxy/sidecar/dataplane/internal/clock"
	"github.com/zentinelproxy/sidecar/internal/rawio"
)

// Counters are the upstream side's counters, shared by every upstream
// of the server (Stats).
type Counters struct {
	// Stale: idle pools dropped after a stale keep-alive connection;
	// Retries: requests replayed on another connection after a stale one.
	Stale, Retries atomic.Uint64
	// Unsolicited: connections closed because the upstream sent bytes no
	// request asked for; Closed: pooled connections found closed.
	Unsolicited, Closed atomic.Uint64
	// EndpointRetries: attempts moved to another endpoint.
	EndpointRetries atomic.Uint64
}

// upConn is a pooled upstream connection that remembers the deadlines set
// on it. A request on a warm connection moves a deadline only when it is
// not already between 7/8 of its timeout and all of it from now:
// SetReadDeadline and SetWriteDeadline
// take the poller's lock and reprogram a runtime timer (3-5% of a proxied
// request when done twice per request), and a timeout enforced between
// 7/8 and all of its configured value serves the same purpose.
type upConn struct {
	net.Conn
	readDL, writeDL time.Time
}

var errNoSyscallConn = errors.New("dataplane: connection has no socket")

// SetReadDeadline implements net.Conn, keeping the cache in step.
func (c *upConn) SetReadDeadline(t time.Time) error {
	c.readDL = t
	return c.Conn.SetReadDeadline(t)
}

// SetWriteDeadline implements net.Conn, keeping the cache in step.
func (c *upConn) SetWriteDeadline(t time.Time) error {
	c.writeDL = t
	return c.Conn.SetWriteDeadline(t)
}

// SyscallConn exposes the socket.
func (c *upConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errNoSyscallConn
}

// extendRead sets the read deadline of c to d from now, or leaves it
// where it is when that is between 7/8 of d and d from now.
func extendRead(c net.Conn, d time.Duration) {
	now := clock.At(clock.Mono())
	if uc, ok := c.(*upConn); ok {
		if left := uc.readDL.Sub(now); left >= d-d/8 && left <= d {
			return
		}
		_ = uc.SetReadDeadline(now.Add(d))
		return
	}
	_ = c.SetReadDeadline(now.Add(d))
}

// extendWrite is extendRead for the write deadline.
func extendWrite(c net.Conn, d time.Duration) {
	now := clock.At(clock.Mono())
	if uc, ok := c.(*upConn); ok {
		if left := uc.writeDL.Sub(now); left >= d-d/8 && left <= d {
			return
		}
		_ = uc.SetWriteDeadline(now.Add(d))
		return
	}
	_ = c.SetWriteDeadline(now.Add(d))
}

// wrapUp wraps a dialed upstream connection in an upConn.
func wrapUp(c net.Conn, err error) (net.Conn, error) {
	if err != nil {
		return nil, err
	}
	return &upConn{Conn: rawio.Wrap(c)}, nil
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

// holdWrites has the request's last write go out with the read of the
// response (rawio.Conn.HoldWrites): the read that would find nothing yet
// (EAGAIN) is not made, one system call fewer per request, which costs
// 1.2–1.5 µs on a paravirtualized guest. Only for a request without a
// body and a replayable method, on a reused connection: a failed write
// then shows at the read, where the stale-connection check still
// recognises it and the replay rules still allow the retry.
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
func acquireConn[C pooledConn](ep *Endpoint, st *Counters, acquire func(time.Duration, bool) (C, error), closeConn func(C)) (C, error) {
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
			st.Unsolicited.Add(1)
		} else {
			st.Closed.Add(1)
		}
		if (perr != nil && !flushed) || n+1 == maxDiscards {
			// A pooled connection the upstream closed while idle: after
			// an upstream restart (or its idle timeout) the older idle
			// ones are closed too, the pool being used last in, first
			// out. Drop them all rather than finding out one at a time.
			flushed = true
			ep.hc.CloseIdleConnections()
			st.Stale.Add(1)
		}
	}
}

// pooledConn is what acquireConn needs of a pooled connection.
type pooledConn interface {
	Conn() net.Conn
	LastUseTime() time.Time
}

// begin counts an attempt on the endpoint, in flight until end.
func (ep *Endpoint) begin() {
	ep.requests.Add(1)
	ep.inflight.Add(1)
}

// end ends an attempt begin counted.
func (ep *Endpoint) end() { ep.inflight.Add(-1) }

// closeIdle closes the idle connections of ep and of its health check.
func (ep *Endpoint) closeIdle() {
	ep.hc.CloseIdleConnections()
	if ep.h2 != nil {
		ep.h2.closeIdle()
	}
	if c := ep.checkHC.Load(); c != nil {
		c.CloseIdleConnections()
	}
}

// errTLSConfig is an upstream TLS setting that cannot be loaded (a
// missing file, a bad PEM block, a key that does not match).
var errTLSConfig = errors.New("dataplane: TLS configuration")

// fileStamp is what a TLS file looked like: a change of its modification
// time or size makes a reload build new pools.
type fileStamp struct {
	path string
	mod  time.Time
	size int64
}

func statFiles(paths []string) []fileStamp {
	out := make([]fileStamp, len(paths))
	for i, p := range paths {
		out[i].path = p
		if fi, err := os.Stat(p); err == nil {
			out[i].mod, out[i].size = fi.ModTime(), fi.Size()
		}
	}
	return out
}
