package reverse

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

// tiers is the pending table's census (silent, receiving, being judged).
func (l *Listener) tiers() [3]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, r, j := l.pending.counts()
	return [3]int{s, r, j}
}

// halfRegistration is the first half of a valid registration frame.
func halfRegistration(t *testing.T) []byte {
	b, err := uds.AppendFrame(nil, regReq("waf-1", testToken))
	if err != nil {
		t.Fatal(err)
	}
	return b[:len(b)/2]
}

// evictedConn asserts that the listener closed c without an answer.
func (c *rawConn) evicted() {
	c.t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if b, err := io.ReadAll(c.nc); len(b) != 0 || isTimeout(err) {
		c.t.Fatalf("expected the connection closed without an answer; read %q, %v", b, err)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// TestPendingPerPeerEviction: at max_pending_per_peer a newcomer from the
// same peer is let in and a connection that has sent nothing gives way,
// even one newer than a connection half way through its registration;
// that one gives way only when no silent one is left, and then the
// oldest receiving goes first. The one that gave way is closed without an
// answer and counted; everything else registers.
func TestPendingPerPeerEviction(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxPendingPerPeer = 2
	cfg.RegistrationTimeout = time.Minute
	l := startListener(t, cfg)

	partial := dialRaw(t, "unix", cfg.UnixPath)
	half := halfRegistration(t)
	partial.sendRaw(half)
	testutil.WaitFor(t, "a receiving connection", func() bool { return l.tiers() == [3]int{0, 1, 0} })
	silent := dialRaw(t, "unix", cfg.UnixPath)
	testutil.WaitFor(t, "a silent one beside it", func() bool { return l.tiers() == [3]int{1, 1, 0} })

	// A third from the same peer (a Unix user): the silent one gives way,
	// not the older one that is receiving.
	newcomer := dialRaw(t, "unix", cfg.UnixPath)
	silent.evicted()
	newcomer.send(protocol.TypeRegistrationRequest, regReq("waf-2", testToken))
	if _, r := newcomer.answer(); !r.Accepted {
		t.Fatalf("newcomer: %q", r.Error)
	}
	// The newcomer leaves the table just after its answer.
	testutil.WaitFor(t, "one registering", func() bool { return l.Stats().Pending == 1 })
	if s := l.Stats(); s.Evicted != 1 || s.Busy != 0 {
		t.Fatalf("after the first newcomer: %+v", s)
	}

	// Two receiving, none silent: a newcomer closes the older of them.
	partial2 := dialRaw(t, "unix", cfg.UnixPath)
	partial2.sendRaw(half)
	testutil.WaitFor(t, "two receiving", func() bool { return l.tiers() == [3]int{0, 2, 0} })
	last := dialRaw(t, "unix", cfg.UnixPath)
	partial.evicted()
	last.send(protocol.TypeRegistrationRequest, regReq("waf-3", testToken))
	if _, r := last.answer(); !r.Accepted {
		t.Fatalf("last newcomer: %q", r.Error)
	}
	// The younger partial registration survived and completes.
	b, _ := uds.AppendFrame(nil, regReq("waf-1", testToken))
	partial2.sendRaw(b[len(half):])
	if _, r := partial2.answer(); !r.Accepted {
		t.Fatalf("the younger partial registration: %q", r.Error)
	}
	if s := l.Stats(); s.Evicted != 2 || s.Busy != 0 || s.Accepted != 3 || s.Timeouts != 0 || s.Aborted != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestPendingEvictionAcrossPeers: at max_pending in all, a newcomer from
// another address is let in and the oldest silent connection of any peer
// gives way.
func TestPendingEvictionAcrossPeers(t *testing.T) {
	cfg := floodTCPConfig(t)
	cfg.MaxPending = 2
	cfg.MaxPendingPerPeer = 2
	l := startListener(t, cfg)
	addr := l.TCPAddr().String()
	dial := func(ip string) *rawConn {
		nc, err := dialFrom(ip, addr)
		if err != nil {
			t.Skipf("cannot dial from %s: %v", ip, err)
		}
		t.Cleanup(func() { _ = nc.Close() })
		_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
		return &rawConn{t: t, nc: nc, fr: uds.NewFrameReader(nc)}
	}
	silent := dial("127.0.0.1")
	testutil.WaitFor(t, "a silent connection", func() bool { return l.tiers() == [3]int{1, 0, 0} })
	partial := dial("127.0.0.2")
	partial.sendRaw(halfRegistration(t))
	testutil.WaitFor(t, "and a receiving one", func() bool { return l.tiers() == [3]int{1, 1, 0} })

	newcomer := dial("127.0.0.3")
	silent.evicted()
	newcomer.send(protocol.TypeRegistrationRequest, regReq("waf-2", testToken))
	if _, r := newcomer.answer(); !r.Accepted {
		t.Fatalf("newcomer: %q", r.Error)
	}
	testutil.WaitFor(t, "one registering", func() bool { return l.Stats().Pending == 1 })
	if s := l.Stats(); s.Evicted != 1 || s.Busy != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestAdmissionBusy: a newcomer is turned away (busy) only when every
// connection of its scope is being judged; the table's counts follow.
func TestAdmissionBusy(t *testing.T) {
	a := newAdmission(3, 2)
	conn := func(peer string) *pconn { return &pconn{peer: peer} }
	p1, p2 := conn("a"), conn("a")
	for _, pc := range []*pconn{p1, p2} {
		if v, ok := a.admit(pc); !ok || v != nil {
			t.Fatalf("admit under the limits: %v %v", v, ok)
		}
		a.move(pc, tierJudged)
	}
	if v, ok := a.admit(conn("a")); ok || v != nil {
		t.Fatalf("peer a full of connections being judged: admitted (victim %v)", v)
	}
	// Another peer still fits under max_pending.
	b1 := conn("b")
	if _, ok := a.admit(b1); !ok {
		t.Fatal("peer b refused")
	}
	a.move(b1, tierJudged)
	if _, ok := a.admit(conn("c")); ok {
		t.Fatal("admitted over max_pending with every connection being judged")
	}
	// A connection that leaves (registered or refused) frees its slot.
	if !a.remove(p1) || a.remove(p1) {
		t.Fatal("remove: want true once, then false")
	}
	c1 := conn("c")
	if v, ok := a.admit(c1); !ok || v != nil {
		t.Fatalf("after a slot was freed: %v %v", v, ok)
	}
	if s, r, j := a.counts(); s != 0 || r != 1 || j != 2 || a.n != 3 || len(a.peers) != 3 || len(a.all) != 3 {
		t.Fatalf("counts %d %d %d, n %d, peers %d", s, r, j, a.n, len(a.peers))
	}
	// Silent goes first, whatever its age.
	a.move(c1, tierSilent)
	d1 := conn("d")
	if v, ok := a.admit(d1); !ok || v != c1 || !c1.evicted || a.move(c1, tierReceiving) {
		t.Fatalf("eviction of the silent one: victim %v ok %v", v, ok)
	}
}

// TestRefusalsOutsidePendingAndBounded: refusals held back by the failure
// slow-down do not count as registering, and at most max_refusing
// refused connections are held open: one more that was to wait is closed
// at once without an answer, one answered at once is still answered (but
// not drained). A valid registration goes through meanwhile.
func TestRefusalsOutsidePendingAndBounded(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxPendingPerPeer = 2
	cfg.MaxRefusing = 2
	cfg.FailureDelay = time.Hour // held until the listener closes
	cfg.MaxFailureDelay = time.Hour
	l := startListener(t, cfg)

	first := dialRaw(t, "unix", cfg.UnixPath)
	first.send(protocol.TypeRegistrationRequest, regReq("waf-1", "guess-0"))
	if _, r := first.answer(); r.Accepted || r.Error != ReasonAuth {
		t.Fatalf("first failure: %+v", r)
	}
	_ = first.nc.Close()
	testutil.WaitFor(t, "the first refusal drained", func() bool { return l.Stats().Refusing == 0 })

	var held []*rawConn
	for i := 1; i <= 2; i++ {
		c := dialRaw(t, "unix", cfg.UnixPath)
		c.send(protocol.TypeRegistrationRequest, regReq("waf-1", "guess"))
		held = append(held, c)
	}
	testutil.WaitFor(t, "two refusals held", func() bool { s := l.Stats(); return s.Refusing == 2 && s.Delayed == 2 })
	if s := l.Stats(); s.Pending != 0 {
		t.Fatalf("held refusals count as registering: %+v", s)
	}

	over := dialRaw(t, "unix", cfg.UnixPath)
	over.send(protocol.TypeRegistrationRequest, regReq("waf-1", "guess"))
	over.evicted() // closed at once, no answer
	version := dialRaw(t, "unix", cfg.UnixPath)
	req := regReq("waf-1", testToken)
	req.ProtocolVersion = 3
	version.send(protocol.TypeRegistrationRequest, req)
	if _, r := version.answer(); r.Accepted || r.Error != "unsupported protocol version: proxy speaks 2" {
		t.Fatalf("version refusal with no room to drain: %+v", r)
	}
	good := dialRaw(t, "unix", cfg.UnixPath)
	good.send(protocol.TypeRegistrationRequest, regReq("waf-2", testToken))
	if _, r := good.answer(); !r.Accepted {
		t.Fatalf("valid registration: %q", r.Error)
	}
	s := l.Stats()
	if s.Unheld != 2 || s.Refusing != 2 || s.Delayed != 2 || s.RejectedAuth != 4 || s.Accepted != 1 {
		t.Fatalf("stats %+v", s)
	}
	for _, c := range held {
		_ = c.nc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, _, err := c.fr.Next(); !isTimeout(err) {
			t.Fatalf("a held refusal was answered or closed: %v", err)
		}
	}
}
