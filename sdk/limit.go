package sdk

import (
	"sync"
	"sync/atomic"
)

// Limiter bounds how many handler calls run at once over every connection
// that shares it, whatever their transport (Options.Limiter,
// ReverseConfig.Limiter, grpcsdk.Options.Limiter). An event that finds
// every slot taken waits, in the order events arrived, for the next slot
// to free up; the reading goroutine never waits. When its turn comes, an
// event whose request was canceled meanwhile (a CancelRequest takes it out
// of the queue at once) or whose deadline (the proxy's timeout_ms) has
// passed is dropped without an answer instead of being handled, and
// counted (ReadStats).
//
// Without a Limiter every event gets a goroutine at once and handlers run
// side by side: right for handlers that wait (on a cache, another
// service), wrong for handlers that spend CPU. A CPU-bound handler run
// many at a time on few CPUs makes every request slow at once; under an
// overload all of them miss the proxy's deadline, and their CPU is spent
// for nothing while new requests wait. With slots for about as many
// handlers as the agent has CPUs, the ones that run finish in time, and
// those the proxy gave up on while they waited cost nothing.
type Limiter struct {
	mu         sync.Mutex
	free       int
	head, tail *reqState // runs waiting for a slot, oldest first
	waiting    int
}

// NewLimiter returns a Limiter of n slots (at least 1).
func NewLimiter(n int) *Limiter {
	return &Limiter{free: max(n, 1)}
}

// Waiting is the number of events waiting for a slot now.
func (l *Limiter) Waiting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiting
}

// acquireOrQueue takes a slot for st's run and reports true, or queues
// the run (request id, first event ev) for the next slot freed. Called
// with st.d.mu held.
func (l *Limiter) acquireOrQueue(st *reqState, id uint64, ev *Event) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.free > 0 {
		l.free--
		return true
	}
	st.id, st.first, st.queued = id, ev, true
	st.qprev = l.tail
	if l.tail == nil {
		l.head = st
	} else {
		l.tail.qnext = st
	}
	l.tail = st
	l.waiting++
	return false
}

// unqueue takes st's run out of the queue; false when it is not queued
// (it got its slot, or never waited). Called with st.d.mu held.
func (l *Limiter) unqueue(st *reqState) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !st.queued {
		return false
	}
	l.remove(st)
	return true
}

func (l *Limiter) remove(st *reqState) {
	if st.qprev == nil {
		l.head = st.qnext
	} else {
		st.qprev.qnext = st.qnext
	}
	if st.qnext == nil {
		l.tail = st.qprev
	} else {
		st.qnext.qprev = st.qprev
	}
	st.qprev, st.qnext, st.queued = nil, nil, false
	l.waiting--
}

// release gives a slot back: to the oldest waiting run, which a worker
// then starts (it checks whether its event is still wanted), or to the
// free ones.
func (l *Limiter) release() {
	l.mu.Lock()
	st := l.head
	if st == nil {
		l.free++
		l.mu.Unlock()
		return
	}
	l.remove(st)
	ev := st.first
	st.first = nil
	l.mu.Unlock()
	st.d.workers.run(task{d: st.d, id: st.id, st: st, ev: ev})
}

// dropped counts, for the whole process, the events the SDK did not hand
// to a handler (see Stats).
var dropped struct{ canceled, expired atomic.Uint64 }

// Stats are the SDK's counters since the process started, over every
// connection and transport.
type Stats struct {
	// DroppedCanceled counts events not handed to a handler because
	// their request was canceled first (a CancelRequest or CancelAll, or
	// the connection ended) while they waited: for a Limiter slot, for
	// their goroutine to start, or behind another event of their request.
	DroppedCanceled uint64
	// DroppedExpired counts events not handed to a handler because their
	// deadline (the proxy's timeout_ms, from when the event was read)
	// passed while they waited.
	DroppedExpired uint64
}

// ReadStats returns the SDK's counters.
func ReadStats() Stats {
	return Stats{DroppedCanceled: dropped.canceled.Load(), DroppedExpired: dropped.expired.Load()}
}
