// Package ratelog keeps repeated log lines from flooding: during an
// outage every request fails the same way, and one line per request
// buried everything else (48.5k lines in 5 s). Counters still count
// every event; the lines say how many of their kind were held back.
package ratelog

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// Limit lets through at most Burst lines of one kind (an agent's
// failures of one kind, an upstream's errors) per Window; the first line
// after a window with dropped lines carries their count ("suppressed").
// The zero value is ready.
type Limit struct {
	mu         sync.Mutex
	start      time.Time
	n          int
	suppressed uint64
}

// Limit's bounds.
const (
	Window = 10 * time.Second
	Burst  = 10
)

// Allow reports whether a line may be written now, and how many were
// suppressed since the last one written.
func (r *Limit) Allow() (bool, uint64) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if now.Sub(r.start) >= Window {
		r.start, r.n = now, 0
	}
	if r.n >= Burst {
		r.suppressed++
		return false, 0
	}
	r.n++
	s := r.suppressed
	r.suppressed = 0
	return true, s
}

// Every lets one line of a kind through per interval, without a lock;
// the next line let through carries the count of those held back
// ("suppressed"). The zero value is ready.
type Every struct {
	last       atomic.Int64 // unix nanoseconds of the last line
	suppressed atomic.Uint64
}

// Allow reports whether a line may be written now (at most one per
// every), and how many were held back since the last one.
func (r *Every) Allow(every time.Duration) (bool, uint64) {
	now := time.Now().UnixNano()
	last := r.last.Load()
	if (last != 0 && now-last < int64(every)) || !r.last.CompareAndSwap(last, now) {
		r.suppressed.Add(1)
		return false, 0
	}
	return true, r.suppressed.Swap(0)
}

// Suppressed adds the count of rate-limited lines dropped before this
// one, when there were any.
func Suppressed(n uint64) func(*zerolog.Event) {
	return func(e *zerolog.Event) {
		if n > 0 {
			e.Uint64("suppressed", n)
		}
	}
}
