package exchange

import (
	"errors"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/zentinelproxy/sidecar/dataplane/internal/clock"
	"github.com/zentinelproxy/sidecar/protocol"
)

// upState is the request's call to its upstream: the request it sent
// (kept for its buffers) and the response in use.
type upState struct {
	upReq      UpstreamRequest
	res        UpstreamResponse // nil until the upstream answered
	reqSent    bool             // the upstream request went to the upstream: its headers are final
	upBodyDone bool             // the response body was read to its end
}

// forward sends the request upstream and reads the response head. It
// reports whether the request goes on; false means a response is staged
// or the client is gone. Where an attempt may be retried (a stale pooled
// connection, another endpoint) is the upstream's business.
func (ex *Exchange) forward() bool {
	ex.finishIdle(protocol.PhaseRequest)
	r := &ex.upReq
	r.Method, r.Target, r.Host, r.Fields = ex.head.Method, ex.fwdTarget(), ex.upHost, ex.hdr
	ex.upstreamBody(r)
	r.Trailer = nil
	if r.Body != nil {
		r.Trailer = ex.head.Trailer
	}
	r.Idempotent = ex.idempotent()
	r.Head = string(ex.head.Method) == "HEAD"
	r.Guard = (*guard)(ex)
	r.Duplex = r.Body != nil && ex.plan == planPass && len(ex.shadowConvs) == 0 && ex.lst.Duplex
	if ex.trace.sampled {
		ex.trace.upStart = int64(clock.Mono())
	}
	ex.reqSent = true
	x := &ex.rt.ext
	var deadline time.Duration
	if x.timeout > 0 {
		deadline = clock.Mono() + x.timeout
	}
	var res UpstreamResponse
	var err error
	for try := 0; ; try++ {
		t, expired := ex.tryTimeout(deadline)
		if expired {
			res, err = nil, errRouteTimeout
			break
		}
		r.ResponseTimeout = t
		res, err = ex.rt.up.RoundTrip(r)
		if try > 0 {
			x.retry.retryDone() // the budget covers a retry's backoff and try
		}
		if x.retry == nil || try >= x.retry.num || !ex.retryable(res, err, try+1, deadline) {
			break
		}
	}
	if err == nil {
		ex.res = res
		if ex.trace.sampled {
			ex.trace.upEnd = int64(clock.Mono())
			ex.trace.upAddr = res.Endpoint()
		}
		return true
	}
	var ce *clientError
	switch {
	case ex.answered || ex.respAbort:
		return false // an agent stopped the body
	case ex.canceled():
		ex.outcome = "client gone"
		return false
	case errors.As(err, &ce):
		ex.bodyReadFailed(protocol.PhaseRequest, ce.err)
		return false
	}
	return ex.upstreamFailed(err)
}

// Answered reports that the staged response is the sidecar's own (an
// agent's block or redirect, a fail-closed or upstream failure, a refused
// request), not the upstream's: a front end may have to put it in its
// client's terms (a gRPC status).
func (ex *Exchange) Answered() bool { return ex.answered || ex.rejected }

// releaseUpstream ends the upstream response: its connection goes back
// to the pool when the body was read to its end (and the upstream can
// still use it), and is closed otherwise.
func (ex *Exchange) releaseUpstream() {
	if ex.res == nil {
		return
	}
	ex.res.Release(ex.upBodyDone)
	ex.res = nil
}

// upstreamHost is the Host the upstream gets for a request whose (already
// normalised) Host is host.
func (rt *route) upstreamHost(host []byte) []byte {
	switch {
	case rt.hostMode == hostLiteral:
		return rt.hostLit
	case rt.hostMode == hostUpstream || len(host) == 0:
		return rt.up.HostHeader()
	}
	return host
}

// upstreamFailed answers 502, 503 or 504 for an upstream failure.
func (ex *Exchange) upstreamFailed(err error) bool {
	s := ex.core
	if ex.canceled() {
		ex.outcome = "client gone"
		return false
	}
	if ok, suppressed := ex.rt.up.LogAllow(); ok {
		e := ex.logFields(s.log.Error()).Str("upstream", ex.rt.up.Name()).Err(err)
		if suppressed > 0 {
			e = e.Uint64("suppressed", suppressed)
		}
		e.Msg("upstream failed")
	}
	ex.upFailed = true
	switch {
	case errors.Is(err, ErrUpstreamBusy):
		s.stats.upErrors.Add(1)
		s.obs.Upstream(ex.rt.idx, false)
		ex.local(503, "service unavailable", "upstream busy")
	case IsTimeout(err):
		s.stats.upTimeouts.Add(1)
		s.obs.Upstream(ex.rt.idx, true)
		ex.local(504, "gateway timeout", "upstream timeout")
	default:
		s.stats.upErrors.Add(1)
		s.obs.Upstream(ex.rt.idx, false)
		ex.local(502, "bad gateway", "upstream error")
	}
	return false
}

// IsTimeout reports an error of a deadline or timeout: one in its chain
// says so (Timeout, as a net.Error does), or os.ErrDeadlineExceeded.
func IsTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// staleConn reports the errors of a connection the peer closed or reset:
// the end of the stream where more was due, a reset, a broken pipe.
func staleConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// retryable decides whether a try that ended in res or err is retried as
// retry n (1-based) under the route's policy and budget; when it is, the
// try's response is released and the backoff waited.
func (ex *Exchange) retryable(res UpstreamResponse, err error, n int, deadline time.Duration) bool {
	p := ex.rt.ext.retry
	cond, idem := condition(res, err)
	cond &= p.on
	if cond == 0 || ex.answered || ex.respAbort || ex.canceled() {
		return false
	}
	r := &ex.upReq
	if r.Body != nil && r.Body.Consumed() || idem && !r.Idempotent {
		p.notReplayable.Add(1)
		return false // the request cannot be sent again
	}
	wait := p.backoff(n)
	if deadline > 0 && clock.Mono()+wait >= deadline {
		return false
	}
	if !p.budget() {
		ex.core.stats.retryBudget.Add(1)
		p.budgetRefused.Add(1)
		return false
	}
	// The budget taken is given back when the retry's try returns.
	if res != nil {
		res.Release(false)
	}
	ex.core.stats.retries.Add(1)
	p.retries[reasonOf(cond)].Add(1)
	// A client that goes away during the wait: the retry's try finds the
	// request canceled and ends at once.
	ex.retryWait(wait)
	return true
}
