//go:build !unix

package gomaxprocs

import (
	"errors"
	"time"
)

// cpuTime fails: the process's CPU time is read with getrusage.
func cpuTime() (time.Duration, error) {
	return 0, errors.New("the process's CPU time is read on Unix systems only")
}
