//go:build !linux

package yield

// OSYields reports whether OS does anything on this system.
const OSYields = false

// OS does nothing: sched_yield is used on Linux only.
func OS(owner any) {}
