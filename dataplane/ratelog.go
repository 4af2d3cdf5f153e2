package dataplane

import (
	"sync"
	"time"
)

// rateLog limits one kind of repeated log line (an agent's failures of
// one kind, an upstream's errors): at most rateBurst lines per rateWindow;
// the first line after a window with dropped lines carries their count
// ("suppressed"). During an outage every request fails the same way, and
// one line per request buried everything else (48.5k lines in 5 s); the
// counters still count every event.
type rateLog struct {
	mu         sync.Mutex
	start      time.Time
	n          int
	suppressed uint64
}

const (
	rateWindow = 10 * time.Second
	rateBurst  = 10
)

// allow reports whether a line may be written now, and how many were
// suppressed since the last one written.
func (r *rateLog) allow() (bool, uint64) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if now.Sub(r.start) >= rateWindow {
		r.start, r.n = now, 0
	}
	if r.n >= rateBurst {
		r.suppressed++
		return false, 0
	}
	r.n++
	s := r.suppressed
	r.suppressed = 0
	return true, s
}
