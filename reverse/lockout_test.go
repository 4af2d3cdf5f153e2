package reverse

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

// TestValidTokenNotHeldBehindFlood: a flood of bad-token registrations from
// one address (loopback, as from a NAT) is held back by the slow-down, and
// meanwhile agents with the right token register from the same address at
// once, under the flooded agent_id and another. The flood's penalty stays
// in force throughout: none of its held answers is sent before the good
// agents are serving, and its next failure is held back too. A failure of
// another agent_id from the same address is not slowed by the flood.
func TestValidTokenNotHeldBehindFlood(t *testing.T) {
	cfg := testConfig(t)
	cfg.UnixPath = ""
	cfg.TCPAddr = "127.0.0.1:0"
	// Held failures wait until the listener closes: whatever is answered
	// during the test was answered without waiting for the penalty.
	cfg.FailureDelay = time.Hour
	cfg.MaxFailureDelay = time.Hour
	l := startListener(t, cfg)
	addr := l.TCPAddr().String()

	// A first failure is answered at once and arms the penalty.
	c := dialRaw(t, "tcp", addr)
	c.send(protocol.TypeRegistrationRequest, regReq("waf-1", "guess-0"))
	if _, r := c.answer(); r.Accepted || r.Error != ReasonAuth {
		t.Fatalf("first bad registration: %+v", r)
	}
	if d := l.Stats().Delayed; d != 0 {
		t.Fatalf("delayed %d after the first failure", d)
	}

	// The flood: every further failure of waf-1 from this address is held.
	const flood = 8
	var answered atomic.Int64
	var wg sync.WaitGroup
	badRegistration := func(i int) {
		defer wg.Done()
		nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Errorf("flood dial: %v", err)
			return
		}
		defer nc.Close()
		if err := uds.WriteFrame(nc, regReq("waf-1", fmt.Sprintf("guess-%d", i))); err != nil {
			t.Errorf("flood write: %v", err)
			return
		}
		// Held until the listener closes (the test's end); an answer
		// before that would be a failure answered without its penalty.
		_ = nc.SetReadDeadline(time.Now().Add(time.Minute))
		if _, _, err := uds.NewFrameReader(nc).Next(); err == nil {
			answered.Add(1)
		}
	}
	for i := 1; i <= flood; i++ {
		wg.Add(1)
		go badRegistration(i)
	}
	testutil.WaitFor(t, "the flood to be held back", func() bool { return l.Stats().Delayed == flood })

	// The right token under the flooded id is accepted at once.
	good := dialRaw(t, "tcp", addr)
	good.send(protocol.TypeRegistrationRequest, regReq("waf-1", testToken))
	if _, r := good.answer(); !r.Accepted {
		t.Fatalf("good registration of waf-1 during the flood refused: %q", r.Error)
	}
	// It serves no requests: take it out of the pool again.
	testutil.WaitFor(t, "waf-1 to serve", func() bool { return l.Stats().Active == 1 })
	_ = good.nc.Close()
	testutil.WaitFor(t, "waf-1 to leave", func() bool { return l.Stats().Active == 0 })
	// An SDK agent under another id is accepted too, and serves requests.
	runAgent(t, addr, "waf-2", testToken, newHandler("waf-2"), nil)
	a := l.Agent("waf")
	testutil.WaitFor(t, "waf-2 to register", func() bool { return l.Stats().Active == 1 })
	if _, err := call(context.Background(), a); err != nil {
		t.Fatalf("request through the pool: %v", err)
	}

	// The flood's penalty is still in force: nothing of it answered, and
	// the good registrations were not held.
	if n := answered.Load(); n != 0 {
		t.Fatalf("%d held failures answered before the listener closed", n)
	}
	if s := l.Stats(); s.Delayed != flood || s.Accepted != 2 {
		t.Fatalf("delayed %d accepted %d; want %d and 2", s.Delayed, s.Accepted, flood)
	}
	// Success does not reset it: the next failure of waf-1 is held too.
	wg.Add(1)
	go badRegistration(flood + 1)
	testutil.WaitFor(t, "the next failure to be held back", func() bool { return l.Stats().Delayed == flood+1 })

	// A failure of another id from the same address is not slowed by
	// waf-1's failures: its first failure is answered at once.
	other := dialRaw(t, "tcp", addr)
	other.send(protocol.TypeRegistrationRequest, regReq("waf-3", "wrong"))
	if _, r := other.answer(); r.Accepted || r.Error != ReasonAuth {
		t.Fatalf("bad registration of waf-3: %+v", r)
	}
	if s := l.Stats(); s.Delayed != flood+1 || s.RejectedAuth != flood+3 {
		t.Errorf("delayed %d rejected_auth %d; want %d and %d", s.Delayed, s.RejectedAuth, flood+1, flood+3)
	}
	if n := answered.Load(); n != 0 {
		t.Errorf("%d held failures answered before the listener closed", n)
	}

	// Closing the listener ends the held connections unanswered.
	_ = l.Close()
	wg.Wait()
	if n := answered.Load(); n != 0 {
		t.Errorf("%d held failures answered at close", n)
	}
}

