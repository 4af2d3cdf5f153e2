//go:build linux

package schedpolicy

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// SetBatch puts every thread of the process under SCHED_BATCH: a wake-up
// of the process no longer preempts the task running on its CPU (see
// docs/operations.md, "Sharing a core with an agent"). Threads
// created later inherit the policy from the thread that creates them, and
// all of those are switched here; the task list is walked until a pass
// finds no thread left to switch, which covers one created meanwhile.
// Choosing SCHED_BATCH needs no privilege.
func SetBatch() error {
	done := map[int]bool{}
	for {
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("sched batch: %w", err)
		}
		switched := 0
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil || done[tid] {
				continue
			}
			// Keep the thread's nice value: sched_setattr sets the one it
			// is given, and an unprivileged process may not lower it.
			attr, err := unix.SchedGetAttr(tid, 0)
			if err != nil {
				if err == unix.ESRCH {
					continue // the thread ended meanwhile
				}
				return fmt.Errorf("sched batch: thread %d: %w", tid, err)
			}
			attr.Policy = unix.SCHED_BATCH
			attr.Flags = 0
			if err := unix.SchedSetAttr(tid, attr, 0); err != nil {
				if err == unix.ESRCH {
					continue // the thread ended meanwhile
				}
				return fmt.Errorf("sched batch: thread %d: %w", tid, err)
			}
			done[tid] = true
			switched++
		}
		if switched == 0 {
			return nil
		}
	}
}

// OneCPU reports whether the process may run on one CPU only: the
// affinity of its main thread, which the threads of a process started
// pinned (taskset, a one-CPU cpuset) share. Such a process shares that
// CPU with whatever else is placed there and cannot be moved off it.
func OneCPU() bool { return oneCPUOf(os.Getpid()) }

// oneCPUOf reports whether thread tid (0: the calling thread) may run on
// one CPU only.
func oneCPUOf(tid int) bool {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(tid, &set); err != nil {
		return false
	}
	return set.Count() == 1
}
