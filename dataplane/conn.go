package dataplane

import (
	"errors"
	"io"
	"net"
	"syscall"
)

// eofConn records that a read on the connection reached the end of the
// stream. fasthttp's streamed bodies report a peer that vanished mid-body
// as a plain io.EOF; a body that needed bytes past the connection's end is
// truncated, while a complete body never reads that far.
type eofConn struct {
	net.Conn
	eof bool
}

var errNoSyscallConn = errors.New("dataplane: connection has no socket")

func (c *eofConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err == io.EOF {
		c.eof = true
	}
	return n, err
}

// SyscallConn exposes the socket for the disconnect check.
func (c *eofConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errNoSyscallConn
}

// eofListener wraps accepted connections in eofConn (one allocation per
// connection, none per request).
type eofListener struct{ net.Listener }

func (l eofListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &eofConn{Conn: c}, nil
}
