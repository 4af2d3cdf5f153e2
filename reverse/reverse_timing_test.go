package reverse

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/conformance"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// benchReverse is an allow-all agent registered over a reverse Unix socket.
func benchReverse(b *testing.B, h sdk.Handler) agentmux.Agent {
	cfg := testConfig(b)
	l := startListener(b, cfg)
	runAgent(b, cfg.UnixPath, "waf-1", testToken, h, nil)
	a := l.Agent("waf")
	testutil.WaitFor(b, "registration", func() bool { return a.Snapshot().Connections == 1 })
	return a
}

// benchUDS is the same agent served with sdk.ServeUDS and dialed by udsclient.Client.
func benchUDS(b *testing.B, h sdk.Handler) agentmux.Agent {
	path := filepath.Join(testutil.SocketDir(b), "a.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sdk.ServeUDS(ctx, path, h, nil) }()
	cfg := udsclient.DefaultConfig("waf", path)
	cfg.MessageTimeout = 5 * time.Second
	c, err := udsclient.NewClient(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = c.Close()
		cancel()
		<-done
	})
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := c.WaitReady(wctx); err != nil {
		b.Fatal(err)
	}
	return c
}

// BenchmarkRoundTrip measures one RequestHeaders → Decision exchange with
// 1 and 64 requests in flight, over a reverse connection and over plain
// UDS in the same run.
func BenchmarkRoundTrip(b *testing.B) {
	h := sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true, SupportsCancellation: true}}
	for _, inflight := range []int{1, 64} {
		for _, tr := range []struct {
			name string
			dial func(*testing.B, sdk.Handler) agentmux.Agent
		}{{"uds", benchUDS}, {"reverse", benchReverse}} {
			b.Run(fmt.Sprintf("%s/inflight=%d", tr.name, inflight), func(b *testing.B) {
				a := tr.dial(b, h)
				conformance.BenchRoundTrips(b, a, inflight)
			})
		}
	}
}
