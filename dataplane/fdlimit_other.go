//go:build !linux

package dataplane

// raiseFDLimit does not know the limit on this platform.
func raiseFDLimit() uint64 { return 0 }
