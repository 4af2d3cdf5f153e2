// Package clock is the dataplane's monotonic clock. The request path
// measures agent waits and sets deadlines several times per request;
// time.Now reads the wall clock and the monotonic clock (two vDSO calls,
// ~2% of a proxied request with one agent), while intervals need only
// the monotonic one, which time.Since reads alone. Mono is that reading,
// as an offset from a process-wide epoch; At converts it back to a
// time.Time (with its monotonic reading) for deadlines.
package clock

import "time"

var epoch = time.Now()

// Mono is the monotonic time since the process's epoch.
func Mono() time.Duration { return time.Since(epoch) }

// At is the time.Time of a Mono reading.
func At(m time.Duration) time.Time { return epoch.Add(m) }
