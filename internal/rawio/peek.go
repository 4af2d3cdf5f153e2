package rawio

import (
	"io"
	"syscall"
	"unsafe"
)

// Pending looks at an idle connection without reading from it: one
// recvfrom(2) of one byte with MSG_PEEK|MSG_DONTWAIT, which never blocks
// and consumes nothing. It reports whether bytes are waiting (data); err
// is io.EOF when the peer closed (FIN), the socket's error when it reset
// or failed, and nil with data false when nothing came (EAGAIN).
//
// A client of a request-response peer calls it before it writes the next
// request on a connection that sat idle: data there answers no request of
// its (an HTTP server's stray bytes), and a FIN means the request would
// be written into a closed connection. It must not run while a Read is
// under way on c.
func (c *Conn) Pending() (data bool, err error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	c.peekN, c.perr = 0, 0
	if cerr := c.rc.Control(c.peekFn); cerr != nil {
		return false, cerr // closed on our side
	}
	switch c.perr {
	case 0:
		if c.peekN == 0 {
			return false, io.EOF
		}
		return true, nil
	case syscall.EAGAIN:
		return false, nil
	}
	return false, c.opError("read", c.perr)
}

// peek is the RawConn.Control callback of Pending. The byte peeked is not
// used, so the race detector need not see this call (see raw_race.go).
func (c *Conn) peek(fd uintptr) {
	for {
		r, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&c.pbuf[0])), 1,
			syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		if e == syscall.EINTR {
			continue
		}
		c.peekN, c.perr = int(r), e
		return
	}
}
