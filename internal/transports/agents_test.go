package transports_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/config"
	st "github.com/zentinelproxy/sidecar/internal/supervisor/supervisortest"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/internal/transports"
)

// newAgents is an Agents closed when the test ends; a listener that
// fails fails the test.
func newAgents(t *testing.T) *transports.Agents {
	t.Helper()
	r := transports.NewAgents(testLogger(t), func(err error) { t.Errorf("reverse listener failed: %v", err) })
	t.Cleanup(r.Close)
	return r
}

// closeAll closes the instances of a committed Build, as the dataplane
// that would serve them does at shutdown.
func closeAll(b *transports.Build) {
	for _, a := range b.Agents() {
		_ = a.Close()
	}
}

// TestBuildReuse checks Agents.Build's reuse rule field by field
// against real instances: the instance is kept exactly when
// transports.InstanceKey is.
func TestBuildReuse(t *testing.T) {
	dir := testutil.SocketDir(t)
	sock := filepath.Join(dir, "a.sock")
	testagent.Serve(t, sock, st.NewPolicyAgent())
	mk := func(agent string) *config.Config {
		t.Helper()
		c, err := config.Parse([]byte(fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: "127.0.0.1:1"}]
agents:
  - {name: a, transport: uds, address: %q}
  - %s
routes: [{name: r, upstream: app, agents: [a, b]}]
`, sock, agent)))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	base := fmt.Sprintf(`{name: b, transport: uds, address: %q, timeouts: {message: 1s}}`, sock)
	tests := []struct {
		name  string
		agent string
		reuse bool
	}{
		{"unchanged", base, true},
		{"unix: prefix", fmt.Sprintf(`{name: b, transport: uds, address: "unix:%s", timeouts: {message: 1s}}`, sock), true},
		{"failure mode", fmt.Sprintf(`{name: b, transport: uds, address: %q, timeouts: {message: 1s}, failure_mode: open}`, sock), true},
		{"request budget", fmt.Sprintf(`{name: b, transport: uds, address: %q, timeouts: {message: 1s, request: 9s}}`, sock), true},
		{"body policy", fmt.Sprintf(`{name: b, transport: uds, address: %q, timeouts: {message: 1s}, response_body: {mode: streaming}}`, sock), true},
		{"header limits", fmt.Sprintf(`{name: b, transport: uds, address: %q, timeouts: {message: 1s}, limits: {header_ops: 3}}`, sock), true},
		{"message timeout", fmt.Sprintf(`{name: b, transport: uds, address: %q, timeouts: {message: 2s}}`, sock), false},
		{"frame timeout", fmt.Sprintf(`{name: b, transport: uds, address: %q, timeouts: {message: 1s, frame: 9s}}`, sock), false},
		{"conns", fmt.Sprintf(`{name: b, transport: uds, address: %q, timeouts: {message: 1s}, conns: 2}`, sock), false},
		{"max in flight", fmt.Sprintf(`{name: b, transport: uds, address: %q, timeouts: {message: 1s}, max_in_flight: 7}`, sock), false},
		{"address", fmt.Sprintf(`{name: b, transport: uds, address: %q, timeouts: {message: 1s}}`, filepath.Join(dir, "other.sock")), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c1, c2 := mk(base), mk(tc.agent)
			if k1, k2 := transports.InstanceKey(*c1.Agent("b")), transports.InstanceKey(*c2.Agent("b")); (k1 == k2) != tc.reuse {
				t.Fatalf("keys equal %v, want %v:\n%+v\n%+v", k1 == k2, tc.reuse, k1, k2)
			}
			r := newAgents(t)
			first, err := r.Build(c1)
			if err != nil {
				t.Fatal(err)
			}
			first.Commit()
			defer closeAll(first)
			second, err := r.Build(c2)
			if err != nil {
				t.Fatal(err)
			}
			defer second.Abort()
			if second.Agents()["a"] != first.Agents()["a"] {
				t.Error("the unchanged agent a was rebuilt")
			}
			if got := second.Agents()["b"] == first.Agents()["b"]; got != tc.reuse {
				t.Errorf("b reused %v, want %v", got, tc.reuse)
			}
			if want := map[bool]int{true: 0, false: 1}[tc.reuse]; len(second.Fresh()) != want {
				t.Errorf("%d fresh instances, want %d", len(second.Fresh()), want)
			}
		})
	}
}
