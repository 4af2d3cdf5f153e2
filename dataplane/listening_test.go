package dataplane_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/dataplane"
	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// TestListeningAndAddrs: the server reports its bound addresses (port 0
// resolved) and whether it listens, which readiness is built on.
func TestListeningAndAddrs(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	cfg := configText(t, `
listeners: [{address: "127.0.0.1:0"}, {address: "unix:{{.sock}}"}]
upstreams: [{name: app, address: "{{.up}}"}]
routes: [{upstream: app}]
`, map[string]any{"up": up.addr(), "sock": testutil.SocketPath(t)})
	srv, err := dataplane.New(dataplane.Config{File: cfg}, nil, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if srv.Listening() || len(srv.Addrs()) != 0 {
		t.Fatalf("listening %v addrs %v before ListenAndServe", srv.Listening(), srv.Addrs())
	}
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe() }()
	testutil.WaitFor(t, "listening", srv.Listening)
	addrs := srv.Addrs()
	if len(addrs) != 2 || addrs[0].Network() != "tcp" || addrs[1].Network() != "unix" || strings.HasSuffix(addrs[0].String(), ":0") {
		t.Fatalf("addrs %v", addrs)
	}
	resp, err := http.Get("http://" + addrs[0].String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "ok" {
		t.Errorf("%d %q", resp.StatusCode, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if srv.Listening() {
		t.Error("still listening after Shutdown")
	}
	if err := <-served; err != nil {
		t.Errorf("ListenAndServe: %v", err)
	}
}
