package conformance_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/conformance"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// TestConformanceUDS runs the conversation suite over a Unix socket, on
// the payload encoding both ends choose by default (protobuf).
func TestConformanceUDS(t *testing.T) {
	conformance.Run(t, dialUDS)
}

// TestConformanceUDSJSON runs it with the agent keeping JSON payloads.
func TestConformanceUDSJSON(t *testing.T) {
	conformance.Run(t, func(t *testing.T, h sdk.Handler) agentmux.Agent {
		return dialUDSWith(t, h, &sdk.Options{Name: "conformance", JSONPayloads: true})
	})
}

// TestDeadlinesUDS runs the deadline suite over a Unix socket, with
// protobuf and with JSON payloads.
func TestDeadlinesUDS(t *testing.T) {
	for _, jsonOnly := range []bool{false, true} {
		t.Run(map[bool]string{false: "protobuf", true: "json"}[jsonOnly], func(t *testing.T) {
			conformance.RunDeadlines(t, func(t *testing.T, h sdk.Handler, lim *sdk.Limiter) agentmux.Agent {
				return dialUDSWith(t, h, &sdk.Options{Name: "conformance", JSONPayloads: jsonOnly, Limiter: lim})
			})
		})
	}
}

func dialUDS(t *testing.T, h sdk.Handler) agentmux.Agent {
	t.Helper()
	return dialUDSWith(t, h, &sdk.Options{Name: "conformance"})
}

func dialUDSWith(t *testing.T, h sdk.Handler, opts *sdk.Options) agentmux.Agent {
	t.Helper()
	// t.TempDir paths can exceed the 107-byte socket path limit.
	dir, err := os.MkdirTemp("", "conf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	path := filepath.Join(dir, "agent.sock")
	ln, err := sdk.ListenUDS(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sdk.Serve(ctx, ln, h, opts) }()
	cfg := udsclient.DefaultConfig("conformance", path)
	cfg.MessageTimeout = 15 * time.Second
	cfg.MaxInFlight = 256
	c, err := udsclient.NewClient(cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("sdk.Serve: %v", err)
		}
	})
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := c.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestUDSPayloadEncoding: the suite's two UDS runs really differ — by
// default the SDK agent and the proxy end on protobuf payloads, with
// JSONPayloads on JSON — as the link's capabilities say.
func TestUDSPayloadEncoding(t *testing.T) {
	caps := protocol.Capabilities{HandlesRequestHeaders: true}
	for _, jsonOnly := range []bool{false, true} {
		a := dialUDSWith(t, &sdk.Base{Caps: caps}, &sdk.Options{Name: "enc", JSONPayloads: jsonOnly})
		if got := a.Capabilities().SupportsProtobufPayloads; got == jsonOnly {
			t.Errorf("JSONPayloads %v: protobuf payloads %v", jsonOnly, got)
		}
	}
}
