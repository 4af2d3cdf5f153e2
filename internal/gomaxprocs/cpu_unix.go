//go:build unix

package gomaxprocs

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time the process has used, user and system, all
// threads. getrusage's times are exact on Linux (not rounded to ticks as
// /proc/self/stat's are), which a 100ms interval needs.
func cpuTime() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
