//go:build race

package pbwire_test

const raceEnabled = true
