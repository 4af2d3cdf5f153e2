package sdk_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/reverse"
	"github.com/zentinelproxy/sidecar/sdk"
)

func reverseListener(t *testing.T, mutate func(*reverse.Config)) *reverse.Listener {
	t.Helper()
	dir, err := os.MkdirTemp("", "sdkrv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	cfg := reverse.DefaultConfig()
	cfg.UnixPath = filepath.Join(dir, "r.sock")
	cfg.Agents = []reverse.AgentConfig{{Name: "waf", Tokens: []string{"new"}}}
	cfg.FailureDelay = time.Millisecond
	cfg.MaxFailureDelay = time.Millisecond
	if mutate != nil {
		mutate(&cfg)
	}
	l, err := reverse.NewListener(cfg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.Serve(context.Background()) }()
	t.Cleanup(func() { _ = l.Close(); <-done })
	return l
}

func socketOf(t *testing.T, l *reverse.Listener) string {
	t.Helper()
	return l.UnixPath()
}

func serveReverse(t *testing.T, cfg sdk.ReverseConfig) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- sdk.DialAndServe(ctx, cfg, sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true}})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("DialAndServe: %v", err)
		}
	})
}

func TestReverseConfigErrors(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name string
		cfg  sdk.ReverseConfig
	}{
		{"no address", sdk.ReverseConfig{AgentID: "a"}},
		{"no id", sdk.ReverseConfig{Address: "/tmp/x.sock"}},
		{"bad network", sdk.ReverseConfig{Network: "udp", Address: "x:1", AgentID: "a"}},
		{"token twice", sdk.ReverseConfig{Address: "/tmp/x.sock", AgentID: "a", Token: "t", TokenFile: "f"}},
		{"missing token file", sdk.ReverseConfig{Address: "/tmp/x.sock", AgentID: "a", TokenFile: filepath.Join(dir, "nope")}},
		{"metadata not an object", sdk.ReverseConfig{Address: "/tmp/x.sock", AgentID: "a", Metadata: []byte(`[1]`)}},
		{"metadata not json", sdk.ReverseConfig{Address: "/tmp/x.sock", AgentID: "a", Metadata: []byte(`{`)}},
		{"too many conns", sdk.ReverseConfig{Address: "/tmp/x.sock", AgentID: "a", Conns: 65}},
		{"backoff", sdk.ReverseConfig{Address: "/tmp/x.sock", AgentID: "a", BackoffMin: time.Second, BackoffMax: time.Millisecond}},
	}
	for _, tc := range cases {
		err := sdk.DialAndServe(context.Background(), tc.cfg, sdk.Base{})
		if !errors.Is(err, sdk.ErrSDKReverseConfig) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// TestReverseTokenFileRotation: a refused agent picks up a rotated token
// file at its next attempt.
func TestReverseTokenFileRotation(t *testing.T) {
	l := reverseListener(t, nil)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	serveReverse(t, sdk.ReverseConfig{
		Address: socketOf(t, l), AgentID: "waf-1", TokenFile: tokenFile,
		BackoffMin: time.Millisecond, BackoffMax: 10 * time.Millisecond,
	})
	testutil.WaitFor(t, "refusal", func() bool { return l.Stats().RejectedAuth >= 1 })
	if err := os.WriteFile(tokenFile, []byte("new\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "registration with the new token", func() bool { return l.Agent("waf").Snapshot().Connections == 1 })
}

// TestReverseConns: one instance keeps several connections under one id.
func TestReverseConns(t *testing.T) {
	l := reverseListener(t, nil)
	var assigned = make(chan string, 8)
	serveReverse(t, sdk.ReverseConfig{
		Address: socketOf(t, l), AgentID: "waf-1", Token: "new", Conns: 3,
		OnRegistered: func(id string) { assigned <- id },
	})
	testutil.WaitFor(t, "three connections", func() bool { return l.Agent("waf").Snapshot().Connections == 3 })
	seen := map[string]bool{}
	for i := 0; i < 3; i++ {
		seen[<-assigned] = true
	}
	if len(seen) != 3 {
		t.Errorf("assigned ids %v", seen)
	}
}

// TestReverseIdleTimeout: without pings from the proxy an idle timeout
// makes the agent reconnect; with pings the connection stays.
func TestReverseIdleTimeout(t *testing.T) {
	l := reverseListener(t, func(c *reverse.Config) { c.NoPing = true })
	serveReverse(t, sdk.ReverseConfig{
		Address: socketOf(t, l), AgentID: "waf-1", Token: "new", IdleTimeout: 20 * time.Millisecond,
		BackoffMin: time.Millisecond, BackoffMax: time.Millisecond,
	})
	testutil.WaitFor(t, "reconnects", func() bool { return l.Stats().Accepted >= 3 })

	// Pinged every 5ms, the agent's 1s idle timeout would need a 200-ping
	// gap to fire; the proxy's ping timeout is out of reach. Three idle
	// timeouts pass.
	l2 := reverseListener(t, func(c *reverse.Config) { c.PingInterval = 5 * time.Millisecond; c.PingTimeout = 10 * time.Second })
	serveReverse(t, sdk.ReverseConfig{
		Address: socketOf(t, l2), AgentID: "waf-1", Token: "new", IdleTimeout: time.Second,
	})
	testutil.WaitFor(t, "registration", func() bool { return l2.Stats().Accepted == 1 })
	time.Sleep(3 * time.Second)
	if n := l2.Stats().Accepted; n != 1 {
		t.Errorf("pinged connection reconnected: %d registrations", n)
	}
}
