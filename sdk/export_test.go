package sdk

// SetOneCPU makes ServeConn see one (f) in place of the process's CPU
// affinity, and returns the function that restores it.
func SetOneCPU(f func() bool) (restore func()) {
	old := oneCPU
	oneCPU = f
	return func() { oneCPU = old }
}
