package dataplane

import "time"

// The request path measures agent waits and sets deadlines several times
// per request. time.Now reads the wall clock and the monotonic clock (two
// vDSO calls, ~2% of a proxied request with one agent); intervals need
// only the monotonic one, which time.Since reads alone. mono is that
// reading, as an offset from a process-wide epoch; at converts it back to
// a time.Time (with its monotonic reading) for deadlines.

var epoch = time.Now()

// mono is the monotonic time since the process's epoch.
func mono() time.Duration { return time.Since(epoch) }

// at is the time.Time of a mono reading.
func at(m time.Duration) time.Time { return epoch.Add(m) }
