//go:build !race

package agentcheck

// raceEnabled: the race detector slows CPU-heavy agents tenfold or more.
const raceEnabled = false
