//go:build !race

package rawio

import (
	"syscall"
	"unsafe"
)

// Read is read(2) as a raw system call, for non-blocking descriptors only.
func Read(fd int, p []byte) (int, syscall.Errno) { return rawCall(syscall.SYS_READ, fd, p) }

// Write is write(2) as a raw system call, for non-blocking descriptors
// only.
func Write(fd int, p []byte) (int, syscall.Errno) { return rawCall(syscall.SYS_WRITE, fd, p) }

func rawCall(trap uintptr, fd int, p []byte) (int, syscall.Errno) {
	if len(p) == 0 {
		return 0, 0
	}
	r, _, e := syscall.RawSyscall(trap, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(r), 0
}
