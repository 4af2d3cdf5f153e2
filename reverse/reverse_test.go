package reverse

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

func TestRegistration(t *testing.T) {
	cfg := testConfig(t)
	cfg.Agents = append(cfg.Agents, AgentConfig{Name: "open", IDs: []string{"open"}, AllowNoToken: true})
	l := startListener(t, cfg)

	bigLen := []byte{0, 1, 0, 1, byte(protocol.TypeRegistrationRequest)} // 65537 > 64 KiB
	cases := []struct {
		name     string
		send     func(c *rawConn)
		answered bool
		respType protocol.MsgType
		accepted bool
		reason   string
		stat     func(Stats) uint64
	}{
		{
			name:     "accepted",
			send:     func(c *rawConn) { c.send(protocol.TypeRegistrationRequest, regReq("waf-1", testToken)) },
			answered: true, respType: protocol.TypeRegistrationResponse, accepted: true,
			stat: func(s Stats) uint64 { return s.Accepted },
		},
		{
			name:     "accepted in a handshake frame, answered in 0x02",
			send:     func(c *rawConn) { c.send(protocol.TypeHandshakeRequest, regReq("waf-2", testToken)) },
			answered: true, respType: protocol.TypeHandshakeResponse, accepted: true,
			stat: func(s Stats) uint64 { return s.Accepted },
		},
		{
			name:     "no token where none is needed",
			send:     func(c *rawConn) { c.send(protocol.TypeRegistrationRequest, regReq("open", "")) },
			answered: true, respType: protocol.TypeRegistrationResponse, accepted: true,
			stat: func(s Stats) uint64 { return s.Accepted },
		},
		{
			name:     "bad token",
			send:     func(c *rawConn) { c.send(protocol.TypeRegistrationRequest, regReq("waf-1", "wrong")) },
			answered: true, respType: protocol.TypeRegistrationResponse, reason: ReasonAuth,
			stat: func(s Stats) uint64 { return s.RejectedAuth },
		},
		{
			name:     "missing token",
			send:     func(c *rawConn) { c.send(protocol.TypeRegistrationRequest, regReq("waf-1", "")) },
			answered: true, respType: protocol.TypeRegistrationResponse, reason: ReasonAuth,
			stat: func(s Stats) uint64 { return s.RejectedAuth },
		},
		{
			name:     "token of another agent's prefix",
			send:     func(c *rawConn) { c.send(protocol.TypeRegistrationRequest, regReq("waf-1", testToken[:4])) },
			answered: true, respType: protocol.TypeRegistrationResponse, reason: ReasonAuth,
			stat: func(s Stats) uint64 { return s.RejectedAuth },
		},
		{
			name:     "unknown id, answered as a bad token",
			send:     func(c *rawConn) { c.send(protocol.TypeRegistrationRequest, regReq("ids-1", testToken)) },
			answered: true, respType: protocol.TypeRegistrationResponse, reason: ReasonAuth,
			stat: func(s Stats) uint64 { return s.RejectedUnknown },
		},
		{
			name: "wrong version",
			send: func(c *rawConn) {
				r := regReq("waf-1", testToken)
				r.ProtocolVersion = 1
				c.send(protocol.TypeRegistrationRequest, r)
			},
			answered: true, respType: protocol.TypeRegistrationResponse, reason: ReasonVersion,
			stat: func(s Stats) uint64 { return s.RejectedVersion },
		},
		{
			name:     "empty id",
			send:     func(c *rawConn) { c.send(protocol.TypeRegistrationRequest, regReq("", testToken)) },
			answered: true, respType: protocol.TypeRegistrationResponse, reason: ReasonInvalid,
			stat: func(s Stats) uint64 { return s.RejectedInvalid },
		},
		{
			name:     "control character in id",
			send:     func(c *rawConn) { c.send(protocol.TypeRegistrationRequest, regReq("waf-\n1", testToken)) },
			answered: true, respType: protocol.TypeRegistrationResponse, reason: ReasonInvalid,
			stat: func(s Stats) uint64 { return s.RejectedInvalid },
		},
		{
			name:     "garbage payload",
			send:     func(c *rawConn) { c.sendRaw([]byte{0, 0, 0, 6, 0x03, 'h', 'e', 'l', 'l', 'o'}) },
			answered: true, respType: protocol.TypeRegistrationResponse, reason: ReasonInvalid,
			stat: func(s Stats) uint64 { return s.RejectedInvalid },
		},
		{
			name:     "wrong first frame type",
			send:     func(c *rawConn) { c.send(protocol.TypeRequestHeaders, &protocol.RequestHeaders{RequestID: 1}) },
			answered: true, respType: protocol.TypeRegistrationResponse, reason: ReasonFrame,
			stat: func(s Stats) uint64 { return s.BadFrames },
		},
		{
			name: "oversized first frame",
			send: func(c *rawConn) { c.sendRaw(bigLen) },
			stat: func(s Stats) uint64 { return s.BadFrames },
		},
		{
			name: "zero-length first frame",
			send: func(c *rawConn) { c.sendRaw([]byte{0, 0, 0, 0, 0}) },
			stat: func(s Stats) uint64 { return s.BadFrames },
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.stat(l.Stats())
			c := dialRaw(t, "unix", cfg.UnixPath)
			tc.send(c)
			if tc.answered {
				typ, resp := c.answer()
				if typ != tc.respType {
					t.Errorf("answer type %s, want %s", typ, tc.respType)
				}
				if resp.Accepted != tc.accepted {
					t.Fatalf("accepted=%v (error %q), want %v", resp.Accepted, resp.Error, tc.accepted)
				}
				if tc.accepted && !strings.HasPrefix(resp.AssignedID, "conn-") {
					t.Errorf("assigned id %q", resp.AssignedID)
				}
				if !tc.accepted && !strings.HasPrefix(resp.Error, tc.reason) {
					t.Errorf("reason %q, want prefix %q", resp.Error, tc.reason)
				}
				if strings.Contains(resp.Error, testToken) {
					t.Errorf("reason %q reveals the token", resp.Error)
				}
			}
			if !tc.accepted {
				c.closed()
			}
			testutil.WaitFor(t, "counter", func() bool { return tc.stat(l.Stats()) == before+1 })
		})
	}
}

