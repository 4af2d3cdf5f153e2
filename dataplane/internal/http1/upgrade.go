package http1

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zentinelproxy/sidecar/dataplane/internal/clock"
	"github.com/zentinelproxy/sidecar/dataplane/internal/exchange"
	"github.com/zentinelproxy/sidecar/internal/observe"
)

// Upgrade tunnels. The exchange decides that a request is an upgrade and
// relays it; on the upstream's 101 it hands both connections here
// (request.Tunnel): the client gets the 101 and from then on the bytes
// are relayed both ways, uninspected. A tunnel ends when either side
// closes or fails (the other side is closed at once), when no byte went
// either way for tunnel_idle_timeout, or at shutdown once the grace
// period is over. Tunnels are capped per listener (max_tunnels, 503 past
// it; with max_connections within the descriptor budget, the dataplane's
// fdlimit.go); a tunnel's client connection leaves the listener's
// max_connections count when the tunnel starts. A tunnel holds its
// upstream connection against the upstream's max_conns until it ends.

var statusLine101 = []byte("HTTP/1.1 101 Switching Protocols\r\n")

type tunnelCounters struct {
	opened, closed, refused, idle, drained, bytesIn, bytesOut atomic.Uint64
}

func (c *tunnelCounters) snapshot() observe.TunnelStats {
	st := observe.TunnelStats{
		Opened: c.opened.Load(), Closed: c.closed.Load(), Refused: c.refused.Load(),
		IdleClosed: c.idle.Load(), DrainClosed: c.drained.Load(),
		BytesIn: c.bytesIn.Load(), BytesOut: c.bytesOut.Load(),
	}
	st.Open = int64(st.Opened) - int64(st.Closed)
	return st
}

// tunnelSet is a listener's open tunnels.
type tunnelSet struct {
	mu   sync.Mutex
	open map[*tunnel]struct{}
	n    atomic.Int64
	// empty is closed and replaced when the set becomes empty while a
	// drain waits on it.
	empty chan struct{}
}

