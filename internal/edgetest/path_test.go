package edgetest

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"reflect"
	"sync"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// The path an agent decides on: a prefix rule written on metadata.path
// holds for every spelling of the path the router and most servers read
// as the same one (dot segments, percent-escapes of unreserved bytes,
// repeated slashes), while uri carries the target as forwarded.

// pathGuard blocks every path under /private and records (uri, path).
type pathGuard struct {
	sdk.Base
	mu   sync.Mutex
	seen []string
}

func (a *pathGuard) OnRequestHeaders(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
	a.mu.Lock()
	a.seen = append(a.seen, string(m.URI)+" "+string(m.Metadata.Path))
	a.mu.Unlock()
	if bytes.HasPrefix(m.Metadata.Path, []byte("/private")) {
		d.Kind, d.Status, d.Body = protocol.DecisionBlock, 403, []byte("private")
	}
	return nil
}

func (a *pathGuard) take() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.seen
	a.seen = nil
	return s
}

func TestAgentPathIsTheRoutedPath(t *testing.T) {
	dir := testutil.SocketDir(t)
	up := startUpstream(t)
	guard := &pathGuard{Base: sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true}}}
	testagent.Serve(t, filepath.Join(dir, "guard.sock"), guard)
	sc := startSidecar(t, dir, fmt.Sprintf(`listeners:
  - name: edge
    address: 127.0.0.1:0
admin:
  address: 127.0.0.1:0
upstreams:
  - name: app
    address: %s
agents:
  - name: guard
    transport: uds
    address: %s
    failure_mode: closed
routes:
  - name: all
    upstream: app
    agents: [guard]
`, up.addr, filepath.Join(dir, "guard.sock")), "")
	testutil.WaitFor(t, "agent connected", func() bool {
		resp, err := http.Get("http://" + sc.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	for _, tc := range []struct {
		target string
		status int
		seen   string // "uri path" the guard was shown
	}{
		{"/private/x", 403, "/private/x /private/x"},
		{"/public/../private/x", 403, "/public/../private/x /private/x"},
		{"/./private", 403, "/./private /private"},
		{"//private", 403, "//private /private"},
		{"/%70rivate?a=1", 403, "/%70rivate?a=1 /private"},
		{"/pub/%2e%2e/private", 403, "/pub/%2e%2e/private /private"},
		{"/public/private", 200, "/public/private /public/private"},
		{"/public?to=/private", 200, "/public?to=/private /public"},
	} {
		t.Run(tc.target, func(t *testing.T) {
			guard.take()
			runCase(t, sc.addr, edgeCase{req: get(tc.target, "app.example", "p1"), want: []int{tc.status}})
			// The probe runs after the row: it is the second request shown.
			if seen := guard.take(); len(seen) != 2 || !reflect.DeepEqual(seen[0], tc.seen) {
				t.Errorf("guard saw %q, want %q first", seen, tc.seen)
			}
		})
	}
}
