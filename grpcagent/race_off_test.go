//go:build !race

package grpcagent

const raceEnabled = false
