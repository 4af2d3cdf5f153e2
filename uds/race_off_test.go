//go:build !race

package uds

const raceEnabled = false
