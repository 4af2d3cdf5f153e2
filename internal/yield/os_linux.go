package yield

import "syscall"

// OSYields reports whether OS does anything on this system.
const OSYields = true

// OS gives the calling thread's CPU to another runnable thread, if there
// is one (sched_yield(2)), on behalf of owner; a hook set by SetHook may
// stand in, as for Gosched. It is a raw call: it never blocks.
func OS(owner any) {
	if f := hook.Load(); f == nil || !(*f)(owner) {
		syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
	}
}
