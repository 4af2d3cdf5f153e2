//go:build linux

package dataplane

import (
	"errors"
	"net"
	"syscall"
)

// peekClosed peeks one byte without consuming it: 0 bytes means the
// peer sent FIN; ECONNRESET means it reset. EAGAIN (nothing to read) and
// data both mean the peer is still there.
func peekClosed(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var (
		buf    [1]byte
		n      int
		rerr   error
		closed bool
	)
	err = raw.Read(func(fd uintptr) bool {
		n, _, rerr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true
	})
	switch {
	case err != nil:
		closed = true // the connection is already closed on our side
	case rerr == nil:
		closed = n == 0
	case errors.Is(rerr, syscall.EAGAIN), errors.Is(rerr, syscall.EINTR):
		closed = false
	default:
		closed = true
	}
	return closed
}
