package sdk

import (
	"sync"
	"sync/atomic"
	"time"
)

// workerPool runs request handlers on reused goroutines. A handler never
// waits for a free worker: when none is idle a new one starts, so a slow
// request cannot delay a fast one. Idle workers exit after 10 to 15 s
// (idleTimeout to 1.5 times it): a sweeper ticks every idleTimeout/2 while
// workers exist, so that an idle worker waits on a plain channel receive,
// with no timer to reset on every task.
type workerPool struct {
	mu       sync.Mutex
	idle     []*worker // a stack: the most recently idle on top
	workers  int       // alive
	epoch    uint64    // ticks of the sweeper
	sweeping bool
}

type worker struct {
	task  chan task
	epoch uint64 // the pool's epoch when it last became idle
}

// task is passed by value so that starting a handler allocates nothing.
// The zero task tells a worker to exit.
type task struct {
	d  *Dispatcher
	id uint64
	st *reqState
	ev *Event
}

const idleTimeout = 10 * time.Second

var sharedWorkers = &workerPool{}

func (p *workerPool) run(tk task) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		w := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		w.task <- tk
		return
	}
	p.workers++
	sweep := !p.sweeping
	p.sweeping = true
	p.mu.Unlock()
	if sweep {
		go p.sweep()
	}
	w := &worker{task: make(chan task, 1)}
	go p.loop(w, tk)
}

func (p *workerPool) loop(w *worker, tk task) {
	for tk.d != nil {
		tk.d.run(tk.id, tk.st, tk.ev, false, false)
		p.mu.Lock()
		w.epoch = p.epoch
		p.idle = append(p.idle, w)
		p.mu.Unlock()
		tk = <-w.task
	}
}

