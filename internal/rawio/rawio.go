// Package rawio reads and writes sockets with raw system calls, outside
// the Go scheduler's system-call state.
//
// A read or write through net.Conn enters the runtime's system-call state
// for its duration. On a loaded core shared with an agent process, the
// write that wakes the agent is often preempted before it returns; the
// runtime's monitor thread then finds the P "in a system call" for more
// than 20 µs, hands it to another thread, and keeps polling every 20 µs
// for the next millisecond. Each of those hand-offs and polls is a context
// switch. On a non-blocking socket, read(2) and write(2) never block, so
// they can run as raw calls: the P stays with its thread, the monitor
// stays asleep, and readiness is still waited for through the runtime's
// poller (syscall.RawConn), with the connection's deadlines.
//
// Conn does that for one connection without allocating per call: the
// callbacks are bound once, when the connection is wrapped. Built with
// -race, the calls go through package syscall instead, which is how the
// race detector learns that a socket's write happens before the read of
// its bytes.
package rawio

import (
	"io"
	"net"
	"syscall"
)

// Conn is a net.Conn whose Read and Write are raw system calls on its
// socket. Its other methods (deadlines, Close, addresses) are the
// wrapped connection's. One Read and one Write may run concurrently, as
// on any net.Conn.
type Conn struct {
	net.Conn
	rc syscall.RawConn

	readFn  func(uintptr) bool
	rbuf    []byte
	rn      int
	rerr    syscall.Errno
	writeFn func(uintptr) bool
	wbuf    []byte
	wn      int
	werr    syscall.Errno
}

// Wrap returns c as a *Conn when c is a TCP or Unix socket, and c itself
// otherwise (TLS, pipes and other wrappers keep their own I/O).
func Wrap(c net.Conn) net.Conn {
	var sc syscall.Conn
	switch t := c.(type) {
	case *net.TCPConn:
		sc = t
	case *net.UnixConn:
		sc = t
	default:
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	rw := &Conn{Conn: c, rc: rc}
	rw.readFn = rw.read
	rw.writeFn = rw.write
	return rw
}

// Read implements net.Conn: one read(2) once the socket is readable.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.rbuf, c.rn, c.rerr = p, 0, 0
	err := c.rc.Read(c.readFn)
	n, errno := c.rn, c.rerr
	c.rbuf = nil
	if err != nil {
		return n, opName(err, "read")
	}
	if errno != 0 {
		return n, &net.OpError{Op: "read", Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: errno}
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// read is the RawConn.Read callback: false asks the poller to wait for
// readability.
func (c *Conn) read(fd uintptr) bool {
	for {
		n, errno := Read(int(fd), c.rbuf)
		switch errno {
		case 0:
			c.rn = n
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		c.rerr = errno
		return true
	}
}

// Write implements net.Conn: all of p, waiting for writability whenever
// the socket's buffer is full.
func (c *Conn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.wbuf, c.wn, c.werr = p, 0, 0
	err := c.rc.Write(c.writeFn)
	n, errno := c.wn, c.werr
	c.wbuf = nil
	if err != nil {
		return n, opName(err, "write")
	}
	if errno != 0 {
		return n, &net.OpError{Op: "write", Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: errno}
	}
	return n, nil
}

// write is the RawConn.Write callback.
func (c *Conn) write(fd uintptr) bool {
	for c.wn < len(c.wbuf) {
		n, errno := Write(int(fd), c.wbuf[c.wn:])
		switch errno {
		case 0:
			c.wn += n
			continue
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		c.werr = errno
		return true
	}
	return true
}

// opName names the RawConn's error (a closed connection, an expired
// deadline) as the plain read or write that it is for the caller: logs
// say "read tcp …: i/o timeout", as with any net.Conn.
func opName(err error, op string) error {
	if oe, ok := err.(*net.OpError); ok {
		oe.Op = op
	}
	return err
}

// SyscallConn implements syscall.Conn with the wrapped socket's.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.rc, nil }
