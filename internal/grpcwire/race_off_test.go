//go:build !race

package grpcwire

const raceEnabled = false
