// Package dptest serves a dataplane built from a parsed configuration
// and given agents, for the tests of a transport that run requests
// through the proxy without its binary.
package dptest

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/dataplane"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// Serve runs a dataplane of cfg with agents on a loopback port until the
// test ends (then shuts it down, and logs the proxy's log if the test
// failed). It returns the proxy's base URL and its log.
func Serve(t testing.TB, cfg *config.Config, agents map[string]agentmux.Agent) (string, *testutil.LogBuffer) {
	t.Helper()
	logs := &testutil.LogBuffer{}
	srv, err := dataplane.New(dataplane.Config{File: cfg}, agents, zerolog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
		if t.Failed() {
			t.Logf("proxy log:\n%s", logs.String())
		}
	})
	return "http://" + ln.Addr().String(), logs
}
