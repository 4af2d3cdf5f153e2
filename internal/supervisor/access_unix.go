//go:build unix

package supervisor

import "golang.org/x/sys/unix"

// Modes of access.
const (
	accessWrite  = unix.W_OK
	accessSearch = unix.X_OK
)

// access reports whether the process may use path in mode (access(2):
// the real user and group, which are the sidecar's own).
func access(path string, mode uint32) error { return unix.Access(path, mode) }
