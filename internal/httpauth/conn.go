package httpauth

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/rawio"
	"github.com/zentinelproxy/sidecar/internal/yield"
)

// The subrequests go over keep-alive connections of the client's own
// pool, written from a buffer the request head is appended to and read
// with fasthttp's response parser: one write and one read per
// subrequest on the request's goroutine. net/http's client, which this
// replaces, spent a reader and a writer goroutine per connection, a
// context and a cancel goroutine per call and about 60 allocations: the
// sidecar and its auth server took 1.6 times the CPU per request they
// take now (the peer benchmark; docs/transports.md, "Cost").

const (
	// maxDrain is the most of a 2xx answer's body read (and dropped) to
	// keep its connection; a longer one closes the connection.
	maxDrain = 64 << 10
	// idleTimeout closes a connection idle for longer (services close
	// theirs after a while; an old one is likely dead).
	idleTimeout = 90 * time.Second
	// reapInterval is how often the calls in flight are checked for a
	// client that went away: the cancel channel is not a context, and
	// one goroutine per client polling them costs less than one per call.
	reapInterval = 50 * time.Millisecond
	// maxAttempts bounds the tries of one subrequest: a reused connection
	// that the service closed while idle fails before any answer, and
	// the subrequest goes again on another (it has no body; asking twice
	// is harmless).
	maxAttempts = 3
	// maxHeld is the longest head whose write is held to the read of the
	// answer (rawio holds at most 16 KiB).
	maxHeld = 16 << 10
)

// errAborted: the call's connection was closed under it (CancelAll,
// Close, or its client went away).
var errAborted = errors.New("subrequest aborted")

// pconn is a connection to the service.
type pconn struct {
	net.Conn
	// raw is the socket, read and written with raw system calls (the
	// dataplane's upstream connections are too: rawio), nil when it is
	// neither a TCP nor a Unix socket; for https it is beneath the TLS.
	raw       *rawio.Conn
	plain     bool // Conn is raw itself (http://)
	idleSince time.Time
}

// call is one subrequest's state, pooled: the request head, the
// response, and what aborts it.
type call struct {
	buf  []byte // the request head
	body []byte // the answer's body, as far as read
	resp fasthttp.Response

	// Guarded by the pool's mu.
	conn    *pconn
	cancel  <-chan struct{}
	slot    int
	aborted bool

	// Pipelining (pipeline.go): ready carries a follower's answer from
	// the leader, res is its outcome; done (the answer is handed over)
	// and abandoned (the follower left first) are guarded by the pool's
	// mu.
	ready     chan struct{}
	res       result
	done      bool
	abandoned bool
}

// connPool holds the idle connections and the calls in flight.
type connPool struct {
	mu       sync.Mutex
	idle     []*pconn // LIFO: the warmest first
	inflight []*call
	closed   bool
	maxIdle  int
	// wake tells the reaper, parked after a tick with no call, that a
	// call started; started marks a call since the last tick, parked a
	// parked reaper (so a busy pool never sends a wake-up).
	wake    chan struct{}
	started bool
	parked  bool
	// forming is the batch that GET subrequests join (pipelining), until
	// its leader sends it; yp decides the leader's yield.
	forming *batch
	yp      yield.Policy

	calls   sync.Pool // *call
	readers sync.Pool // *bufio.Reader of maxResponseHeader bytes
	batches sync.Pool // *batch
}

// get takes an idle connection (nil: none). Those idle too long, those
// the service closed meanwhile and those with bytes waiting that no
// subrequest asked for are closed on the way: the look is one
// recvfrom(2) with MSG_PEEK (rawio.Conn.Pending), as the dataplane's
// upstream pool does, and it is what lets the subrequest's write go out
// with the read of its answer (see try).
func (p *connPool) get(now time.Time) *pconn {
	for {
		p.mu.Lock()
		n := len(p.idle)
		if n == 0 {
			p.mu.Unlock()
			return nil
		}
		pc := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		if now.Sub(pc.idleSince) < idleTimeout {
			if pc.raw == nil {
				return pc
			}
			if data, err := pc.raw.Pending(); !data && err == nil {
				return pc
			}
		}
		_ = pc.Close()
	}
}

