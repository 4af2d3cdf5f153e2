//go:build !linux

package http1

import "net"

// peekClosed cannot tell without a platform peek; a vanished client is
// then noticed when its connection is next read or written.
func peekClosed(net.Conn) bool { return false }