// sweep retires the workers idle for idleTimeout or more, from the bottom
// of the stack, until no worker is left.
func (p *workerPool) sweep() {
	t := time.NewTicker(idleTimeout / 2)
	defer t.Stop()
	for range t.C {
		p.mu.Lock()
		p.epoch++
		k := 0
		for k < len(p.idle) && p.epoch-p.idle[k].epoch >= 3 {
			p.idle[k].task <- task{} // an idle worker's channel is empty: never blocks
			k++
		}
		if k > 0 {
			n := copy(p.idle, p.idle[k:])
			clear(p.idle[n:])
			p.idle = p.idle[:n]
			p.workers -= k
		}
		if p.workers == 0 {
			p.sweeping = false
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
	}
}

// Serve runs a transport's read loop over d: next reads the next frame of
// the connection and either returns the Event it decoded (Serve then
// dispatches it) or handles the frame itself (a Ping, a CancelRequest
// through d.Cancel, …) and returns nil. Serve calls next until it returns
// an error, and returns that error. next is never called concurrently,
// but not always from the same goroutine (see below). buffered, when not
// nil, reports how many bytes the transport has already read and next has
// not yet consumed (nil: the transport cannot tell).
//
// An event that finds no other request of the connection in progress is
// handled by the goroutine that read it, without the hand-off to a worker
// (a goroutine and often a thread wake-up: most of the cost of a lone
// request on the agent side). So is one that finds other requests in
// progress, if buffered is known and the handlers run that way lately
// took less than quickRun on average. While buffered says more events are
// at hand, the reading goroutine runs their handlers one after another
// for about burstBudget, and queues their replies (see queuer) so that
// they leave together, as workers' replies do: handing each event of a
// busy connection to a worker cost a goroutine wake-up and park per
// event (measured with 64 requests in flight on one connection, proxy
// and agent in one process on 2 CPUs, medians of six alternating rounds:
// 343k decisions/s and 3.56 µs of CPU per decision before, 444k and 2.58
// µs with bursts; docs/performance.md). Everything else goes to
// workers, so requests run concurrently. Reading waits while the reading
// goroutine runs handlers, but never for long: when one handler, or a burst of them, has run for
// about HandOffAfter, another goroutine takes over reading (and the next
// events go to workers for a while), so the connection's next events are
// held back by at most the shorter of that run time and that bound. As
// with Dispatch, the events of one request reach the handler in order,
// each handler run with a context of its own.
//
// When the connection ends on a goroutine other than the caller's, the
// running handlers' contexts are canceled at once (d's base context ends),
// as if the caller had returned.
func (d *Dispatcher) Serve(next func() (*Event, error), buffered func() int) error {
	r := &reader{d: d, next: next, buffered: buffered, done: make(chan error, 1)}
	r.timer = time.AfterFunc(time.Hour, r.handOff)
	r.timer.Stop()
	defer r.timer.Stop()
	if err, ended := r.loop(); ended {
		return err
	}
	// Another goroutine took over reading while this one ran a handler.
	return <-r.done
}

// HandOffAfter is how long a handler run by the reading goroutine (see
// Dispatcher.Serve) may hold reads back before another goroutine takes
// over reading. The Go runtime's timers wake an idle process at a
// millisecond's resolution, so in practice the hand-off happens within
// about 1 to 2 ms (later only on a machine whose CPUs are all busy).
const HandOffAfter = time.Millisecond

// slowFor is how long the events of a connection go to workers after a
// hand-off: its handlers are slow, so running one in the reader would
// only hold reads back again.
const slowFor = 100 * time.Millisecond

// quickRun: while the handlers run by the reading goroutine take less than
// this on average, it also runs those of events that arrive while other
// requests are in progress, which saves a hand-off per event on a busy
// connection and delays the next read by about that much (or, for a
// burst, burstBudget) at most.
const quickRun = 20 * time.Microsecond

// burstBudget: while more events are buffered, the reading goroutine runs
// their handlers itself (quick ones, see quickRun), its replies queued to
// leave together, for about this long by their average run time; the rest
// go to workers. It bounds how long such a burst holds back the buffered
// events of other requests; the hand-off timer, armed once for the burst,
// bounds it for certain at HandOffAfter.
const burstBudget = 100 * time.Microsecond

// expiredMark in reader.handling: the burst's hand-off timer fired between
// two runs, so the next run must arm it again.
const expiredMark = ^uint64(0)

// reader is the state of one Serve loop.
type reader struct {
	d        *Dispatcher
	next     func() (*Event, error)
	buffered func() int // nil: unknown
	done     chan error // the end of the loop, when a takeover goroutine saw it

	// handling is the number of the handler run in progress in the reading
	// goroutine (0: none; expiredMark: none, and the burst's timer fired);
	// a hand-off takes it to 0 and starts a new reading goroutine, so the
	// handler's goroutine learns it no longer reads when its
	// compare-and-swap fails.
	handling  atomic.Uint64
	runs      uint64       // numbers the runs; touched by the reading goroutine only
	avg       int64        // run time (ns) of every 8th run, averaged; reading goroutine only
	timer     *time.Timer  // AfterFunc(handOff), armed during a run or a burst of runs
	armed     bool         // timer armed by the reading goroutine (handOff clears it when it takes over)
	more      bool         // more input was buffered when the current event was read
	burstN    int64        // handlers run since the timer was armed
	slowUntil atomic.Int64 // unix ns until which events go to workers; 0: none
}

// loop reads and dispatches until next fails (ended: err is why) or this
// goroutine handed reading over to another one.
func (r *reader) loop() (err error, ended bool) {
	for {
		ev, err := r.next()
		if err != nil {
			return err, true
		}
		if ev == nil {
			continue
		}
		r.more = r.buffered != nil && r.buffered() > 0
		if !r.d.dispatch(ev, r) {
			return nil, false
		}
		if !r.more && r.armed {
			// The burst is over: the next read may wait for the proxy.
			r.timer.Stop()
			r.armed = false
		}
	}
}

// mayHandle reports whether the reading goroutine may run a handler
// itself: when the connection is otherwise idle, or when recent runs were
// quick; while more events are buffered, only within burstBudget (see
// there); never for a while after a slow one.
func (r *reader) mayHandle(idle bool) bool {
	if !idle && (r.buffered == nil || r.avg >= int64(quickRun)) {
		return false
	}
	if r.armed && (r.handling.Load() == expiredMark || r.burstN*r.avg >= int64(burstBudget)) {
		return false
	}
	u := r.slowUntil.Load()
	if u == 0 {
		return true
	}
	if time.Now().UnixNano() < u {
		return false
	}
	r.slowUntil.Store(0)
	return true
}

// handle runs the handler for a new request in the reading goroutine,
// with the hand-off timer armed, and reports whether this goroutine still
// reads afterwards. The timer is armed once for a burst of such runs
// (events read from the buffer while it is not empty), so that it bounds
// the whole burst's hold on reading, not each run's.
func (r *reader) handle(id uint64, st *reqState, ev *Event) (reading bool) {
	r.runs++
	n := r.runs
	// Read before the run is claimed: once it is, a hand-off may let
	// another reader change it.
	queue := r.more
	var start time.Time
	// Timing every run would cost two clock reads per event (about 80 ns
	// each where measured, a VM).
	sample := n%8 == 1
	if sample {
		start = time.Now()
	}
	r.burstN++ // before the run is claimed, like every field a new reader reads
	// In a burst the run claims the word its timer marks on firing; if
	// the timer fired since mayHandle looked (expiredMark), nothing bounds
	// this run yet, so it is armed afresh. Once claimed, armed is no
	// longer read: a hand-off may write it.
	if !(r.armed && r.handling.CompareAndSwap(0, n)) {
		r.armed = true
		r.burstN = 1
		r.handling.Store(n) // before the timer runs, so that a firing finds the run
		r.timer.Reset(HandOffAfter)
	}
	r.d.run(id, st, ev, queue, true)
	if !r.handling.CompareAndSwap(n, 0) {
		return false // taken over: the timer is the new reader's now
	}
	if sample {
		r.avg += (int64(time.Since(start)) - r.avg) / 4
	}
	return true
}

// testHookTimerFired, when set by a test, is told that d's hand-off timer
// fired: between two runs of a burst (between), or during a run, which it
// then hands off.
var testHookTimerFired atomic.Pointer[func(d *Dispatcher, between bool)]

// handOff runs when a handler run by the reading goroutine takes long:
// another goroutine continues the read loop.
func (r *reader) handOff() {
	// A firing that comes late, for a run that has just ended, may hand
	// off the next run early: harmless, the new reader reads just as well.
	for {
		n := r.handling.Load()
		if n == expiredMark {
			return
		}
		if n == 0 {
			// Between two runs of a burst: mark the timer spent, in the
			// same word the next run claims, so that the reading goroutine
			// either sees the mark (and arms the timer again) or has
			// claimed the word first (and this firing takes it over).
			if r.handling.CompareAndSwap(0, expiredMark) {
				if hook := testHookTimerFired.Load(); hook != nil {
					(*hook)(r.d, true)
				}
				return
			}
			continue
		}
		if r.handling.CompareAndSwap(n, 0) {
			break
		}
	}
	if hook := testHookTimerFired.Load(); hook != nil {
		(*hook)(r.d, false)
	}
	r.slowUntil.Store(time.Now().Add(slowFor).UnixNano())
	r.armed = false // fired: the new reader arms it afresh
	go func() {
		err, ended := r.loop()
		if !ended {
			return // handed over again
		}
		// The caller of Serve may itself be a handler that is still
		// running: end the handlers' contexts now, as its return would.
		r.d.stop()
		r.done <- err
	}()
}
