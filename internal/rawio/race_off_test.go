//go:build !race

package rawio_test

const raceEnabled = false
