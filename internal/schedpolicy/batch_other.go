//go:build !linux

package schedpolicy

import "errors"

// SetBatch fails: SCHED_BATCH exists on Linux only.
func SetBatch() error {
	return errors.New("sched batch: SCHED_BATCH exists on Linux only")
}

// OneCPU reports false: CPU affinity is read on Linux only.
func OneCPU() bool { return false }
