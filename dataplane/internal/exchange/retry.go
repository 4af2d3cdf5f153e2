package exchange

import (
	"errors"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/zentinelproxy/sidecar/dataplane/internal/clock"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/observe"
)

// Route retries. The upstream already replays a request on a stale
// pooled connection and tries another endpoint when a connection cannot
// be made (upstream.RoundTrip); a route's retry policy adds retries on
// the conditions it lists, after a backoff with full jitter, for requests
// that can be sent again:
//
//   - connect-failure, refused: nothing reached the upstream; any request
//     whose body nothing consumed yet.
//   - 502, 503, 504: the upstream answered; only a request without a body
//     (a streamed body was consumed by the first try and is not kept).
//   - reset, timeout: the upstream may have acted on the request; only an
//     idempotent one without a consumed body.
//
// A retry budget per route keeps retries from multiplying the load on a
// failing upstream: the retries in progress on the route (backoff
// included) may not exceed percent of its requests in progress, or
// min_retries, whichever is more. A retry the budget refuses is not made
// and counted (retry_budget_exhausted).
//
// Each policy counts its retries by the retry_on kind that triggered
// them, the retries its budget refused, and those not made because the
// request could not be sent again (a consumed body, or a request that is
// not idempotent after a reset or timeout); the counters live as long as
// the policy (a reload that changes it starts them again from 0).

// Retry conditions, as bits.
const (
	retryConnect uint16 = 1 << iota
	retryRefused
	retryReset
	retry502
	retry503
	retry504
	retryTimeout
	nRetryReasons = iota
)

// retryReasons are the retry_on kinds of the condition bits, in bit
// order: a fixed set, the label values of the per-route counters.
var retryReasons = [nRetryReasons]string{config.RetryConnectFailure, config.RetryRefused, config.RetryReset,
	config.Retry502, config.Retry503, config.Retry504, config.RetryTimeout}

// reasonOf is the index in retryReasons of the kind that made cond (the
// conditions met that the policy lists) a retry: the most specific one,
// refused over connect-failure when the policy lists both.
func reasonOf(cond uint16) int { return bits.Len16(cond) - 1 }

type retryPolicy struct {
	cfg              config.Retry
	on               uint16
	num              int
	perTry           time.Duration
	base, maxBackoff time.Duration
	percent          float64
	minRetries       int64
	active, retrying atomic.Int64

	retries       [nRetryReasons]atomic.Uint64 // by reasonOf
	budgetRefused atomic.Uint64
	notReplayable atomic.Uint64
}

// stats is the policy's counters: retries by the retry_on kinds it
// lists (each, made or not, so the set of series is fixed).
func (p *retryPolicy) stats() observe.RouteRetryStats {
	st := observe.RouteRetryStats{Retries: make(map[string]uint64, nRetryReasons),
		BudgetExhausted: p.budgetRefused.Load(), NotReplayable: p.notReplayable.Load()}
	for i, r := range retryReasons {
		if p.on&(1<<i) != 0 {
			st.Retries[r] = p.retries[i].Load()
		}
	}
	return st
}

func newRetryPolicy(c *config.Retry) *retryPolicy {
	p := &retryPolicy{cfg: *c, num: c.NumRetries, perTry: c.PerTryTimeout, base: c.BackoffBase, maxBackoff: c.BackoffMax,
		percent: c.Budget.Percent, minRetries: int64(c.Budget.MinRetries)}
	for i, r := range retryReasons {
		if slices.Contains(c.RetryOn, r) {
			p.on |= 1 << i
		}
	}
	return p
}

// connectFailure is an error of an upstream that could not connect
// (dial refused, timed out or unreachable): nothing was sent.
type connectFailure interface{ ConnectFailure() bool }

// condition is the retry condition a try's outcome meets (0: none), and
// whether it needs an idempotent request.
func condition(res UpstreamResponse, err error) (c uint16, idem bool) {
	if err == nil {
		switch res.Head().Status {
		case 502:
			return retry502, false
		case 503:
			return retry503, false
		case 504:
			return retry504, false
		}
		return 0, false
	}
	if errors.Is(err, ErrUpstreamBusy) {
		return 0, false
	}
	var cf connectFailure
	if errors.As(err, &cf) && cf.ConnectFailure() {
		c = retryConnect
		if errors.Is(err, syscall.ECONNREFUSED) {
			c |= retryRefused
		}
		return c, false
	}
	switch {
	case IsTimeout(err):
		return retryTimeout, true
	case staleConn(err):
		return retryReset, true
	}
	return 0, false
}

// budget reports whether one more retry fits the route's budget, and
// takes it (retryDone gives it back).
func (p *retryPolicy) budget() bool {
	allowed := int64(p.percent * float64(p.active.Load()) / 100)
	if allowed < p.minRetries {
		allowed = p.minRetries
	}
	if p.retrying.Add(1) > allowed {
		p.retrying.Add(-1)
		return false
	}
	return true
}

func (p *retryPolicy) retryDone() { p.retrying.Add(-1) }

// backoff is the wait before retry n (1-based): full jitter over
// base·2^(n-1), capped at maxBackoff.
func (p *retryPolicy) backoff(n int) time.Duration {
	d := p.base << (n - 1)
	if d > p.maxBackoff || d <= 0 {
		d = p.maxBackoff
	}
	return time.Duration(rand.Int64N(int64(d) + 1))
}

// tryTimeout is the response timeout of the next try (0: the upstream's
// response_timeout): per_try_timeout, else the route's upstream_timeout,
// capped by what is left of the route's timeout (deadline, a mono
// reading; 0: none). expired reports the deadline passed.
func (ex *Exchange) tryTimeout(deadline time.Duration) (t time.Duration, expired bool) {
	x := &ex.rt.ext
	t = x.upTimeout
	if x.retry != nil && x.retry.perTry > 0 {
		t = x.retry.perTry
	}
	if deadline > 0 {
		left := deadline - clock.Mono()
		if left <= 0 {
			return 0, true
		}
		if t == 0 || left < t {
			t = left
		}
	}
	return t, false
}

// retryWait waits d before a retry, unless the client goes away
// (false).
func (ex *Exchange) retryWait(d time.Duration) bool {
	if d <= 0 {
		return !ex.canceled()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return !ex.canceled()
	case <-ex.cancelCh:
		return false
	}
}

// errRouteTimeout is the route's timeout spent before a try.
var errRouteTimeout = &timeoutError{}

type timeoutError struct{}

func (*timeoutError) Error() string { return "route timeout" }
func (*timeoutError) Timeout() bool { return true }
