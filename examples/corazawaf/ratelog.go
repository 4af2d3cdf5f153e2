package corazawaf

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// rateLog writes the per-request lines at most rate a second (a burst of
// one second's worth), so that an attack cannot flood the log. Lines over
// the rate are counted; the next line written says how many were dropped.
type rateLog struct {
	zl   zerolog.Logger
	rate float64

	mu         sync.Mutex
	tokens     float64
	last       time.Time
	suppressed uint64 // since the last line written

	suppressedTotal atomic.Uint64
}

func newRateLog(log zerolog.Logger, perSecond int) *rateLog {
	return &rateLog{zl: log, rate: float64(perSecond), tokens: float64(perSecond)}
}

// allow takes a token; it returns false and counts the line when none is
// left, or the number of lines dropped since the last one written.
func (l *rateLog) allow(now time.Time) (ok bool, dropped uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() {
		l.tokens = min(l.rate, l.tokens+now.Sub(l.last).Seconds()*l.rate)
	}
	l.last = now
	if l.tokens < 1 {
		l.suppressed++
		l.suppressedTotal.Add(1)
		return false, 0
	}
	l.tokens--
	dropped, l.suppressed = l.suppressed, 0
	return true, dropped
}

func (l *rateLog) log(e *entry, action, side string, status int, reason string, mt matches) {
	if l.rate == 0 {
		return
	}
	ok, dropped := l.allow(time.Now())
	if !ok {
		return
	}
	ev := l.zl.Warn().Uint64("request_id", e.id).Str("transaction", e.tx.ID()).
		Str("action", action).Str("phase", side).Ints("rule_ids", mt.ids).Int("anomaly_score", mt.score)
	if status != 0 {
		ev = ev.Int("status", status)
	}
	if reason != "" {
		// An unanswered request: why, and what the rules had decided.
		ev = ev.Str("reason", reason).Bool("would_block", mt.interrupted)
	}
	if dropped > 0 {
		ev = ev.Uint64("lines_dropped", dropped)
	}
	ev.Msg("waf match")
}