// reserve takes a tunnel slot, or reports that max are taken.
func (ts *tunnelSet) reserve(max int) bool {
	for {
		n := ts.n.Load()
		if n >= int64(max) {
			return false
		}
		if ts.n.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (ts *tunnelSet) add(t *tunnel) {
	ts.mu.Lock()
	if ts.open == nil {
		ts.open = map[*tunnel]struct{}{}
	}
	ts.open[t] = struct{}{}
	ts.mu.Unlock()
}

func (ts *tunnelSet) remove(t *tunnel) {
	ts.mu.Lock()
	delete(ts.open, t)
	if len(ts.open) == 0 && ts.empty != nil {
		close(ts.empty)
		ts.empty = nil
	}
	ts.mu.Unlock()
	ts.n.Add(-1)
}

// waitEmpty returns a channel closed once no tunnel is open.
func (ts *tunnelSet) waitEmpty() <-chan struct{} {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if len(ts.open) == 0 {
		c := make(chan struct{})
		close(c)
		return c
	}
	if ts.empty == nil {
		ts.empty = make(chan struct{})
	}
	return ts.empty
}

func (ts *tunnelSet) all() []*tunnel {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	out := make([]*tunnel, 0, len(ts.open))
	for t := range ts.open {
		out = append(out, t)
	}
	return out
}

// tunnel is one upgraded connection pair.
type tunnel struct {
	stats   *tunnelCounters
	set     *tunnelSet
	up      net.Conn
	release func() // gives the upstream connection back to its pool (closed)
	head    []byte // the 101 response head for the client
	pre     []byte // upstream bytes read past the 101 head
	idle    time.Duration
	last    atomic.Int64 // mono time of the last byte either way
	guard   *time.Timer  // ends the tunnel if the hijack never happens
	closing atomic.Bool  // closeBoth ran: pumps stop at their next error
	cc      *eofConn     // the client connection, to leave the listener's count (nil in tests)

	mu      sync.Mutex
	client  net.Conn
	started bool
	ended   bool
	counted bool // its end was counted as idle or drained
}

// TunnelRoom implements exchange.Front: a tunnel could start now; a
// false answer is counted as a refused upgrade.
func (r *request) TunnelRoom() bool {
	l := r.l
	if l.tun.n.Load() >= int64(l.cfg.MaxTunnels) {
		l.stats.tun.refused.Add(1)
		return false
	}
	return true
}

// Tunnel implements exchange.Front: it takes a place among the
// listener's tunnels, writes down the client's 101 and stages the client
// connection for ctx.Hijack. exchange.ErrNoTunnel: max_tunnels are open.
func (r *request) Tunnel(et *exchange.Tunnel) error {
	l := r.l
	if !l.tun.reserve(l.cfg.MaxTunnels) {
		l.stats.tun.refused.Add(1)
		return exchange.ErrNoTunnel
	}
	t := &tunnel{stats: &l.stats.tun, set: &l.tun, up: et.Conn, release: et.Release, pre: et.Pre, idle: l.cfg.TunnelIdleTimeout}
	t.cc = r.conn
	t.head = head101(et)
	t.last.Store(int64(clock.Mono()))
	l.tun.add(t)
	l.stats.tun.opened.Add(1)
	// fasthttp skips the hijack handler only when it fails to set the
	// connection's deadline; the guard then frees the upstream side.
	t.guard = time.AfterFunc(l.cfg.ReadTimeout, t.abandon)
	r.ctx.HijackSetNoResponse(true)
	r.ctx.Hijack(t.run)
	return nil
}

// head101 is the client's 101 head: the fields the exchange chose, then
// Connection: Upgrade and the protocol.
func head101(et *exchange.Tunnel) []byte {
	b := append([]byte(nil), statusLine101...)
	for _, f := range et.Fields {
		b = append(b, f.Name...)
		b = append(b, ": "...)
		b = append(b, f.Value...)
		b = append(b, "\r\n"...)
	}
	b = append(b, "Connection: Upgrade\r\nUpgrade: "...)
	b = append(b, et.Upgrade...)
	b = append(b, "\r\n\r\n"...)
	return b
}

// run is the hijack handler: it writes the 101 and relays until the end.
func (t *tunnel) run(c net.Conn) {
	t.guard.Stop()
	t.mu.Lock()
	if t.ended {
		t.mu.Unlock()
		return
	}
	t.client, t.started = c, true
	t.mu.Unlock()
	if t.cc != nil {
		// A tunnel counts against max_tunnels, no longer against
		// max_connections (the dataplane's fdlimit.go budgets both).
		t.cc.release()
	}
	// fasthttp releases c for reuse once this handler returns: forget it
	// first (after end), so that a late closeBoth (a drain) never touches
	// a connection that is no longer this tunnel's.
	defer func() {
		t.mu.Lock()
		t.client = nil
		t.mu.Unlock()
	}()
	defer t.end()
	_ = c.SetWriteDeadline(time.Now().Add(t.idle))
	if _, err := c.Write(t.head); err != nil {
		return
	}
	if len(t.pre) > 0 {
		if _, err := c.Write(t.pre); err != nil {
			return
		}
		t.stats.bytesOut.Add(uint64(len(t.pre)))
	}
	// Either side's end of stream or error ends the tunnel at once: the
	// pump that meets it closes both sides, so that the other pump,
	// blocked on a peer that may stay silent until tunnel_idle_timeout,
	// returns now and the client connection is closed behind it.
	done := make(chan struct{})
	go func() {
		defer close(done)
		t.pump(c, t.up, &t.stats.bytesOut)
		t.closeBoth()
	}()
	t.pump(t.up, c, &t.stats.bytesIn)
	t.closeBoth()
	<-done
}

var tunnelBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// pump copies src to dst until either fails, counting into n. A read
// that times out while the other direction moved within the idle timeout
// goes on; otherwise the tunnel is idle and ends.
func (t *tunnel) pump(dst, src net.Conn, n *atomic.Uint64) {
	bp := tunnelBufs.Get().(*[]byte)
	defer tunnelBufs.Put(bp)
	buf := *bp
	for !t.closing.Load() {
		_ = src.SetReadDeadline(time.Now().Add(t.idle))
		k, err := src.Read(buf)
		if k > 0 {
			t.last.Store(int64(clock.Mono()))
			_ = dst.SetWriteDeadline(time.Now().Add(t.idle))
			if _, werr := dst.Write(buf[:k]); werr != nil {
				return
			}
			n.Add(uint64(k))
		}
		if err != nil {
			if isTimeout(err) && !t.closing.Load() {
				if since := clock.Mono() - time.Duration(t.last.Load()); since < t.idle {
					continue
				}
				t.markIdle()
			}
			return
		}
	}
}

func (t *tunnel) markIdle() {
	t.mu.Lock()
	first := !t.ended && !t.counted
	t.counted = true
	t.mu.Unlock()
	if first {
		t.stats.idle.Add(1)
	}
}

// closeBoth closes the upstream connection and unblocks the client
// side. fasthttp's hijacked connection ignores Close (the server closes it
// when the handler returns), so a deadline in the past is what ends a read
// or write blocked on it.
func (t *tunnel) closeBoth() {
	t.closing.Store(true)
	_ = t.up.Close()
	// Under t.mu: run clears t.client under it before fasthttp takes the
	// connection back, so c is still this tunnel's while it is used here
	// (neither call blocks).
	t.mu.Lock()
	if c := t.client; c != nil {
		_ = c.SetDeadline(time.Unix(1, 0))
		_ = c.Close()
	}
	t.mu.Unlock()
}

// end releases the tunnel once.
func (t *tunnel) end() {
	t.mu.Lock()
	if t.ended {
		t.mu.Unlock()
		return
	}
	t.ended = true
	t.mu.Unlock()
	t.closeBoth()
	t.release()
	t.set.remove(t)
	t.stats.closed.Add(1)
}

// abandon ends a tunnel whose client side never arrived.
func (t *tunnel) abandon() {
	t.mu.Lock()
	started := t.started
	t.mu.Unlock()
	if !started {
		t.end()
	}
}

// DrainTunnels lets the listener's open tunnels run until ctx ends (the
// shutdown grace period), then cuts the rest.
func (l *Listener) DrainTunnels(ctx context.Context) {
	select {
	case <-l.tun.waitEmpty():
		return
	case <-ctx.Done():
	}
	cut := l.tun.all()
	for _, t := range cut {
		t.mu.Lock()
		counted := t.counted
		t.counted = true
		t.mu.Unlock()
		if !counted {
			l.stats.tun.drained.Add(1)
		}
		t.closeBoth()
		if !t.startedNow() {
			t.end()
		}
	}
	if len(cut) > 0 {
		l.log.Info().Str("listener", l.cfg.Name).Int("tunnels", len(cut)).Msg("shutdown grace period over; open tunnels closed")
	}
}

func (t *tunnel) startedNow() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.started
}
