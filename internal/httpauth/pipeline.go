package httpauth

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/yield"
)

// Pipelining (option pipeline): the GET subrequests that start while one
// of them waits to be sent go together, in one write on one connection
// (HTTP/1.1 pipelining), and their answers are read in order by the
// first of them, the leader, which hands each of the others its answer.
//
// Why: one subrequest per write costs the service a wake-up, a read, a
// write and a read that finds nothing for every request, and its wake-up
// preempts the proxy in the middle of the burst it is handling. On the
// peer benchmark (the proxy and a fasthttp auth server on one core, 64
// connections) the auth server took 15.3–15.9 µs per request and the
// pair 1.8 context switches; pipelined, about eight subrequests a batch,
// 5.3–5.5 µs and 0.4, and the pair 37.1 µs per request instead of 61.2
// (nginx with auth_request: 44.7; docs/performance.md). The header style
// made no difference to the auth server's cost (traefik's six headers or
// nginx's two): its wake-ups did.
//
// The leader yields once (runtime.Gosched) before it sends, so that the
// goroutines already runnable (the requests of the same burst) join; a
// yield.Policy stops the yields while nobody joins them, as the agent
// connections' senders do.
//
// What it changes: an answer waits for those before it on its connection
// (head-of-line blocking: a slow answer delays the requests that were
// sent after it, within their deadline), the batch is bounded by its
// earliest deadline, the leader does not end when its own client goes
// away (the others' answers come on its connection; the batch's deadline
// bounds it), and the service must frame every answer exactly: a
// wrong Content-Length in one answer would be read as part of the next
// one's (the answers are handed over only once the batch's framing held
// to its end, so that fails the batch rather than shift its verdicts:
// sendBatch). A server that mishandles pipelined requests answers them wrongly
// or not at all. Hence opt-in, and only for GET subrequests (the traefik
// style's, and the nginx style's for GET requests): RFC 9112 9.3.2 keeps
// non-idempotent methods out of pipelines. A connection that the service
// closes, or ends with Connection: close, before the last answer costs
// the subrequests without an answer another try, as a reused
// connection's failure does.

// batch is the subrequests sent together; calls[0] is the leader's.
type batch struct {
	calls    []*call
	bytes    int
	deadline time.Time // the earliest of the calls'
	buf      []byte    // the request heads, one after another
}

// errAbandoned: a follower's client went away before its answer came;
// the leader then owns its call (and puts it back in the pool).
var errAbandoned = fmt.Errorf("%w: client gone", errAborted)

// tryPipelined is try for a GET subrequest (see above): it joins the
// batch that is forming, or leads a new one.
func (c *Client) tryPipelined(cl *call, w agentmux.Wait) (truncated, retry bool, err error) {
	p := &c.pool
	cl.res = result{}
	p.mu.Lock()
	if b := p.forming; b != nil && len(b.calls) < c.cfg.Pipeline && b.bytes+len(cl.buf) <= maxHeld && !p.closed {
		b.calls = append(b.calls, cl)
		b.bytes += len(cl.buf)
		if !w.Deadline.IsZero() && (b.deadline.IsZero() || w.Deadline.Before(b.deadline)) {
			b.deadline = w.Deadline
		}
		cl.done, cl.abandoned = false, false
		p.mu.Unlock()
		return c.follow(cl, w)
	}
	if len(cl.buf) > maxHeld || p.closed {
		p.mu.Unlock()
		return c.try(cl, w, false)
	}
	b, _ := p.batches.Get().(*batch)
	if b == nil {
		b = &batch{}
	}
	b.calls = append(b.calls[:0], cl)
	b.bytes, b.deadline = len(cl.buf), w.Deadline
	p.forming = b
	yielded := p.yp.Before()
	p.mu.Unlock()
	if yielded {
		yield.Gosched(p)
	}
	p.mu.Lock()
	if p.forming == b {
		p.forming = nil
	}
	n := len(b.calls)
	if yielded {
		p.yp.After(n > 1)
	}
	p.mu.Unlock()
	if n == 1 {
		p.putBatch(b)
		return c.try(cl, w, false)
	}
	c.counts[evPipelined].Add(uint64(n))
	c.sendBatch(b)
	truncated, retry, err = cl.res.truncated, cl.res.retry, cl.res.err
	p.putBatch(b)
	return truncated, retry, err
}

// result is a follower's outcome, as the leader read it.
type result struct {
	truncated, retry bool
	err              error
}

// follow waits for the leader to hand cl its answer, or for cl's client
// to go away. The batch's deadline bounds the wait: it is no later than
// cl's, and the leader's read ends by it.
func (c *Client) follow(cl *call, w agentmux.Wait) (truncated, retry bool, err error) {
	select {
	case <-cl.ready:
	case <-w.Cancel: // nil: never
		p := &c.pool
		p.mu.Lock()
		if !cl.done {
			cl.abandoned = true
			p.mu.Unlock()
			return false, false, errAbandoned
		}
		p.mu.Unlock()
		<-cl.ready // handed over just now
	}
	return cl.res.truncated, cl.res.retry, cl.res.err
}

