package reverse

import (
	"context"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/conformance"
	"github.com/zentinelproxy/sidecar/sdk"
)

// TestConformanceReverse runs the conversation suite over a reverse
// connection: the agent dials the listener's Unix socket and registers.
func TestConformanceReverse(t *testing.T) {
	conformance.Run(t, dialReverse)
}

func dialReverse(t *testing.T, h sdk.Handler) agentmux.Agent {
	t.Helper()
	return dialReverseWith(t, h, nil)
}

// dialReverseWith is dialReverse with the listener's config changed by mod.
func dialReverseWith(t *testing.T, h sdk.Handler, mod func(*Config)) agentmux.Agent {
	t.Helper()
	cfg := testConfig(t)
	cfg.MessageTimeout = 15 * time.Second
	cfg.MaxInFlight = 256
	if mod != nil {
		mod(&cfg)
	}
	l := startListener(t, cfg)
	runAgent(t, cfg.UnixPath, "waf-1", testToken, h, nil)
	a := l.Agent("waf")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for a.Snapshot().Connections == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("agent did not register")
		case <-time.After(time.Millisecond):
		}
	}
	return a
}
