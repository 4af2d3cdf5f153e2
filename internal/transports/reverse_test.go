package transports_test

import (
	"context"
	"errors"
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

func TestReverseGroup(t *testing.T) {
	sock := testutil.SocketDir(t) + "/g.sock"
	specs := []transports.ReverseSpec{
		{Name: "waf", Address: "unix:" + sock, Options: map[string]string{"tokens": testToken}},
		{Name: "bot", Address: "unix:" + sock, Options: map[string]string{"tokens": "bot-token"}},
		{Name: "auth", Address: "127.0.0.1:0", Options: map[string]string{"tokens": testToken, "ids": "auth-*"}},
	}
	g, err := transports.NewReverseGroup(specs, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Listeners()) != 2 {
		t.Fatalf("%d listeners", len(g.Listeners()))
	}
	served := make(chan error, 1)
	go func() { served <- g.Serve(context.Background()) }()
	runAgent(t, sock, "waf-1", testToken, newHandler("waf-1"))
	runAgent(t, sock, "bot", "bot-token", newHandler("bot"))
	runAgent(t, g.Listeners()[1].TCPAddr().String(), "auth-1", testToken, newHandler("auth-1"))
	for name, id := range map[string]string{"waf": "waf-1", "bot": "bot", "auth": "auth-1"} {
		a, err := g.Agent(name)
		if err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, name, func() bool { return a.Snapshot().Connections == 1 })
		if got, err := call(context.Background(), a); err != nil || got != id {
			t.Errorf("%s: %q, %v", name, got, err)
		}
	}
	if _, err := g.Agent("nope"); !errors.Is(err, reverse.ErrReverseConfig) {
		t.Errorf("unknown agent: %v", err)
	}
	_ = g.Close()
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	// A second group on the same socket path works once the first closed.
	g2, err := transports.NewReverseGroup(specs[:1], testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	_ = g2.Close()
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