func TestRegistrationTimeout(t *testing.T) {
	cfg := testConfig(t)
	cfg.RegistrationTimeout = 50 * time.Millisecond
	l := startListener(t, cfg)
	c := dialRaw(t, "unix", cfg.UnixPath)
	c.sendRaw([]byte{0, 0}) // half a header, then silence
	c.closed()
	testutil.WaitFor(t, "timeout counter", func() bool { s := l.Stats(); return s.Timeouts == 1 && s.Pending == 0 })
	if s := l.Stats(); s.Accepted != 0 || s.Aborted != 0 {
		t.Errorf("stats after timeout: %+v", s)
	}
}

func TestUnavailableUntilRegistered(t *testing.T) {
	cfg := testConfig(t)
	l := startListener(t, cfg)
	if l.Agent("nope") != nil {
		t.Fatal("Agent of an unconfigured name is not nil")
	}
	a := l.Agent("waf")
	if _, err := a.Begin(agentmux.Wait{}); !errors.Is(err, agentmux.ErrAgentUnavailable) {
		t.Fatalf("Begin without agents: %v, want ErrAgentUnavailable", err)
	}
	h := newHandler("waf-1")
	runAgent(t, cfg.UnixPath, "waf-1", testToken, h, nil)
	testutil.WaitFor(t, "registration", func() bool { return a.Snapshot().Connections == 1 })
	got, err := call(context.Background(), a)
	if err != nil || got != "waf-1" {
		t.Fatalf("call: %q, %v", got, err)
	}
	st := a.Snapshot()
	if st.Transport != Transport || !st.Ready || !st.Caps.HandlesRequestHeaders {
		t.Errorf("snapshot %+v", st)
	}
}

