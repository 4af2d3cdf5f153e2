package exchange

import (
	"context"
	"io"
	"sync"
	"time"

	"github.com/zentinelproxy/sidecar/dataplane/internal/clock"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
)

// cancelState is what the client's going away touches: the cancel
// channel agent waits select on, and the upstream connection to abort.
// mu guards what the watcher's goroutine reads and writes.
type cancelState struct {
	mu        sync.Mutex
	cancelCh  chan struct{} // closed by cancel; replaced for the next request once closed
	cancelErr error
	upNet     io.Closer // what the upstream is doing for the request (aborted by cancel)
	upAborted bool

	// Watcher list (guarded by the shard lock).
	wprev, wnext *Exchange
	gone         bool
}

// Agent calls wait on plain values rather than a context (see
// agentmux.Wait): the deadline left in the agent's request budget, computed
// afresh for each call, and the request's cancel channel, closed when the
// client goes away. Streamed chunks get the cancel channel only, since a
// 1 GiB upload takes longer than any sane header budget. Nothing here is a
// context.Context, so nothing can derive from the pooled request state
// and outlive the request.

// agentWait is what agent sl's next event, about to be sent at now (a
// mono reading, which the call reuses instead of reading the clock
// again), may wait for: the rest of its request budget (none when it has
// no timeout) and the client's cancel. ok is false when the budget is
// spent; the deadline is then already past.
func (ex *Exchange) agentWait(sl *slot, now time.Duration) (w agentmux.Wait, ok bool) {
	w.Cancel = ex.cancelCh
	w.Now = clock.At(now)
	if sl.ra.timeout <= 0 {
		return w, true
	}
	left := sl.ra.timeout - sl.spent
	w.Deadline = clock.At(now + left)
	return w, left > 0
}

// streamWait is the wait of a streamed chunk sent at now: cancellation
// only (the session's message timeout still bounds each reply).
func (ex *Exchange) streamWait(now time.Duration) agentmux.Wait {
	return agentmux.Wait{Cancel: ex.cancelCh, Now: clock.At(now)}
}

// cancel closes the request's cancel channel, which ends any agent wait,
// and aborts the upstream exchange: the client went away (or the server
// is stopping). Safe from any goroutine.
func (ex *Exchange) cancel() {
	ex.mu.Lock()
	if ex.cancelErr != nil {
		ex.mu.Unlock()
		return
	}
	ex.cancelErr = context.Canceled
	close(ex.cancelCh)
	up := ex.upNet
	if up != nil {
		ex.upAborted = true
	}
	ex.mu.Unlock()
	if up != nil {
		_ = up.Close()
	}
}

// Cancel ends the request for a client that went away, from any
// goroutine: for a front end whose engine tells it at once (an HTTP/2
// stream's reset ends its context) rather than through Front.Gone's
// periodic check. The front end must not call it after Finish.
func (ex *Exchange) Cancel() { ex.cancel() }

// canceled reports whether cancel ran.
func (ex *Exchange) canceled() bool {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	return ex.cancelErr != nil
}

// resetCancel prepares the cancel state for a new request (on the handler
// goroutine, before the request is visible to the watcher). A cancel
// channel that was never closed is kept; a closed one is replaced, so a
// request never starts canceled.
func (ex *Exchange) resetCancel() {
	ex.mu.Lock()
	if ex.cancelErr != nil {
		ex.cancelCh = make(chan struct{})
		ex.cancelErr = nil
	}
	ex.upNet = nil
	ex.upAborted = false
	ex.mu.Unlock()
}

// guard is the Exchange as the upstream's Guard.
type guard Exchange

// Attach implements Guard: c is what cancel aborts.
func (g *guard) Attach(c io.Closer) bool {
	ex := (*Exchange)(g)
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.cancelErr != nil {
		return false
	}
	ex.upNet = c
	return true
}

// Detach implements Guard.
func (g *guard) Detach() (aborted bool) {
	ex := (*Exchange)(g)
	ex.mu.Lock()
	aborted = ex.upAborted
	ex.upNet = nil
	ex.mu.Unlock()
	return aborted
}

// Canceled implements Guard.
func (g *guard) Canceled() bool { return (*Exchange)(g).canceled() }

// watcher finds requests whose client went away while the request waits
// on an agent or the upstream, without a goroutine per request: requests
// register in a sharded list, and one goroutine peeks at the sockets of
// those older than the check interval.
type watcher struct {
	interval time.Duration
	shards   [watchShards]watchShard
	stop     chan struct{}
	done     chan struct{}
	onGone   func(ex *Exchange)
}

const watchShards = 16

type watchShard struct {
	mu   sync.Mutex
	head *Exchange
	_    [40]byte // keep shards on separate cache lines
}

func newWatcher(interval time.Duration, onGone func(*Exchange)) *watcher {
	w := &watcher{interval: interval, stop: make(chan struct{}), done: make(chan struct{}), onGone: onGone}
	go w.run()
	return w
}

func (w *watcher) add(ex *Exchange) {
	s := &w.shards[ex.id%watchShards]
	s.mu.Lock()
	ex.wprev = nil
	ex.wnext = s.head
	if s.head != nil {
		s.head.wprev = ex
	}
	s.head = ex
	s.mu.Unlock()
}

func (w *watcher) remove(ex *Exchange) {
	s := &w.shards[ex.id%watchShards]
	s.mu.Lock()
	if ex.wprev != nil {
		ex.wprev.wnext = ex.wnext
	} else if s.head == ex {
		s.head = ex.wnext
	}
	if ex.wnext != nil {
		ex.wnext.wprev = ex.wprev
	}
	ex.wprev, ex.wnext = nil, nil
	s.mu.Unlock()
}

func (w *watcher) close() {
	close(w.stop)
	<-w.done
}

func (w *watcher) run() {
	defer close(w.done)
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case now := <-t.C:
			w.check(now)
		}
	}
}

func (w *watcher) check(now time.Time) {
	for i := range w.shards {
		s := &w.shards[i]
		s.mu.Lock()
		for ex := s.head; ex != nil; ex = ex.wnext {
			// Only requests that have waited a while are worth a syscall;
			// the request stays registered (and its connection open) while
			// the shard lock is held.
			if now.Sub(ex.start) < w.interval || ex.gone {
				continue
			}
			if ex.front.Gone() {
				ex.gone = true
				w.onGone(ex)
			}
		}
		s.mu.Unlock()
	}
}
