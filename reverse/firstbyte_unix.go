//go:build unix

package reverse

import (
	"net"
	"syscall"
)

// awaitData waits, through the runtime's poller and within nc's read
// deadline, until nc has data to read (or its end, or an error, which the
// reads that follow report). silent is called once, before waiting, if
// nothing has arrived yet. The data is peeked, not read: the TLS handshake
// or the frame reader reads it. It fails only when the wait failed
// (the deadline passed, the connection was closed): the error of the
// wait; nil otherwise, and at once on a connection that cannot be peeked.
// It costs one system call more per connection, none per frame.
func awaitData(nc net.Conn, silent func()) error {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	waited := false
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK)
		for err == syscall.EINTR {
			_, _, err = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK)
		}
		if err == syscall.EAGAIN {
			if !waited {
				waited = true
				silent()
			}
			return false
		}
		return true
	})
	return err
}
