package dataplane

import (
	"context"
	"net"
	"sync"
	"time"
)

// The per-request context handed to agent exchanges is the pooled request
// state itself, viewed through two small types, so a request allocates no
// context, channel or timer. Two views exist because streamed chunks must
// not inherit the per-request agent deadline (a 1 GiB upload takes longer
// than any sane header budget): both end when the client goes away; only
// the deadline view also ends when the agent's request budget runs out.

// deadlineCtx is the view for header events and buffered bodies.
type deadlineCtx struct{ rs *reqState }

// streamCtx is the view for streamed chunks: cancellation only.
type streamCtx struct{ rs *reqState }

func (c *deadlineCtx) Deadline() (time.Time, bool) {
	rs := c.rs
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.deadline, !rs.deadline.IsZero()
}

func (c *deadlineCtx) Done() <-chan struct{} { return c.rs.dlCh }

func (c *deadlineCtx) Err() error {
	rs := c.rs
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.dlErr
}

func (c *deadlineCtx) Value(any) any { return nil }

func (c *streamCtx) Deadline() (time.Time, bool) { return time.Time{}, false }

func (c *streamCtx) Done() <-chan struct{} { return c.rs.cancelCh }

func (c *streamCtx) Err() error {
	rs := c.rs
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.cancelErr
}

func (c *streamCtx) Value(any) any { return nil }

var (
	_ context.Context = (*deadlineCtx)(nil)
	_ context.Context = (*streamCtx)(nil)
)

// armDeadline sets the agent deadline of the deadline view. A view whose
// previous deadline fired gets a fresh channel, unless the client is gone.
func (rs *reqState) armDeadline(d time.Time) {
	rs.mu.Lock()
	if rs.dlErr != nil && rs.cancelErr == nil {
		rs.dlCh = make(chan struct{})
		rs.dlErr = nil
	}
	rs.deadline = d
	rs.mu.Unlock()
	rs.timer.Reset(time.Until(d))
}

// disarmDeadline stops the agent deadline.
func (rs *reqState) disarmDeadline() {
	rs.mu.Lock()
	rs.deadline = time.Time{}
	rs.mu.Unlock()
	rs.timer.Stop()
}

// onDeadline runs on the timer's goroutine. A stale firing (the timer
// was re-armed after it started) finds a later deadline and does nothing.
func (rs *reqState) onDeadline() {
	rs.mu.Lock()
	if rs.dlErr == nil && !rs.deadline.IsZero() && !time.Now().Before(rs.deadline) {
		rs.dlErr = context.DeadlineExceeded
		close(rs.dlCh)
	}
	rs.mu.Unlock()
}

// cancel ends both views and aborts the upstream exchange: the client
// went away (or the server is stopping). Safe from any goroutine.
func (rs *reqState) cancel() {
	rs.mu.Lock()
	if rs.cancelErr != nil {
		rs.mu.Unlock()
		return
	}
	rs.cancelErr = context.Canceled
	close(rs.cancelCh)
	if rs.dlErr == nil {
		rs.dlErr = context.Canceled
		close(rs.dlCh)
	}
	up := rs.upNet
	if up != nil {
		rs.upAborted = true
	}
	rs.mu.Unlock()
	if up != nil {
		_ = up.Close()
	}
}

// canceled reports whether cancel ran.
func (rs *reqState) canceled() bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.cancelErr != nil
}

// resetCtx prepares the views for a new request (on the handler goroutine,
// before the request is visible to the watcher).
func (rs *reqState) resetCtx() {
	rs.mu.Lock()
	if rs.cancelErr != nil {
		rs.cancelCh = make(chan struct{})
	}
	if rs.dlErr != nil {
		rs.dlCh = make(chan struct{})
	}
	rs.cancelErr, rs.dlErr = nil, nil
	rs.deadline = time.Time{}
	rs.upNet = nil
	rs.upAborted = false
	rs.mu.Unlock()
}

// watcher finds requests whose client went away while the request waits
// on an agent or the upstream, without a goroutine per request: requests
// register in a sharded list, and one goroutine peeks at the sockets of
// those older than the check interval.
type watcher struct {
	interval time.Duration
	shards   [watchShards]watchShard
	stop     chan struct{}
	done     chan struct{}
	onGone   func(rs *reqState)
}

const watchShards = 16

type watchShard struct {
	mu   sync.Mutex
	head *reqState
	_    [40]byte // keep shards on separate cache lines
}

func newWatcher(interval time.Duration, onGone func(*reqState)) *watcher {
	w := &watcher{interval: interval, stop: make(chan struct{}), done: make(chan struct{}), onGone: onGone}
	go w.run()
	return w
}

func (w *watcher) add(rs *reqState) {
	s := &w.shards[rs.id%watchShards]
	s.mu.Lock()
	rs.wprev = nil
	rs.wnext = s.head
	if s.head != nil {
		s.head.wprev = rs
	}
	s.head = rs
	s.mu.Unlock()
}

func (w *watcher) remove(rs *reqState) {
	s := &w.shards[rs.id%watchShards]
	s.mu.Lock()
	if rs.wprev != nil {
		rs.wprev.wnext = rs.wnext
	} else if s.head == rs {
		s.head = rs.wnext
	}
	if rs.wnext != nil {
		rs.wnext.wprev = rs.wprev
	}
	rs.wprev, rs.wnext = nil, nil
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
		for rs := s.head; rs != nil; rs = rs.wnext {
			// Only requests that have waited a while are worth a syscall;
			// the request stays registered (and its connection open) while
			// the shard lock is held.
			if now.Sub(rs.start) < w.interval || rs.gone {
				continue
			}
			if peerClosed(rs.conn) {
				rs.gone = true
				w.onGone(rs)
			}
		}
		s.mu.Unlock()
	}
}

// peerClosed reports whether the client closed its end of c. A socket
// with unread data (a pipelined request, an unread body) reads as open.
var peerClosed = func(c net.Conn) bool { return peekClosed(c) }
