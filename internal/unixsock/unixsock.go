// Package unixsock listens on Unix socket paths safely: a stale socket file
// left by a dead process is replaced, while a live one (something accepts
// on it) or a file that is not a socket is an error and never deleted.
package unixsock

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"
)

// Errors of Listen.
var (
	// ErrInUse: another process is listening on the socket path.
	ErrInUse = errors.New("socket path in use by a live listener")
	// ErrNotSocket: the path exists and is not a socket; it is never removed.
	ErrNotSocket = errors.New("path exists and is not a socket")
)

// probeTimeout bounds the dial that tells a live socket from a stale one.
const probeTimeout = 200 * time.Millisecond

// Listen listens on path and sets the socket file's mode (0: leave the
// umask's).
func Listen(path string, mode os.FileMode) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%w: %s", ErrNotSocket, path)
		}
		c, err := net.DialTimeout("unix", path, probeTimeout)
		if err == nil {
			_ = c.Close()
			return nil, fmt.Errorf("%w: %s", ErrInUse, path)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("probing existing socket %s: %w", path, err)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("removing stale socket %s: %w", path, err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if mode != 0 {
		if err := os.Chmod(path, mode); err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("chmod %s: %w", path, err)
		}
	}
	return ln, nil
}
