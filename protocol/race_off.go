//go:build !race

package protocol

// raceEnabled is true under the race detector, which adds allocations of its
// own: allocation gates skip then.
const raceEnabled = false