func TestFirstMatchingAgentWins(t *testing.T) {
	cfg := testConfig(t)
	cfg.Agents = []AgentConfig{
		{Name: "waf", IDs: []string{"waf-*"}, Tokens: []string{"t-waf"}},
		{Name: "catchall", IDs: []string{"waf-special", "*"}, Tokens: []string{"t-all"}},
		{Name: "auth", Tokens: []string{"t-auth"}}, // default patterns: auth, auth-*
	}
	l := startListener(t, cfg)
	for _, tc := range []struct{ id, token, agent string }{
		{"waf-special", "t-waf", "waf"},
		{"other", "t-all", "catchall"},
		{"auth-7", "t-all", "catchall"}, // "*" comes first in the order
	} {
		h := newHandler(tc.id)
		stop := runAgent(t, cfg.UnixPath, tc.id, tc.token, h, nil)
		a := l.Agent(tc.agent)
		testutil.WaitFor(t, tc.id+" in "+tc.agent, func() bool { return a.Snapshot().Connections == 1 })
		if got, err := call(context.Background(), a); err != nil || got != tc.id {
			t.Fatalf("%s via %s: %q, %v", tc.id, tc.agent, got, err)
		}
		stop()
		testutil.WaitFor(t, tc.id+" gone", func() bool { return a.Snapshot().Connections == 0 })
	}
	if n := l.Agent("auth").Snapshot().Connections; n != 0 {
		t.Errorf("auth got %d connections", n)
	}
}

// TestLeastInFlight registers three agents and holds 30 requests open:
// each agent must carry exactly a third of them.
func TestLeastInFlight(t *testing.T) {
	cfg := testConfig(t)
	l := startListener(t, cfg)
	a := l.Agent("waf")
	gate := make(chan struct{})
	entered := make(chan string, 64)
	hs := map[string]*testHandler{}
	for _, id := range []string{"waf-1", "waf-2", "waf-3"} {
		h := newHandler(id)
		h.gate, h.entered = gate, entered
		hs[id] = h
		runAgent(t, cfg.UnixPath, id, testToken, h, nil)
	}
	testutil.WaitFor(t, "three connections", func() bool { return a.Snapshot().Connections == 3 })

	const n = 30
	ctx := context.Background()
	results := make(chan string, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		ex, err := a.Begin(agentmux.WaitFor(ctx)) // sequential Begin: each sees the loads left by the last
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer ex.Finish()
			m := protocol.RequestHeaders{Method: []byte("GET"), URI: []byte("/")}
			r, err := ex.RequestHeaders(agentmux.WaitFor(ctx), &m)
			if err != nil {
				results <- "error: " + err.Error()
				return
			}
			results <- string(r.Decision.RequestHeaderOps[0].Value)
		}()
	}
	share := map[string]int{}
	for i := 0; i < n; i++ {
		share[<-entered]++
	}
	if st := a.Snapshot(); st.InFlight != n {
		t.Errorf("in flight %d, want %d", st.InFlight, n)
	}
	close(gate)
	wg.Wait()
	close(results)
	answered := map[string]int{}
	for r := range results {
		answered[r]++
	}
	for id := range hs {
		if share[id] != n/3 || answered[id] != n/3 {
			t.Errorf("%s handled %d and answered %d of %d, want %d", id, share[id], answered[id], n, n/3)
		}
	}
}

