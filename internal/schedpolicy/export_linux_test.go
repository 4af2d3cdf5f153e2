package schedpolicy

// OneCPUOf reports whether thread tid (0: the calling thread) may run on
// one CPU only.
func OneCPUOf(tid int) bool { return oneCPUOf(tid) }