// deliver hands a follower its result; an abandoned one goes back to
// the pool.
func (p *connPool) deliver(cl *call) {
	p.mu.Lock()
	if cl.abandoned {
		cl.abandoned = false
		p.mu.Unlock()
		cl.res = result{}
		p.putCall(cl)
		return
	}
	cl.done = true
	p.mu.Unlock()
	cl.ready <- struct{}{}
}

func (p *connPool) putBatch(b *batch) {
	clear(b.calls)
	b.calls = b.calls[:0]
	if cap(b.buf) > 2*maxHeld {
		b.buf = nil
	}
	// Pooled, not one spare: while one batch is sent the next forms, and
	// a batch made anew grows its calls and buf again (0.2 allocations
	// per subrequest with 64 in flight).
	p.batches.Put(b)
}

// sendBatch sends the batch's requests in one write and reads their
// answers in order, each into its call (cl.res), handing the followers
// theirs as they come.
func (c *Client) sendBatch(b *batch) {
	p := &c.pool
	lead := b.calls[0]
	i := 0 // the first call not handed its answer
	var failed error
	retry := false // the calls from i on may go again
	finish := func() {
		for ; i < len(b.calls); i++ {
			cl := b.calls[i]
			cl.res = result{retry: retry, err: failed}
			if i > 0 {
				p.deliver(cl)
			}
		}
	}
	now := time.Now()
	if !b.deadline.IsZero() && !now.Before(b.deadline) {
		failed = fmt.Errorf("%w before the subrequest", context.DeadlineExceeded)
		finish()
		return
	}
	pc := p.get(now)
	reused := pc != nil
	if pc == nil {
		var err error
		if pc, err = c.dial(b.deadline); err != nil {
			failed = c.dialErr(err, now, b.deadline) // as in try
			finish()
			return
		}
	}
	// The leader is in flight for Close and CancelAll, not for its own
	// client going away: the batch's other calls wait on it.
	if !p.attach(lead, pc, nil) {
		_ = pc.Close()
		failed = fmt.Errorf("%w: closed", errAborted)
		finish()
		return
	}
	keep := false
	defer func() {
		aborted := p.detach(lead)
		if aborted && failed != nil && !errors.Is(failed, errAborted) {
			failed = fmt.Errorf("%w: %v", errAborted, failed)
			retry = false
		}
		finish()
		if keep && !aborted {
			p.put(pc, time.Now())
		} else {
			_ = pc.Close()
		}
	}()
	b.buf = b.buf[:0]
	for _, cl := range b.calls {
		b.buf = append(b.buf, cl.buf...)
	}
	held := reused && pc.plain && len(b.buf) <= maxHeld
	var err error
	if held {
		pc.raw.HoldWrites() // as in try
		err = pc.raw.SetReadDeadline(b.deadline)
	} else {
		err = pc.SetDeadline(b.deadline)
	}
	if err != nil {
		failed = err
		return
	}
	if _, err = pc.Write(b.buf); err != nil {
		failed, retry = timeoutErr(err), reused
		if reused {
			failed = fmt.Errorf("%w: %v", errStale, err)
		}
		return
	}
	if pc.plain && !held {
		_ = pc.raw.Conn.SetWriteDeadline(time.Time{})
	}
	br := p.getReader(pc)
	defer p.putReader(br)
	// The answers are handed over once the batch's framing held to its
	// end: all of them read, or the connection ended cleanly between two.
	// An answer whose Content-Length took in the next one's (a framing
	// error the service keeps its connection through) makes each answer
	// after it read as the next subrequest's: the one that never comes
	// then fails the batch, instead of a deny's subrequest being handed
	// another's allow and its identity headers.
	handOver := func(n int) {
		for k := 1; k < n; k++ {
			p.deliver(b.calls[k]) // the follower's from here on
		}
		i = n
	}
	for j := 0; j < len(b.calls); j++ {
		cl := b.calls[j]
		// An end of the connection before an answer that is not the
		// first on a fresh connection: the service closed it after the
		// answers before; this one and those after may go again.
		stale := reused || j > 0
		complete, err := c.readAnswer(br, cl, false, stale)
		if err != nil {
			if errors.Is(err, errStale) {
				// Closed cleanly after answer j-1: those before are whole.
				handOver(j)
				failed, retry = err, true
				return
			}
			// A timeout or a malformed answer: the framing of those
			// before is in doubt too, and none is handed over.
			failed, retry = err, false
			return
		}
		last := !complete || cl.resp.ConnectionClose()
		cl.res = result{truncated: !complete}
		if last {
			// The rest of the answers cannot be found (a body not read
			// to its end) or will not come: the others go again.
			handOver(j + 1)
			failed, retry = fmt.Errorf("%w: answer %d of %d ended the connection", errStale, i, len(b.calls)), true
			return
		}
	}
	handOver(len(b.calls))
	// Reused only when nothing came after the last answer.
	keep = br.Buffered() == 0
}
