//go:build !race

package agentmux

const raceEnabled = false