// TestRefusalHidesUnknownID: an unknown agent_id and a bad token are
// refused with byte-identical frames (in both answer frame types), so the
// answer does not tell which ids exist; the proxy's own counters still
// tell them apart. Both count as failures of their (peer, agent_id): the
// second attempt of each is held back alike.
func TestRefusalHidesUnknownID(t *testing.T) {
	cfg := testConfig(t)
	l := startListener(t, cfg)
	refusal := func(typ protocol.MsgType, id, token string) []byte {
		t.Helper()
		c := dialRaw(t, "unix", cfg.UnixPath)
		c.send(typ, regReq(id, token))
		b, err := io.ReadAll(c.nc)
		_ = c.nc.Close()
		if err != nil {
			t.Fatalf("reading refusal of %s: %v", id, err)
		}
		return b
	}
	for _, typ := range []protocol.MsgType{protocol.TypeRegistrationRequest, protocol.TypeHandshakeRequest} {
		badToken := refusal(typ, "waf-1", "wrong")
		for _, tc := range []struct{ id, token string }{
			{"ids-1", "wrong"},       // unknown id, wrong token
			{"ids-1", testToken},     // unknown id, a real token
			{"ids-2", ""},            // unknown id, no token
			{"waf-1", ""},            // known id, no token
			{"waf-1", testToken[:4]}, // known id, a prefix of its token
		} {
			if got := refusal(typ, tc.id, tc.token); !bytes.Equal(got, badToken) {
				t.Errorf("type %s: refusal of %s differs from a bad token's:\n got %q\nwant %q", typ, tc.id, got, badToken)
			}
		}
	}
	s := l.Stats()
	if s.RejectedUnknown != 6 || s.RejectedAuth != 6 {
		t.Errorf("rejected unknown %d auth %d; want 6 and 6", s.RejectedUnknown, s.RejectedAuth)
	}
	// Per (peer, agent_id): ids-1 failed 4 times, ids-2 twice, waf-1 six
	// times; every failure after the first of its id was held back.
	if s.Delayed != 3+1+5 {
		t.Errorf("delayed %d, want 9", s.Delayed)
	}
}

// TestRefusalLogNamesCauseNotToken: the proxy's log tells an unknown id
// from a bad token, and never contains a token, offered or configured.
func TestRefusalLogNamesCauseNotToken(t *testing.T) {
	cfg := testConfig(t)
	var logs testutil.LogBuffer
	l, err := NewListener(cfg, zerolog.New(&logs).Level(zerolog.DebugLevel))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.Serve(context.Background()) }()
	for _, r := range []struct{ id, token string }{
		{"ids-1", "offered-token-one"},
		{"waf-1", "offered-token-two"},
		{"ids-2", testToken},
		{"waf-1", testToken},
	} {
		c := dialRaw(t, "unix", cfg.UnixPath)
		c.send(protocol.TypeRegistrationRequest, regReq(r.id, r.token))
		c.answer()
		_ = c.nc.Close()
	}
	_ = l.Close() // waits for every connection's goroutine: all is logged
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	for _, want := range []string{`"reason":"unknown agent"`, `"reason":"authentication failed"`, `"agent_id":"ids-1"`, `"agent_id":"waf-1"`} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %s:\n%s", want, out)
		}
	}
	for _, secret := range []string{"offered-token-one", "offered-token-two", testToken} {
		if strings.Contains(out, secret) {
			t.Errorf("log contains the token %q:\n%s", secret, out)
		}
	}
}