// TestAgentKilledMidFlight: one of three agents dies with requests in
// flight; those fail promptly with ErrAgentConnLost, the others complete,
// and the dead connection leaves the pool.
func TestAgentKilledMidFlight(t *testing.T) {
	cfg := testConfig(t)
	l := startListener(t, cfg)
	a := l.Agent("waf")
	gate := make(chan struct{})
	entered := make(chan string, 64)
	stops := map[string]func(){}
	for _, id := range []string{"waf-1", "waf-2", "waf-3"} {
		h := newHandler(id)
		h.gate, h.entered = gate, entered
		stops[id] = runAgent(t, cfg.UnixPath, id, testToken, h, nil)
	}
	testutil.WaitFor(t, "three connections", func() bool { return a.Snapshot().Connections == 3 })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // hang guard only
	defer cancel()
	const n = 12
	type result struct {
		agent string
		err   error
	}
	results := make(chan result, n)
	for i := 0; i < n; i++ {
		ex, err := a.Begin(agentmux.WaitFor(ctx))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			defer ex.Finish()
			m := protocol.RequestHeaders{Method: []byte("GET"), URI: []byte("/")}
			r, err := ex.RequestHeaders(agentmux.WaitFor(ctx), &m)
			if err != nil {
				results <- result{err: err}
				return
			}
			results <- result{agent: string(r.Decision.RequestHeaderOps[0].Value)}
		}()
	}
	for i := 0; i < n; i++ {
		<-entered
	}
	stops["waf-2"]() // the agent's connection closes with 4 requests in its handler

	// The victim's requests fail before the others are released.
	for i := 0; i < n/3; i++ {
		r := <-results
		if !errors.Is(r.err, agentmux.ErrAgentConnLost) {
			t.Fatalf("request on the killed agent: %q, %v; want ErrAgentConnLost", r.agent, r.err)
		}
	}
	testutil.WaitFor(t, "dead connection leaves the pool", func() bool { return a.Snapshot().Connections == 2 })
	close(gate)
	for i := 0; i < n-n/3; i++ {
		r := <-results
		if r.err != nil || (r.agent != "waf-1" && r.agent != "waf-3") {
			t.Fatalf("surviving request: %q, %v", r.agent, r.err)
		}
	}
	// New requests go to the survivors only.
	for i := 0; i < 6; i++ {
		got, err := call(ctx, a)
		if err != nil || got == "waf-2" {
			t.Fatalf("after the kill: %q, %v", got, err)
		}
	}
}

// TestReconnect: the proxy drops an agent's connection; the agent
// registers again (a new assigned id) and serves.
func TestReconnect(t *testing.T) {
	cfg := testConfig(t)
	l := startListener(t, cfg)
	a := l.Agent("waf")
	var mu sync.Mutex
	var ids []string
	h := newHandler("waf-1")
	runAgent(t, cfg.UnixPath, "waf-1", testToken, h, func(c *sdk.ReverseConfig) {
		c.OnRegistered = func(id string) { mu.Lock(); ids = append(ids, id); mu.Unlock() }
	})
	testutil.WaitFor(t, "registration", func() bool { return a.Snapshot().Connections == 1 })
	if _, err := call(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	// Break the connection from the proxy side.
	p := a.(*pool).Pool
	for _, s := range p.Sessions() {
		_ = s.Close()
	}
	testutil.WaitFor(t, "re-registration", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ids) == 2 && a.Snapshot().Connections == 1
	})
	if ids[0] == ids[1] {
		t.Errorf("same assigned id twice: %s", ids[0])
	}
	if got, err := call(context.Background(), a); err != nil || got != "waf-1" {
		t.Fatalf("after reconnect: %q, %v", got, err)
	}
	if s := l.Stats(); s.Accepted != 2 || s.Active != 1 {
		t.Errorf("stats %+v", s)
	}
}

func TestConnectionLimits(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxConnsPerID = 2
	cfg.MaxConnsPerAgent = 3
	l := startListener(t, cfg)
	reg := func(id string) (*rawConn, protocol.RegistrationResponse) {
		c := dialRaw(t, "unix", cfg.UnixPath)
		c.send(protocol.TypeRegistrationRequest, regReq(id, testToken))
		_, resp := c.answer()
		return c, resp
	}
	c1, r := reg("waf-1")
	if !r.Accepted {
		t.Fatal(r.Error)
	}
	if _, r = reg("waf-1"); !r.Accepted {
		t.Fatal(r.Error)
	}
	c3, r := reg("waf-1")
	if r.Accepted || !strings.HasPrefix(r.Error, ReasonIDLimit) {
		t.Fatalf("third connection of waf-1: %+v", r)
	}
	c3.closed()
	if _, r = reg("waf-2"); !r.Accepted {
		t.Fatal(r.Error)
	}
	if _, r = reg("waf-3"); r.Accepted || !strings.HasPrefix(r.Error, ReasonAgentLimit) {
		t.Fatalf("fourth connection of waf: %+v", r)
	}
	// A closed connection frees its slot.
	testutil.WaitFor(t, "three in the pool", func() bool { return l.Agent("waf").Snapshot().Connections == 3 })
	_ = c1.nc.Close()
	testutil.WaitFor(t, "slot freed", func() bool { return l.Agent("waf").Snapshot().Connections == 2 })
	if _, r = reg("waf-1"); !r.Accepted {
		t.Fatalf("after a close: %+v", r)
	}
	s := l.Stats()
	if s.RejectedIDLimit != 1 || s.RejectedAgentLimit != 1 || s.Accepted != 4 {
		t.Errorf("stats %+v", s)
	}
}

