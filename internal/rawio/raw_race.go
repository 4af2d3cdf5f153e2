//go:build race

package rawio

import "syscall"

// Under the race detector, Read and Write go through package syscall,
// which tells the detector that a write to a socket happens before the
// read of its bytes. Raw calls would hide that order, and two goroutines
// of one process that talk over a socket (a test's agent and proxy)
// would be reported as racing.

// Read is read(2); see the !race build.
func Read(fd int, p []byte) (int, syscall.Errno) { return call(syscall.Read, fd, p) }

// Write is write(2); see the !race build.
func Write(fd int, p []byte) (int, syscall.Errno) { return call(syscall.Write, fd, p) }

func call(f func(int, []byte) (int, error), fd int, p []byte) (int, syscall.Errno) {
	if len(p) == 0 {
		return 0, 0
	}
	n, err := f(fd, p)
	if err != nil {
		return 0, err.(syscall.Errno)
	}
	return n, 0
}
