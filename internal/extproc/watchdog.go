package extproc

import (
	"sync"
	"time"
)

// watchdog bounds the calls of a link's streams that may block on the
// network (opening a stream, a send, a finished request's grace for the
// processor to end its stream): a stream overrunning its deadline is
// canceled. One timer serves the whole link, armed for the earliest
// deadline and only moved when an earlier one is watched, so that a call
// that ends in time costs two short critical sections and no timer
// operation (a timer armed and stopped around every send, and one more
// per request for the grace, cost more than the rest of the client's own
// work per message). Deadlines are message timeouts and the grace, a
// second by default: the timer fires about once a second on a busy link,
// finds most entries gone, and walks those left (the sends and graces in
// progress, at most the in-flight limit and the streams in their grace).
type watchdog struct {
	mu      sync.Mutex
	first   *reqStream // the watched streams, linked through wnext/wprev
	timer   *time.Timer
	armedAt time.Time // when timer fires; zero: not armed
	stopped bool
}

// watch cancels st's stream (st.cancel, set before) at dl unless unwatch
// comes first. A stream is watched for one thing at a time.
func (w *watchdog) watch(st *reqStream, dl time.Time) {
	w.mu.Lock()
	st.wdl = dl
	if !st.watched {
		st.watched = true
		st.wprev, st.wnext = nil, w.first
		if w.first != nil {
			w.first.wprev = st
		}
		w.first = st
	}
	if w.armedAt.IsZero() || dl.Before(w.armedAt) {
		w.arm(dl)
	}
	w.mu.Unlock()
}

// unwatch takes st off the list; after it returns the watchdog does not
// touch st again (until watched again).
func (w *watchdog) unwatch(st *reqStream) {
	w.mu.Lock()
	if st.watched {
		w.unlink(st)
	}
	w.mu.Unlock()
}

// unlink takes st off the list; called with w.mu held.
func (w *watchdog) unlink(st *reqStream) {
	if st.wprev != nil {
		st.wprev.wnext = st.wnext
	} else {
		w.first = st.wnext
	}
	if st.wnext != nil {
		st.wnext.wprev = st.wprev
	}
	st.wprev, st.wnext, st.watched = nil, nil, false
}

// arm sets the timer to fire at dl; called with w.mu held. The timer is
// set from the clock read here, so that armedAt is when it fires.
func (w *watchdog) arm(dl time.Time) {
	if w.stopped {
		return
	}
	w.armedAt = dl
	if w.timer == nil {
		w.timer = time.AfterFunc(time.Until(dl), w.fire)
		return
	}
	w.timer.Reset(time.Until(dl))
}

// fire cancels the streams whose deadline has passed and re-arms the
// timer for the earliest one left. The cancels run under w.mu: a stream
// unwatched is never touched afterwards (it may be reused), and a
// context's cancel neither blocks nor calls back into the link.
func (w *watchdog) fire() {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armedAt = time.Time{}
	var next time.Time
	for st := w.first; st != nil; {
		nx := st.wnext
		if !now.Before(st.wdl) {
			w.unlink(st)
			st.timedOut.Store(true)
			st.cancel()
		} else if next.IsZero() || st.wdl.Before(next) {
			next = st.wdl
		}
		st = nx
	}
	if !next.IsZero() {
		w.arm(next)
	}
}

// stop ends the timer (the link is closed; its streams are aborted).
func (w *watchdog) stop() {
	w.mu.Lock()
	w.stopped = true
	if w.timer != nil {
		w.timer.Stop()
	}
	w.armedAt = time.Time{}
	w.mu.Unlock()
}
