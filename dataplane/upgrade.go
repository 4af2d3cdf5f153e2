package dataplane

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/dataplane/internal/clock"
	"github.com/zentinelproxy/sidecar/dataplane/internal/upstream"
)

// Upgrade requests (WebSocket and any other Connection: upgrade
// protocol) go through the agents like every request: RequestHeaders
// shows the upgrade and connection headers, and a block is answered
// without contacting the upstream. The request is forwarded with
// Connection: upgrade and its Upgrade header; when the upstream answers
// 101 the client gets that 101 (the upstream's headers minus hop-by-hop
// ones) and from then on the bytes are relayed both ways, uninspected:
// the agents see no frames, no response event and no body. Any other
// answer is an ordinary response, and the upstream connection is not
// reused.
//
// Only a bodiless GET over HTTP/1.1 whose Connection lists upgrade (and
// not close) and that has an Upgrade header naming no HTTP version (h2c,
// h2, HTTP/…: requests inside such a tunnel would bypass the agents) is
// an upgrade; anything else loses both headers as before (hop-by-hop).
// A tunnel ends when either side closes or fails (the other side is
// closed at once), when no byte went either way for
// tunnel_idle_timeout, or at shutdown once the grace period is over.
// Tunnels are capped per listener (max_tunnels, 503 past it; with
// max_connections within the descriptor budget, fdlimit.go); a tunnel's
// client connection leaves the listener's max_connections count when
// the tunnel starts. A tunnel holds its upstream connection against the
// upstream's max_conns until it ends.

var (
	hdrConnection = []byte("Connection")
	hdrUpgrade    = []byte("Upgrade")
	valueUpgrade  = []byte("Upgrade")
	statusLine101 = []byte("HTTP/1.1 101 Switching Protocols\r\n")
)

type tunnelCounters struct {
	opened, closed, refused, idle, drained, bytesIn, bytesOut atomic.Uint64
}

