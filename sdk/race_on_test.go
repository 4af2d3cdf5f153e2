//go:build race

package sdk

const raceEnabled = true