// put keeps pc for the next subrequest, or closes it.
func (p *connPool) put(pc *pconn, now time.Time) {
	pc.idleSince = now
	p.mu.Lock()
	if !p.closed && len(p.idle) < p.maxIdle {
		p.idle = append(p.idle, pc)
		pc = nil
	}
	p.mu.Unlock()
	if pc != nil {
		_ = pc.Close()
	}
}

// attach registers cl as in flight on pc; false: the pool is closed.
func (p *connPool) attach(cl *call, pc *pconn, cancel <-chan struct{}) bool {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return false
	}
	cl.conn, cl.cancel, cl.aborted = pc, cancel, false
	cl.slot = len(p.inflight)
	p.inflight = append(p.inflight, cl)
	p.started = true
	wake := p.parked
	p.parked = false
	p.mu.Unlock()
	if wake {
		select {
		case p.wake <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
	return true
}

// detach unregisters cl; aborted: its connection was closed under it.
func (p *connPool) detach(cl *call) (aborted bool) {
	p.mu.Lock()
	last := len(p.inflight) - 1
	if i := cl.slot; i <= last && p.inflight[i] == cl {
		p.inflight[i] = p.inflight[last]
		p.inflight[i].slot = i
		p.inflight[last] = nil
		p.inflight = p.inflight[:last]
	}
	aborted = cl.aborted
	cl.conn, cl.cancel = nil, nil
	p.mu.Unlock()
	return aborted
}

// park reports whether the reaper may sleep: no call in flight and none
// started since the last tick; it then counts as parked.
func (p *connPool) park() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	idle := len(p.inflight) == 0 && !p.started
	p.started = false
	p.parked = idle
	return idle
}

// abort closes the connections of the calls in flight (all of them, or
// those whose client went away), which ends their reads and writes. The
// calls are marked under mu and their connections closed after it: a
// close is a system call or two (a TLS one writes its close_notify
// first), and every subrequest takes mu to start and to end. A marked
// call's connection never goes back to the pool (detach reports it
// aborted), so closing it late closes nothing another call uses.
func (p *connPool) abort(all bool) {
	var conns []*pconn // rare: only calls whose client went away
	p.mu.Lock()
	for _, cl := range p.inflight {
		if cl.aborted || (!all && (cl.cancel == nil || !isClosed(cl.cancel))) {
			continue
		}
		cl.aborted = true
		conns = append(conns, cl.conn)
	}
	p.mu.Unlock()
	for _, pc := range conns {
		_ = pc.Close()
	}
}