func (c *tunnelCounters) snapshot() TunnelStats {
	st := TunnelStats{
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
	srv     *Server
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

// prepareUpgrade decides whether the request is an upgrade and, when it
// is, puts Connection: upgrade and its Upgrade header back on the
// upstream request (prepareRequest removed them as hop-by-hop). It
// returns false when the upgrade is refused (a 503 is staged).
func (rs *reqState) prepareUpgrade() bool {
	h := &rs.ctx.Request.Header
	if !h.IsGet() || !h.IsHTTP11() || rs.hasReqBody || rs.closeConn {
		return true
	}
	// Upgrade first: an ordinary request has none, and each Peek is a
	// scan of the headers.
	up := h.PeekBytes(hdrUpgrade)
	if len(up) == 0 {
		return true
	}
	if !hasToken(h.PeekBytes(hdrConnection), "upgrade") || !validHeaderValue(up) || carriesHTTP(up) {
		return true
	}
	l := rs.lst
	if l.tun.n.Load() >= int64(l.cfg.MaxTunnels) {
		rs.srv.stats.tun.refused.Add(1)
		rs.local(fasthttp.StatusServiceUnavailable, "service unavailable", "too many tunnels")
		return false
	}
	rs.upgrade = true
	rs.hdr = append(rs.hdr, hkv{name: hdrConnection, value: valueUpgrade}, hkv{name: hdrUpgrade, value: up})
	rs.viewDirty = true
	return true
}

// carriesHTTP reports an Upgrade list that names HTTP itself (h2c, h2,
// HTTP/2.0 …): a tunnel for it would carry requests that no agent sees.
// Such a request goes on as an ordinary one, without the upgrade.
func carriesHTTP(up []byte) bool {
	for len(up) > 0 {
		var t []byte
		t, up = nextToken(up)
		// protocol-name ["/" protocol-version]
		for i, c := range t {
			if c == '/' {
				t = t[:i]
				break
			}
		}
		if foldEq(t, "h2c") || foldEq(t, "h2") || foldEq(t, "http") {
			return true
		}
	}
	return false
}

// validHeaderValue reports a value free of CR, LF and NUL (fasthttp
// already refuses them in a head; this keeps the 101 writer honest).
func validHeaderValue(v []byte) bool {
	for _, c := range v {
		if c == '\r' || c == '\n' || c == 0 {
			return false
		}
	}
	return true
}

// errUnaskedSwitch is an upstream's 101 to a request that asked for no
// upgrade: relaying it would leave the client and the proxy disagreeing
// about what the connection carries.
var errUnaskedSwitch = errors.New("upstream answered 101 Switching Protocols to a request without an upgrade")

// upgraded handles the upstream's answer to an upgrade request, or a 101
// to any other. It reports whether the request goes on as an ordinary
// response.
func (rs *reqState) upgraded() bool {
	rs.upClose = true // after an upgrade attempt the connection is not reused
	if rs.upResp.StatusCode() != fasthttp.StatusSwitchingProtocols {
		return true // the upstream refused the upgrade: relay its answer
	}
	if !rs.upgrade {
		return rs.upstreamFailed(errUnaskedSwitch)
	}
	return rs.tunnel()
}

// tunnel takes over after a 101 from the upstream: it detaches the
// upstream connection from the request, stages the client side for
// ctx.Hijack and registers the tunnel. It always returns false (no
// response body streams through the request path).
func (rs *reqState) tunnel() bool {
	s, l := rs.srv, rs.lst
	rs.mu.Lock()
	conn := rs.upNet
	rs.upNet = nil
	gone := rs.cancelErr != nil
	rs.mu.Unlock()
	cc, br, ep := rs.upCC, rs.upBR, rs.upEP
	rs.upCC, rs.upBR, rs.upEP = nil, nil, nil
	_ = rs.upResp.CloseBodyStream()
	hc := ep.Client()
	// Bytes the upstream sent after its head are already in the reader,
	// which reads through rs.upWrap (pooled with rs): copy them out.
	var pre []byte
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		pre = append([]byte(nil), b...)
	}
	hc.ReleaseReader(br)
	// The tunnel counts as in flight on its endpoint until it ends.
	release := func() {
		upstream.PutConn(cc, hc.ReleaseConn, hc.CloseConn, true)
		ep.End()
	}
	if gone || conn == nil {
		release()
		rs.outcome = "client gone"
		return false
	}
	if !l.tun.reserve(l.cfg.MaxTunnels) {
		release()
		s.stats.tun.refused.Add(1)
		rs.local(fasthttp.StatusServiceUnavailable, "service unavailable", "too many tunnels")
		return false
	}
	t := &tunnel{srv: s, set: &l.tun, up: conn, release: release, pre: pre, idle: l.cfg.TunnelIdleTimeout}
	t.cc, _ = rs.conn.(*eofConn)
	t.head = rs.head101()
	t.last.Store(int64(clock.Mono()))
	l.tun.add(t)
	s.stats.tun.opened.Add(1)
	// fasthttp skips the hijack handler only when it fails to set the
	// connection's deadline; the guard then frees the upstream side.
	t.guard = time.AfterFunc(l.cfg.ReadTimeout, t.abandon)
	rs.status = fasthttp.StatusSwitchingProtocols
	rs.outcome = "upgraded"
	rs.ctx.HijackSetNoResponse(true)
	rs.ctx.Hijack(t.run)
	return false
}

// head101 is the client's 101 head: the upstream's headers minus the
// hop-by-hop ones, then Connection: Upgrade and the upstream's Upgrade.
func (rs *reqState) head101() []byte {
	h := &rs.upResp.Header
	b := append([]byte(nil), statusLine101...)
	upg := h.PeekBytes(hdrUpgrade)
	if len(upg) == 0 || !validHeaderValue(upg) {
		upg = rs.ctx.Request.Header.PeekBytes(hdrUpgrade)
	}
	for k, v := range h.All() {
		if hopName(k) || foldEq(k, "content-length") {
			continue
		}
		b = append(b, k...)
		b = append(b, ": "...)
		b = append(b, v...)
		b = append(b, crlf...)
	}
	b = append(b, "Connection: Upgrade\r\nUpgrade: "...)
	b = append(b, upg...)
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
		// max_connections (fdlimit.go budgets both).
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
		t.srv.stats.tun.bytesOut.Add(uint64(len(t.pre)))
	}
	// Either side's end of stream or error ends the tunnel at once: the
	// pump that meets it closes both sides, so that the other pump,
	// blocked on a peer that may stay silent until tunnel_idle_timeout,
	// returns now and the client connection is closed behind it.
	done := make(chan struct{})
	go func() {
		defer close(done)
		t.pump(c, t.up, &t.srv.stats.tun.bytesOut)
		t.closeBoth()
	}()
	t.pump(t.up, c, &t.srv.stats.tun.bytesIn)
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
		t.srv.stats.tun.idle.Add(1)
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
	t.srv.stats.tun.closed.Add(1)
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

// drainTunnels lets open tunnels run until ctx ends (the shutdown grace
// period), then cuts the rest.
func (s *Server) drainTunnels(ctx context.Context) {
	for _, l := range s.lsts {
		select {
		case <-l.tun.waitEmpty():
			continue
		case <-ctx.Done():
		}
		cut := l.tun.all()
		for _, t := range cut {
			t.mu.Lock()
			counted := t.counted
			t.counted = true
			t.mu.Unlock()
			if !counted {
				s.stats.tun.drained.Add(1)
			}
			t.closeBoth()
			if !t.startedNow() {
				t.end()
			}
		}
		if len(cut) > 0 {
			s.log.Info().Str("listener", l.cfg.Name).Int("tunnels", len(cut)).Msg("shutdown grace period over; open tunnels closed")
		}
	}
}

func (t *tunnel) startedNow() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.started
}
