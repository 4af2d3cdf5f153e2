//go:build race

package agentmux

const raceEnabled = true
