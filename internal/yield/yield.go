// Package yield decides whether to yield before an operation that a
// yield can make cheaper, from whether earlier yields paid.
//
// Two places in the proxy yield to let the goroutines already runnable go
// first (Gosched): a client connection's read after a response (the next
// request has usually arrived by then under load, so the read does not
// meet EAGAIN and park), and an agent connection's sender before it
// writes (the other senders' frames join the same write). Under load a
// yield is cheap and saves a system call. Below that load there is
// nothing to wait for, and with GOMAXPROCS > 1 and idle Ps the yield
// wakes another thread (the runtime's wakep): a cost that buys nothing.
// Measured at 2 000 requests/s through 16 connections, default
// GOMAXPROCS, one agent: yielding before every client read after a
// response took the proxy from 190 to 207 µs of CPU per request (mean of
// four starts each), and the sender's yield added 0.43 context switches
// per request.
//
// An SDK agent confined to one CPU yields that CPU itself (OS,
// sched_yield) after a wake-up, to the proxy it shares it with: see
// rawio.Conn.YieldOnWake.
package yield

import (
	"runtime"
	"sync/atomic"
)

// Policy keeps yielding while it pays: a yield that paid earns Credit
// more, one that did not spends one, and with no credit left only one
// call in ProbeEvery yields, to notice when the load comes back. Credit
// wins while more than about one yield in Credit+1 pays. The zero value
// starts by probing. A Policy is not safe for concurrent use.
type Policy struct {
	credit uint8
	skip   uint8 // calls left before the next probe (credit == 0)
}

// The policy's constants.
const (
	Credit     = 8
	CreditMax  = 32
	ProbeEvery = 16
)

// The counters are uint8: the constants must keep them in range (these
// fail to compile otherwise).
const (
	_ = uint8(CreditMax + Credit)
	_ = uint8(ProbeEvery - 1)
)

// Before reports whether this call yields; when it does, After must
// follow with the outcome.
func (p *Policy) Before() bool {
	if p.credit > 0 || p.skip == 0 {
		return true
	}
	p.skip--
	return false
}

// After records whether the yield Before allowed paid.
func (p *Policy) After(paid bool) {
	if paid {
		p.credit = min(p.credit+Credit, CreditMax)
		return
	}
	if p.credit > 0 {
		p.credit--
	}
	if p.credit == 0 {
		p.skip = ProbeEvery - 1
	}
}

// Gosched yields (runtime.Gosched) on behalf of owner, the connection or
// writer whose Policy allowed it. A hook set by SetHook may stand in.
func Gosched(owner any) {
	if f := hook.Load(); f == nil || !(*f)(owner) {
		runtime.Gosched()
	}
}

// hook, when set, is called by Gosched and OS first; atomic because other
// tests' connections may still yield meanwhile.
var hook atomic.Pointer[func(owner any) bool]

// SetHook makes Gosched and OS call f, which reports whether it stood in
// for the yield (a test counts its own owner's yields and lets the others
// through); nil removes it. For tests.
func SetHook(f func(owner any) bool) {
	if f == nil {
		hook.Store(nil)
		return
	}
	hook.Store(&f)
}
