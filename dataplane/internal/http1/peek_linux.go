//go:build linux

package http1

import (
	"errors"
	"net"
	"syscall"
	"unsafe"
)

// peekClosed peeks one byte without consuming it: 0 bytes means the
// peer sent FIN; ECONNRESET means it reset. EAGAIN (nothing to read) and
// data both mean the peer is still there.
//
// The peek runs through RawConn.Control, not RawConn.Read: Read first
// checks the connection's read deadline, and the header-read deadline
// the listener set for this request has usually passed by the time a
// slow upstream or a long download is still running. Through Read, an
// expired deadline looked exactly like a vanished client and cut those
// requests off at read_timeout. MSG_DONTWAIT keeps the peek from ever
// blocking, so nothing here needs the poller.
func peekClosed(c net.Conn) bool {
	if ec, ok := c.(*eofConn); ok && ec.tls != nil {
		return tlsPeerClosed(ec)
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var (
		buf  [1]byte
		n    int
		rerr error
	)
	err = raw.Control(func(fd uintptr) {
		// A raw call: MSG_DONTWAIT never blocks, and outside the
		// runtime's system-call state the P stays put (see rawio).
		r, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&buf[0])), 1,
			syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		n = int(r)
		if e != 0 {
			rerr = e
		}
	})
	switch {
	case err != nil:
		return true // the connection is already closed on our side
	case rerr == nil:
		return n == 0
	case errors.Is(rerr, syscall.EAGAIN), errors.Is(rerr, syscall.EINTR):
		return false
	}
	return true
}
