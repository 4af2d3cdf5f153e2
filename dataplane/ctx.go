package dataplane

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/zentinelproxy/sidecar/dataplane/internal/clock"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
)

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
func (rs *reqState) agentWait(sl *slot, now time.Duration) (w agentmux.Wait, ok bool) {
	w.Cancel = rs.cancelCh
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
func (rs *reqState) streamWait(now time.Duration) agentmux.Wait {
	return agentmux.Wait{Cancel: rs.cancelCh, Now: clock.At(now)}
}

// cancel closes the request's cancel channel, which ends any agent wait,
// and aborts the upstream exchange: the client went away (or the server
// is stopping). Safe from any goroutine.
func (rs *reqState) cancel() {
	rs.mu.Lock()
	if rs.cancelErr != nil {
		rs.mu.Unlock()
		return
	}
	rs.cancelErr = context.Canceled
	close(rs.cancelCh)
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

// resetCancel prepares the cancel state for a new request (on the handler
// goroutine, before the request is visible to the watcher). A cancel
// channel that was never closed is kept; a closed one is replaced, so a
// request never starts canceled.
func (rs *reqState) resetCancel() {
	rs.mu.Lock()
	if rs.cancelErr != nil {
		rs.cancelCh = make(chan struct{})
		rs.cancelErr = nil
	}
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
