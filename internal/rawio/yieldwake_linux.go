package rawio

import "syscall"

const canYield = true

// osYield gives the CPU to another runnable thread, if there is one
// (sched_yield(2)). It is a raw call, like the reads: it does not block.
func osYield() { syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }
