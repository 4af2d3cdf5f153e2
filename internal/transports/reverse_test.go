package transports_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/transports"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/reverse"
	"github.com/zentinelproxy/sidecar/sdk"
)

const testToken = "s3cret-token"

func testLogger(t testing.TB) zerolog.Logger {
	if testing.Verbose() {
		return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel)
	}
	return zerolog.Nop()
}

// idHandler answers RequestHeaders with an x-agent header naming itself.
type idHandler struct {
	sdk.Base
	name string
}

func newHandler(name string) *idHandler {
	return &idHandler{name: name, Base: sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true, SupportsCancellation: true}}}
}

func (h *idHandler) OnRequestHeaders(_ context.Context, _ *protocol.RequestHeaders, d *protocol.Decision) error {
	d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderSet, Name: []byte("x-agent"), Value: []byte(h.name)})
	return nil
}

// runAgent serves h over a reverse connection as id until the test ends.
func runAgent(t testing.TB, addr, id, token string, h sdk.Handler) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cfg := sdk.ReverseConfig{Address: addr, AgentID: id, Token: token, BackoffMin: 5 * time.Millisecond, BackoffMax: 50 * time.Millisecond}
	done := make(chan error, 1)
	go func() { done <- sdk.DialAndServe(ctx, cfg, h) }()
	var once sync.Once
	t.Cleanup(func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("DialAndServe(%s): %v", id, err)
			}
		})
	})
}

// call runs one RequestHeaders exchange and returns the x-agent that answered.
func call(ctx context.Context, a agentmux.Agent) (string, error) {
	ex, err := a.Begin(agentmux.WaitFor(ctx))
	if err != nil {
		return "", err
	}
	defer ex.Finish()
	m := protocol.RequestHeaders{Method: []byte("GET"), URI: []byte("/")}
	r, err := ex.RequestHeaders(agentmux.WaitFor(ctx), &m)
	if err != nil {
		return "", err
	}
	for _, op := range r.Decision.RequestHeaderOps {
		if string(op.Name) == "x-agent" {
			return string(op.Value), nil
		}
	}
	return "", errors.New("reply without x-agent")
}

func TestReverseListenerConfigs(t *testing.T) {
	specs := []transports.ReverseSpec{
		{Name: "waf", Address: "unix:/tmp/rv.sock", MaxInFlight: 64, MessageTimeout: 2 * time.Second,
			Options: map[string]string{"ids": "waf-*, edge-waf", "token_env": "WAF_TOKEN", "max_conns_per_id": "2", "ping_interval": "0"}},
		{Name: "auth", Address: "127.0.0.1:0",
			Options: map[string]string{"tokens": "a,b", "tls_cert_file": "c.pem", "tls_key_file": "k.pem", "tls_client_ca_file": "ca.pem",
				"max_pending": "64", "max_pending_per_peer": "4", "max_refusing": "32"}},
		{Name: "bot", Address: "unix:/tmp/rv.sock",
			Options: map[string]string{"allow_no_token": "true", "max_conns_per_id": "2", "socket_mode": "600"}},
	}
	cfgs, err := transports.ReverseListenerConfigs(specs)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfgs) != 2 {
		t.Fatalf("%d listeners, want 2", len(cfgs))
	}
	u, tcp := cfgs[0], cfgs[1]
	if u.UnixPath != "/tmp/rv.sock" || len(u.Agents) != 2 || u.Agents[0].Name != "waf" || u.Agents[1].Name != "bot" {
		t.Errorf("unix listener %+v", u)
	}
	if got := u.Agents[0].IDs; len(got) != 2 || got[0] != "waf-*" || got[1] != "edge-waf" {
		t.Errorf("ids %q", got)
	}
	if u.MaxConnsPerID != 2 || !u.NoPing || u.UnixMode != 0o600 || u.Agents[0].MaxInFlight != 64 || u.Agents[0].MessageTimeout != 2*time.Second {
		t.Errorf("unix listener options %+v", u)
	}
	if !u.Agents[1].AllowNoToken || u.Agents[0].TokenEnv != "WAF_TOKEN" {
		t.Errorf("agent options %+v", u.Agents)
	}
	if tcp.TCPAddr != "127.0.0.1:0" || tcp.TLS == nil || tcp.TLS.ClientCAFile != "ca.pem" || len(tcp.Agents[0].Tokens) != 2 {
		t.Errorf("tcp listener %+v", tcp)
	}
	if tcp.MaxPending != 64 || tcp.MaxPendingPerPeer != 4 || tcp.MaxRefusing != 32 || u.MaxPendingPerPeer != 16 || u.MaxRefusing != 256 {
		t.Errorf("registration limits: tcp %d %d %d, unix %d %d", tcp.MaxPending, tcp.MaxPendingPerPeer, tcp.MaxRefusing, u.MaxPendingPerPeer, u.MaxRefusing)
	}

	bad := []struct {
		name  string
		specs []transports.ReverseSpec
		want  string
	}{
		{"unknown key", []transports.ReverseSpec{{Name: "a", Address: "unix:/tmp/a", Options: map[string]string{"tokne_file": "x"}}}, "unknown option"},
		{"conflict", []transports.ReverseSpec{
			{Name: "a", Address: "unix:/tmp/a", Options: map[string]string{"tokens": "t", "max_conns_per_id": "2"}},
			{Name: "b", Address: "unix:/tmp/a", Options: map[string]string{"tokens": "t", "max_conns_per_id": "3"}},
		}, "differently"},
		{"bad bool", []transports.ReverseSpec{{Name: "a", Address: "unix:/tmp/a", Options: map[string]string{"allow_no_token": "yes please"}}}, "allow_no_token"},
		{"bad duration", []transports.ReverseSpec{{Name: "a", Address: "unix:/tmp/a", Options: map[string]string{"tokens": "t", "registration_timeout": "soon"}}}, "registration_timeout"},
		{"zero refusing", []transports.ReverseSpec{{Name: "a", Address: "unix:/tmp/a", Options: map[string]string{"tokens": "t", "max_refusing": "0"}}}, "max_refusing"},
		{"bad per peer", []transports.ReverseSpec{{Name: "a", Address: "unix:/tmp/a", Options: map[string]string{"tokens": "t", "max_pending_per_peer": "-1"}}}, "max_pending_per_peer"},
		{"bad mode", []transports.ReverseSpec{{Name: "a", Address: "unix:/tmp/a", Options: map[string]string{"tokens": "t", "socket_mode": "999"}}}, "socket_mode"},
		{"no token", []transports.ReverseSpec{{Name: "a", Address: "unix:/tmp/a"}}, "no token"},
		{"tls on unix", []transports.ReverseSpec{{Name: "a", Address: "unix:/tmp/a", Options: map[string]string{"tokens": "t", "tls_cert_file": "c", "tls_key_file": "k"}}}, "tls"},
	}
	for _, tc := range bad {
		_, err := transports.ReverseListenerConfigs(tc.specs)
		if !errors.Is(err, reverse.ErrReverseConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// TestBuildReverse: reverse agents are built through the factory table
// like the others, one listener per address shared by its agents, each
// agent's pool taking the registrations its ids admit; a socket path is
// free again once Agents closed.
func TestBuildReverse(t *testing.T) {
	sock := testutil.SocketDir(t) + "/g.sock"
	yaml := fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: "127.0.0.1:1"}]
agents:
  - {name: waf, transport: reverse, address: "unix:%[1]s", options: {tokens: %[2]q}}
  - {name: bot, transport: reverse, address: "unix:%[1]s", options: {tokens: bot-token}}
  - {name: auth, transport: reverse, address: "127.0.0.1:0", options: {tokens: %[2]q, ids: "auth-*"}}
routes: [{name: r, upstream: app, agents: [waf, bot, auth]}]
`, sock, testToken)
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	r := newAgents(t)
	b, err := r.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.Commit()
	lns := r.Listeners()
	if len(lns) != 2 {
		t.Fatalf("%d listeners", len(lns))
	}
	runAgent(t, sock, "waf-1", testToken, newHandler("waf-1"))
	runAgent(t, sock, "bot", "bot-token", newHandler("bot"))
	runAgent(t, lns[1].TCPAddr().String(), "auth-1", testToken, newHandler("auth-1"))
	for name, id := range map[string]string{"waf": "waf-1", "bot": "bot", "auth": "auth-1"} {
		a := b.Agents()[name]
		if a == nil || a != r.Agent(name) || a.Snapshot().Transport != config.TransportReverse {
			t.Fatalf("%s: instance %v", name, a)
		}
		testutil.WaitFor(t, name, func() bool { return a.Snapshot().Connections == 1 })
		if got, err := call(context.Background(), a); err != nil || got != id {
			t.Errorf("%s: %q, %v", name, got, err)
		}
	}
	if len(b.Agents()) != 3 || r.Agent("nope") != nil {
		t.Errorf("agents %v", b.Agents())
	}
	r.Close()
	// Another Agents binds the same socket path once the first closed.
	r2 := newAgents(t)
	cfg.Agents, cfg.Routes[0].Agents = cfg.Agents[:1], cfg.Routes[0].Agents[:1]
	b2, err := r2.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b2.Commit()
}

// TestBuildReverseListeners: across builds a reverse listener whose
// agents' keys stay is kept with its connections, one at a new address
// is bound (its pool is fresh), changing one in place is refused as the
// operator's error, one whose address is gone closes once committed, and
// an aborted build closes what it bound.
func TestBuildReverseListeners(t *testing.T) {
	dir := testutil.SocketDir(t)
	rv1, rv2, rv3 := filepath.Join(dir, "rv1.sock"), filepath.Join(dir, "rv2.sock"), filepath.Join(dir, "rv3.sock")
	conf := func(extra, opts string) *config.Config {
		t.Helper()
		c, err := config.Parse(fmt.Appendf(nil, `
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: "127.0.0.1:1"}]
agents:
  - {name: rv1, transport: reverse, address: "unix:%s", options: {allow_no_token: "true"%s}}
%sroutes: [{name: r, upstream: app, agents: [rv1]}]
`, rv1, opts, extra))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	rv := func(name, path string) string {
		return fmt.Sprintf("  - {name: %s, transport: reverse, address: \"unix:%s\", options: {allow_no_token: \"true\"}}\n", name, path)
	}
	gone := func(path string) func() bool {
		return func() bool {
			c, err := net.Dial("unix", path)
			if err == nil {
				c.Close()
			}
			return err != nil
		}
	}
	r := newAgents(t)
	b1, err := r.Build(conf("", ""))
	if err != nil {
		t.Fatal(err)
	}
	b1.Commit()
	defer closeAll(b1)
	first, inst := r.Listeners()[0], r.Agent("rv1")
	runAgent(t, rv1, "rv1", "", newHandler("rv1"))
	testutil.WaitFor(t, "rv1 connected", func() bool { return inst.Snapshot().Connections == 1 })

	b2, err := r.Build(conf(rv("rv2", rv2), ""))
	if err != nil {
		t.Fatal(err)
	}
	if fresh := b2.Fresh(); len(fresh) != 1 || fresh["rv2"] == nil || b2.Agents()["rv1"] != inst {
		t.Fatalf("fresh %v", fresh)
	}
	b2.Commit()
	defer closeAll(b2)
	if lns := r.Listeners(); len(lns) != 2 || lns[0] != first {
		t.Fatal("the unchanged reverse listener was replaced")
	}
	runAgent(t, rv2, "rv2", "", newHandler("rv2"))
	testutil.WaitFor(t, "rv2 connected", func() bool { return r.Agent("rv2").Snapshot().Connections == 1 })

	_, err = r.Build(conf(rv("rv2", rv2), `, registration_timeout: "3s"`))
	if !errors.Is(err, config.ErrConfigInvalid) || !strings.Contains(err.Error(), "restart") {
		t.Fatalf("in-place change: %v", err)
	}
	if r.Listeners()[0] != first || r.Agent("rv2").Snapshot().Connections != 1 {
		t.Error("a refused build changed the committed set")
	}

	b3, err := r.Build(conf(rv("rv3", rv3), ""))
	if err != nil {
		t.Fatal(err)
	}
	if gone(rv3)() {
		t.Fatal("rv3's listener not bound by the build")
	}
	b3.Abort()
	testutil.WaitFor(t, "rv3's listener closed by Abort", gone(rv3))

	b4, err := r.Build(conf("", ""))
	if err != nil {
		t.Fatal(err)
	}
	if len(b4.Fresh()) != 0 {
		t.Errorf("fresh %v", b4.Fresh())
	}
	b4.Commit()
	testutil.WaitFor(t, "rv2's listener closed", gone(rv2))
	if r.Listeners()[0] != first || inst.Snapshot().Connections != 1 {
		t.Error("rv1 lost its listener or connection")
	}
}

// TestReverseSampleConfig keeps testdata/reverse/sidecar.yaml valid for both the
// configuration loader and ReverseListenerConfigs.
func TestReverseSampleConfig(t *testing.T) {
	c, err := config.Load("../../testdata/reverse/sidecar.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var specs []transports.ReverseSpec
	for _, a := range c.Agents {
		if a.Transport != config.TransportReverse {
			continue
		}
		specs = append(specs, transports.ReverseSpec{Name: a.Name, Address: a.Address, MaxInFlight: a.MaxInFlight,
			MaxQueue: a.MaxQueue, MessageTimeout: a.Timeouts.Message, Options: a.Options})
	}
	cfgs, err := transports.ReverseListenerConfigs(specs)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfgs) != 2 || len(cfgs[0].Agents) != 2 || cfgs[1].TLS == nil || cfgs[1].TLS.ClientCAFile == "" {
		t.Errorf("listeners %+v", cfgs)
	}
}
