//go:build linux

package dataplane

import "syscall"

// raiseFDLimit raises the soft RLIMIT_NOFILE to the hard limit (the Go
// runtime does this at start too; doing it here makes it explicit and
// survives a caller that lowered it) and returns the soft limit.
func raiseFDLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	if rl.Cur < rl.Max {
		want := rl
		want.Cur = want.Max
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want) == nil {
			rl = want
		}
	}
	return rl.Cur
}
