//go:build !linux

package main

import "errors"

func setBatchScheduling() error {
	return errors.New("sched batch: SCHED_BATCH exists on Linux only")
}