func TestTokenSources(t *testing.T) {
	dir := testutil.SocketDir(t)
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("  from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("REVERSE_TEST_TOKEN", "from-env")
	cfg := testConfig(t)
	cfg.Agents = []AgentConfig{
		{Name: "env", TokenEnv: "REVERSE_TEST_TOKEN"},
		{Name: "file", TokenFile: file},
		{Name: "both", Tokens: []string{"old", "new"}, TokenFile: file},
	}
	l := startListener(t, cfg)
	for _, tc := range []struct {
		id, token string
		ok        bool
	}{
		{"env-1", "from-env", true},
		{"env-1", "from-file", false},
		{"file-1", "from-file", true},
		{"file-1", "  from-file\n", false},
		{"both-1", "old", true},
		{"both-1", "new", true},
		{"both-1", "from-file", true},
		{"both-1", "ol", false},
	} {
		c := dialRaw(t, "unix", cfg.UnixPath)
		c.send(protocol.TypeRegistrationRequest, regReq(tc.id, tc.token))
		if _, r := c.answer(); r.Accepted != tc.ok {
			t.Errorf("%s with %q: accepted=%v (%s), want %v", tc.id, tc.token, r.Accepted, r.Error, tc.ok)
		}
		_ = c.nc.Close()
	}
	_ = l

	bad := []struct {
		name string
		a    AgentConfig
		want string
	}{
		{"unset env", AgentConfig{Name: "x", TokenEnv: "REVERSE_TEST_UNSET_TOKEN"}, "REVERSE_TEST_UNSET_TOKEN"},
		{"missing file", AgentConfig{Name: "x", TokenFile: filepath.Join(dir, "nope")}, "token file"},
		{"no token at all", AgentConfig{Name: "x"}, "no token configured"},
	}
	for _, tc := range bad {
		c := testConfig(t)
		c.Agents = []AgentConfig{tc.a}
		_, err := NewListener(c, testLogger(t))
		if !errors.Is(err, ErrReverseConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	empty := filepath.Join(dir, "empty")
	_ = os.WriteFile(empty, []byte("\n"), 0o600)
	c := testConfig(t)
	c.Agents = []AgentConfig{{Name: "x", TokenFile: empty}}
	if _, err := NewListener(c, testLogger(t)); !errors.Is(err, ErrReverseConfig) {
		t.Errorf("empty token file: %v", err)
	}
}

// TestFailureSlowdown counts the held-back answers: a (peer, agent_id)'s
// first failure is answered at once, every later failure waits, a valid
// token is never held back, and a success does not reset the delay.
func TestFailureSlowdown(t *testing.T) {
	cfg := testConfig(t)
	l := startListener(t, cfg)
	try := func(token string) bool {
		c := dialRaw(t, "unix", cfg.UnixPath)
		c.send(protocol.TypeRegistrationRequest, regReq("waf-1", token))
		_, r := c.answer()
		_ = c.nc.Close()
		return r.Accepted
	}
	try("bad")
	if d := l.Stats().Delayed; d != 0 {
		t.Fatalf("delayed %d after the first failure", d)
	}
	try("bad")
	try("bad")
	if d := l.Stats().Delayed; d != 2 {
		t.Fatalf("delayed %d after three failures, want 2", d)
	}
	if !try(testToken) {
		t.Fatal("good token refused")
	}
	if d := l.Stats().Delayed; d != 2 {
		t.Fatalf("the good attempt after failures was held back: delayed %d", d)
	}
	try("bad")
	if d := l.Stats().Delayed; d != 3 {
		t.Fatalf("a success reset the failures: delayed %d", d)
	}
	if !try(testToken) {
		t.Fatal("good token refused")
	}
	if s := l.Stats(); s.RejectedAuth != 4 || s.Accepted != 2 || s.Delayed != 3 {
		t.Errorf("stats %+v", s)
	}
}

func TestFailureTable(t *testing.T) {
	f := newFailures(time.Millisecond, 8*time.Millisecond, time.Minute, 3)
	now := time.Now()
	if d := f.delay("a", now); d != 0 {
		t.Fatalf("fresh peer delay %v", d)
	}
	want := []time.Duration{time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond, 8 * time.Millisecond, 8 * time.Millisecond}
	for i, w := range want {
		f.fail("a", now)
		if d := f.delay("a", now); d != w {
			t.Errorf("after %d failures: %v, want %v", i+1, d, w)
		}
	}
	// Past the memory the failures are forgotten.
	if d := f.delay("a", now.Add(2*time.Minute)); d != 0 {
		t.Errorf("after the memory: %v", d)
	}
	// The table is bounded; late-comers share the overflow entry.
	f.fail("b", now)
	f.fail("c", now)
	f.fail("d", now)
	f.fail("e", now)
	if n := f.size(); n != 4 {
		t.Fatalf("table size %d, want 3 peers and the overflow entry", n)
	}
	if d := f.delay("zzz", now); d != 2*time.Millisecond {
		t.Errorf("unknown peer with a full table: %v, want the overflow entry's 2ms", d)
	}
	// Expired entries make room.
	later := now.Add(2 * time.Minute)
	f.fail("x", later)
	if f.delay("x", later) != time.Millisecond || f.size() != 1 {
		t.Errorf("after sweep: size %d", f.size())
	}
	// penalize answers with the delay earned before, then records.
	if d := f.penalize("y", later); d != 0 || f.delay("y", later) != time.Millisecond {
		t.Errorf("penalize on a fresh key: %v, then %v", d, f.delay("y", later))
	}
	if d := f.penalize("y", later); d != time.Millisecond {
		t.Errorf("second penalize: %v", d)
	}
}

// TestShutdownDrain: Close sends CancelAll (the agent's handlers see their
// contexts canceled), fails what is in flight, and later Begin calls find
// no connection.
func TestShutdownDrain(t *testing.T) {
	cfg := testConfig(t)
	l, err := NewListener(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- l.Serve(context.Background()) }()
	a := l.Agent("waf")
	h := newHandler("waf-1")
	h.gate = make(chan struct{}) // never opens
	h.entered = make(chan string, 4)
	runAgent(t, cfg.UnixPath, "waf-1", testToken, h, func(c *sdk.ReverseConfig) { c.BackoffMin = time.Hour; c.BackoffMax = time.Hour })
	testutil.WaitFor(t, "registration", func() bool { return a.Snapshot().Connections == 1 })
	res := make(chan error, 1)
	go func() { _, err := call(context.Background(), a); res <- err }()
	<-h.entered
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve after Close: %v", err)
	}
	if err := <-res; !errors.Is(err, agentmux.ErrAgentConnLost) {
		t.Fatalf("in flight at shutdown: %v", err)
	}
	testutil.WaitFor(t, "agent handler canceled", func() bool { return h.canceled.Load() == 1 })
	if _, err := a.Begin(agentmux.Wait{}); !errors.Is(err, agentmux.ErrAgentUnavailable) {
		t.Fatalf("Begin after Close: %v", err)
	}
	if _, err := os.Stat(cfg.UnixPath); !os.IsNotExist(err) {
		t.Errorf("socket file left behind: %v", err)
	}
}

// TestAgentCloseRefusesNewcomers: closing one agent's pool (the dataplane
// draining it) refuses its later registrations; other agents go on.
func TestAgentCloseRefusesNewcomers(t *testing.T) {
	cfg := testConfig(t)
	cfg.Agents = append(cfg.Agents, AgentConfig{Name: "auth", Tokens: []string{testToken}})
	l := startListener(t, cfg)
	if err := l.Agent("waf").Close(); err != nil {
		t.Fatal(err)
	}
	c := dialRaw(t, "unix", cfg.UnixPath)
	c.send(protocol.TypeRegistrationRequest, regReq("waf-1", testToken))
	if _, r := c.answer(); r.Accepted || r.Error != ReasonShutdown {
		t.Fatalf("registration into a closed agent: %+v", r)
	}
	c = dialRaw(t, "unix", cfg.UnixPath)
	c.send(protocol.TypeRegistrationRequest, regReq("auth-1", testToken))
	if _, r := c.answer(); !r.Accepted {
		t.Fatalf("other agent: %+v", r)
	}
	if s := l.Stats(); s.RejectedShutdown != 1 {
		t.Errorf("stats %+v", s)
	}
}

// TestPingLiveness: a registered peer that never answers pings is dropped
// after the ping timeout.
func TestPingLiveness(t *testing.T) {
	// A silent connection is dropped after the ping timeout: any timeout
	// works, since nothing ever answers.
	cfg := testConfig(t)
	cfg.PingInterval = 10 * time.Millisecond
	// A timeout of many intervals: on a loaded machine the first ping
	// may be late, and the test wants one before the close.
	cfg.PingTimeout = 250 * time.Millisecond
	l := startListener(t, cfg)
	c := dialRaw(t, "unix", cfg.UnixPath)
	c.send(protocol.TypeRegistrationRequest, regReq("waf-1", testToken))
	if _, r := c.answer(); !r.Accepted {
		t.Fatal(r.Error)
	}
	a := l.Agent("waf")
	testutil.WaitFor(t, "in pool", func() bool { return a.Snapshot().Connections == 1 })
	// Read the pings but never answer: the proxy gives up.
	pings := 0
	for {
		typ, _, err := c.fr.Next()
		if err != nil {
			break
		}
		if typ == protocol.TypePing {
			pings++
		}
	}
	if pings == 0 {
		t.Error("no ping before the close")
	}
	testutil.WaitFor(t, "dropped from the pool", func() bool { return a.Snapshot().Connections == 0 })
	if _, err := a.Begin(agentmux.Wait{}); !errors.Is(err, agentmux.ErrAgentUnavailable) {
		t.Fatalf("Begin: %v", err)
	}
	// An SDK agent answers the pings and stays.
	runAgent(t, cfg.UnixPath, "waf-2", testToken, newHandler("waf-2"), nil)
	testutil.WaitFor(t, "sdk agent", func() bool { return a.Snapshot().Connections == 1 })
	time.Sleep(5 * cfg.PingTimeout)
	if got, err := call(context.Background(), a); err != nil || got != "waf-2" {
		t.Fatalf("sdk agent after idle time: %q %v", got, err)
	}
	if s := l.Stats(); s.Accepted != 2 {
		t.Errorf("sdk agent reconnected during idle time: %+v", s)
	}
}

func TestPermanentRefusalBacksOff(t *testing.T) {
	cfg := testConfig(t)
	l := startListener(t, cfg)
	h := newHandler("waf-1")
	runAgent(t, cfg.UnixPath, "waf-1", "wrong", h, func(c *sdk.ReverseConfig) {
		c.BackoffMin = time.Millisecond
		c.BackoffMax = time.Hour // a permanent refusal waits this long
	})
	testutil.WaitFor(t, "refusal", func() bool { return l.Stats().RejectedAuth == 1 })
	time.Sleep(50 * time.Millisecond)
	if n := l.Stats().RejectedAuth; n != 1 {
		t.Fatalf("agent retried a permanent refusal %d times at the short backoff", n)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := func() Config {
		c := DefaultConfig()
		c.UnixPath = "/tmp/x.sock"
		c.Agents = []AgentConfig{{Name: "waf", Tokens: []string{"t"}}}
		return c
	}
	c := ok()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.MaxPending != 128 || c.MaxPendingPerPeer != 16 || c.MaxRefusing != 256 {
		t.Errorf("registration limits %d %d %d, want 128 16 256", c.MaxPending, c.MaxPendingPerPeer, c.MaxRefusing)
	}
	c.MaxPending = 8
	if err := c.Validate(); err != nil || c.MaxPendingPerPeer != 8 {
		t.Errorf("max_pending 8: per peer %d, %v; want 8", c.MaxPendingPerPeer, err)
	}
	if got := c.Agents[0].IDs; len(got) != 2 || got[0] != "waf" || got[1] != "waf-*" {
		t.Errorf("default id patterns %q", got)
	}
	cases := []struct {
		name string
		mut  func(*Config)
	}{
		{"no socket", func(c *Config) { c.UnixPath = "" }},
		{"no agents", func(c *Config) { c.Agents = nil }},
		{"empty name", func(c *Config) { c.Agents[0].Name = "" }},
		{"duplicate name", func(c *Config) { c.Agents = append(c.Agents, c.Agents[0]) }},
		{"bad pattern", func(c *Config) { c.Agents[0].IDs = []string{"waf-["} }},
		{"empty pattern", func(c *Config) { c.Agents[0].IDs = []string{""} }},
		{"empty token", func(c *Config) { c.Agents[0].Tokens = []string{""} }},
		{"no token", func(c *Config) { c.Agents[0].Tokens = nil }},
		{"tls without tcp", func(c *Config) { c.TLS = &TLSConfig{CertFile: "a", KeyFile: "b"} }},
		{"tls without cert", func(c *Config) { c.TCPAddr = "127.0.0.1:0"; c.TLS = &TLSConfig{} }},
		{"per id above per agent", func(c *Config) { c.MaxConnsPerID = 10; c.MaxConnsPerAgent = 5 }},
		{"ping timeout below interval", func(c *Config) { c.PingInterval = time.Second; c.PingTimeout = time.Millisecond }},
		{"huge registration", func(c *Config) { c.MaxRegistrationSize = 2 << 20 }},
	}
	for _, tc := range cases {
		c := ok()
		tc.mut(&c)
		if err := c.Validate(); !errors.Is(err, ErrReverseConfig) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// TestShutdownSendsCancelAll reads the wire: on Close a registered
// connection receives CancelAll before the connection ends.
func TestShutdownSendsCancelAll(t *testing.T) {
	cfg := testConfig(t)
	cfg.NoPing = true
	l, err := NewListener(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- l.Serve(context.Background()) }()
	c := dialRaw(t, "unix", cfg.UnixPath)
	c.send(protocol.TypeRegistrationRequest, regReq("waf-1", testToken))
	if _, r := c.answer(); !r.Accepted {
		t.Fatal(r.Error)
	}
	testutil.WaitFor(t, "in pool", func() bool { return l.Agent("waf").Snapshot().Connections == 1 })
	_ = l.Close()
	<-served
	var types []protocol.MsgType
	for {
		typ, _, err := c.fr.Next()
		if err != nil {
			break
		}
		types = append(types, typ)
	}
	if len(types) != 1 || types[0] != protocol.TypeCancelAll {
		t.Fatalf("frames before close: %v, want [CancelAll]", types)
	}
}
