//go:build !linux

package rawio

// Only Linux yields (YieldOnWake does nothing elsewhere).
const canYield = false

func osYield() {}
