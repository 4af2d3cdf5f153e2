//go:build linux

package http1

import (
	"golang.org/x/sys/unix"
)

// tlsPeerClosed is peekClosed for a TLS client connection, on its TCP
// socket. A TLS client closes with a close_notify alert before its FIN,
// so the peek sees a record, not the end of the stream; poll's POLLRDHUP
// reports the FIN behind it. Without a FIN, any TLS record waiting (a
// pipelined request, an alert) reads as "still there", as with plain
// HTTP. A TLS client cannot half-close and go on reading, so a FIN means
// gone here.
func tlsPeerClosed(c *eofConn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var (
		revents int16
		perr    error
	)
	err = raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		_, perr = unix.Poll(fds, 0)
		revents = fds[0].Revents
	})
	switch {
	case err != nil:
		return true // closed on our side
	case perr != nil:
		return false
	}
	return revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
}