// close ends the calls in flight and the idle connections; connections
// given back later are closed.
func (p *connPool) close() {
	p.abort(true)
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, pc := range idle {
		_ = pc.Close()
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func (p *connPool) getCall() *call {
	if cl, _ := p.calls.Get().(*call); cl != nil {
		return cl
	}
	cl := &call{ready: make(chan struct{}, 1)}
	// The answer's headers are passed on as the service sent them: no
	// Content-Type made up for an answer without one.
	cl.resp.Header.SetNoDefaultContentType(true)
	return cl
}

func (p *connPool) putCall(cl *call) {
	cl.resp.ResetBody()
	if cap(cl.body) > maxDrain+1 || cap(cl.buf) > 64<<10 {
		return // an outsized one goes to the GC
	}
	p.calls.Put(cl)
}

func (p *connPool) getReader(c net.Conn) *bufio.Reader {
	if br, _ := p.readers.Get().(*bufio.Reader); br != nil {
		br.Reset(c)
		return br
	}
	// The whole head of an answer must fit: the reader's size is the
	// head's limit (fasthttp fails a longer one).
	return bufio.NewReaderSize(c, maxResponseHeader)
}

func (p *connPool) putReader(br *bufio.Reader) {
	br.Reset(nil)
	p.readers.Put(br)
}

// dial connects to the service (TCP, then TLS for https) by deadline
// (zero: DialTimeout from now).
func (c *Client) dial(deadline time.Time) (*pconn, error) {
	limit := time.Now().Add(c.cfg.DialTimeout)
	if deadline.IsZero() || limit.Before(deadline) {
		deadline = limit
	}
	d := net.Dialer{Deadline: deadline, KeepAlive: 30 * time.Second}
	nc, err := d.Dial(c.net, c.addr)
	if err != nil {
		return nil, err
	}
	nc = rawio.Wrap(nc)
	raw, _ := nc.(*rawio.Conn)
	if c.tls == nil {
		return &pconn{Conn: nc, raw: raw, plain: raw != nil}, nil
	}
	tc := tls.Client(nc, c.tls)
	if err := tc.SetDeadline(deadline); err != nil {
		_ = nc.Close()
		return nil, err
	}
	if err := tc.Handshake(); err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("tls handshake: %w", err)
	}
	return &pconn{Conn: tc, raw: raw}, nil
}

// roundTrip sends cl.buf (a whole request head) and reads the answer's
// head into cl.resp and its body into cl.body: at most maxBody bytes of
// a non-2xx answer's body (truncated: there was more), at most maxDrain
// of a 2xx answer's (dropped by the caller). head: the subrequest is a
// HEAD (its answer has no body). The call ends by w.Deadline, and when
// its client goes away (w.Cancel, polled by reap) or the link aborts.
//
// pipe: a GET subrequest, which goes pipelined with others when the
// option pipeline allows (pipeline.go); its error errAbandoned leaves cl
// to the batch's leader, not to be put back.
func (c *Client) roundTrip(cl *call, w agentmux.Wait, head, pipe bool) (truncated bool, err error) {
	for attempt := 1; ; attempt++ {
		var reused bool
		if pipe && c.cfg.Pipeline > 1 {
			truncated, reused, err = c.tryPipelined(cl, w)
		} else {
			truncated, reused, err = c.try(cl, w, head)
		}
		if err == nil || !reused || attempt == maxAttempts || !errors.Is(err, errStale) {
			return truncated, err
		}
		if w.Cancel != nil && isClosed(w.Cancel) {
			return false, err
		}
	}
}

// errStale: a reused connection failed before any answer came.
var errStale = errors.New("connection closed by the service")

func (c *Client) try(cl *call, w agentmux.Wait, head bool) (truncated, reused bool, err error) {
	p := &c.pool
	now := time.Now()
	if !w.Deadline.IsZero() && !now.Before(w.Deadline) {
		return false, false, fmt.Errorf("%w before the subrequest", context.DeadlineExceeded)
	}
	pc := p.get(now)
	reused = pc != nil
	if pc == nil {
		if pc, err = c.dial(w.Deadline); err != nil {
			return false, false, c.dialErr(err, now, w.Deadline)
		}
	}
	if !p.attach(cl, pc, w.Cancel) {
		_ = pc.Close()
		return false, reused, fmt.Errorf("%w: closed", errAborted)
	}
	keep := false
	defer func() {
		if p.detach(cl) {
			err = fmt.Errorf("%w: %v", errAborted, err)
			keep = false
		}
		if keep {
			p.put(pc, time.Now())
		} else {
			_ = pc.Close()
		}
	}()
	held := reused && pc.plain && len(cl.buf) <= maxHeld
	if held {
		// The head goes out with the read of the answer: the read that
		// would find nothing yet is not made, one system call fewer. On
		// a reused connection only, just looked at (get): a FIN that came
		// while it sat idle would not wake a held read. The write is the
		// read's, under its deadline: the connection's write deadline is
		// left as it is.
		pc.raw.HoldWrites()
		err = pc.raw.SetReadDeadline(w.Deadline)
	} else {
		err = pc.SetDeadline(w.Deadline)
	}
	if err != nil {
		return false, reused, err
	}
	if _, err = pc.Write(cl.buf); err != nil {
		if reused {
			err = fmt.Errorf("%w: %v", errStale, err)
		}
		return false, reused, timeoutErr(err)
	}
	if pc.plain && !held {
		// Later held writes go out with no deadline of their own but the
		// read's: none is left for the rare one that the socket cannot
		// take whole, which is finished as an ordinary write.
		_ = pc.raw.Conn.SetWriteDeadline(time.Time{})
	}
	br := p.getReader(pc)
	defer p.putReader(br)
	complete, err := c.readAnswer(br, cl, head, reused)
	if err != nil {
		return false, reused, err
	}
	// Reused only when the answer was read to its end and nothing came
	// after it (a body delimited by the connection's end marks the
	// answer Connection: close).
	keep = complete && !cl.resp.ConnectionClose() && br.Buffered() == 0
	return !complete, reused, nil
}

// readAnswer reads one answer from br into cl.resp and cl.body (see
// roundTrip); complete: its body was read to its end. stale: an end of
// the connection before the answer counts as errStale (a reused
// connection, or one whose earlier answers were read).
func (c *Client) readAnswer(br *bufio.Reader, cl *call, head, stale bool) (complete bool, err error) {
	resp := &cl.resp
	resp.SkipBody = head
	resp.StreamBody = true
	if err = resp.ReadLimitBody(br, 0); err != nil {
		if stale && errors.Is(err, io.EOF) {
			err = fmt.Errorf("%w: %v", errStale, err)
		}
		return false, timeoutErr(err)
	}
	limit := maxDrain
	if st := resp.StatusCode(); st < 200 || st > 299 {
		limit = c.cfg.MaxBody
	}
	cl.body = cl.body[:0]
	complete = true
	if s := resp.BodyStream(); s != nil {
		cl.body, complete, err = readUpTo(s, cl.body, limit)
		if err != nil {
			return false, timeoutErr(err)
		}
	}
	return complete, nil
}

// readUpTo appends at most limit bytes of r to b; complete: r ended
// there (more: there was more).
func readUpTo(r io.Reader, b []byte, limit int) (_ []byte, complete bool, err error) {
	for {
		if len(b) == cap(b) {
			b = append(b, make([]byte, max(512, len(b)))...)[:len(b)]
		}
		room := b[len(b):cap(b)]
		if most := limit + 1 - len(b); len(room) > most {
			room = room[:most]
		}
		n, err := r.Read(room)
		b = b[:len(b)+n]
		if len(b) > limit {
			return b[:limit], false, nil
		}
		if err == io.EOF {
			return b, true, nil
		}
		if err != nil {
			return b, false, err
		}
	}
}

// timeoutErr marks a timeout as context.DeadlineExceeded (what the link
// maps to agentmux.ErrAgentTimeout).
func timeoutErr(err error) error {
	var te interface{ Timeout() bool }
	if errors.As(err, &te) && te.Timeout() {
		return fmt.Errorf("%w: %v", context.DeadlineExceeded, err)
	}
	return err
}

// reap polls the calls in flight for clients that went away, until ctx
// ends; after a tick with no call it sleeps until one starts (an idle
// agent costs no wake-ups, a busy one no wake-up per call).
func (c *Client) reap() {
	defer c.wg.Done()
	t := time.NewTicker(reapInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			c.pool.abort(false)
			if !c.pool.park() {
				continue
			}
			t.Stop()
			select {
			case <-c.pool.wake:
			case <-c.ctx.Done():
				return
			}
			t.Reset(reapInterval)
		case <-c.ctx.Done():
			return
		}
	}
}
