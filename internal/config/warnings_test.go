package config_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/config"
)

func TestAccessLogFieldsDefault(t *testing.T) {
	c, err := config.Parse([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.AccessLog.Fields, config.DefaultAccessLogFields) {
		t.Errorf("fields %v", c.AccessLog.Fields)
	}
	for _, f := range config.DefaultAccessLogFields {
		if !slices.Contains(config.AccessLogFields, f) {
			t.Errorf("default field %q is not a known one", f)
		}
	}
}

// TestWarnings: each warning names its key and line; a configuration
// without them has none.
func TestWarnings(t *testing.T) {
	c, err := config.Parse([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	if w := c.Warnings(); len(w) != 0 {
		t.Errorf("the base configuration warns: %v", w)
	}
	doc := `listeners:
  - address: 127.0.0.1:8080
upstreams:
  - name: app
    address: 127.0.0.1:9000
agents:
  - name: waf
    transport: uds
    address: /run/waf.sock
    timeouts:
      message: 6s
    response_body:
      over_limit: prefix
  - name: spare
    transport: grpc
    address: 127.0.0.1:9100
routes:
  - name: r
    upstream: app
    agents:
      - name: waf
        timeout: 2s
`
	c, err = config.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range c.Warnings() {
		got = append(got, w.String())
	}
	for _, want := range []string{
		`config: line 22: routes[0].agents[0].timeout: 2s is below agent "waf"'s timeouts.message (6s)`,
		`config: line 13: agents[0].response_body.over_limit: prefix applies to request bodies: a response body over the limit on route "r" passes uninspected`,
		`config: line 11: agents[0].timeouts.message: 6s is above timeouts.request (5s)`,
		`config: line 14: agents[1].name: agent "spare" is on no route`,
	} {
		if !slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, want) }) {
			t.Errorf("no warning %q in\n%s", want, strings.Join(got, "\n"))
		}
	}
	if len(got) != 4 {
		t.Errorf("%d warnings, want 4:\n%s", len(got), strings.Join(got, "\n"))
	}
}

// TestBufferEstimate: requests that can wait on agents that see bodies,
// times the most one request holds, plus the agents' queues, capped by
// the listeners' connections when all are capped.
func TestBufferEstimate(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name, doc string
		want      config.BufferEstimate
	}{
		{"defaults", base, config.BufferEstimate{
			Requests: 1024 + 1024, PerRequest: 2 * mib, SendQueues: 4 * mib,
			Total: 2048*2*mib + 4*mib, Key: "agents[0].max_in_flight"}},
		{"sized", `listeners: [{address: "127.0.0.1:8080"}]
upstreams: [{name: app, address: "127.0.0.1:9000"}]
agents:
  - {name: a, transport: uds, address: /a.sock, conns: 2, max_in_flight: 16, max_queue: 8, addresses: [/b.sock],
     request_body: {mode: buffered, limit: 256KiB}, response_body: {mode: none}}
  - {name: g, transport: grpc, address: "127.0.0.1:9100", request_body: {mode: streaming, chunk_size: 16KiB}, response_body: {mode: none}}
  - {name: s, transport: uds, address: /s.sock, shadow: true, shadow_queue_bytes: 1MiB}
  - {name: unused, transport: grpc, address: "127.0.0.1:9101"}
routes:
  - {upstream: app, agents: [a, g, s]}
`, config.BufferEstimate{
			// a: 2 members × 2 conns × 16 + 8 = 72; g: 1024 + 1024
			Requests: 72 + 2048, PerRequest: 256 << 10,
			SendQueues: 2*2*4*mib + 4*mib, Shadow: mib,
			Total: (72+2048)*(256<<10) + 20*mib + mib, Key: "agents[1].max_in_flight"}},
		{"listeners cap", `listeners:
  - {address: "127.0.0.1:8080", max_connections: 100}
  - {address: "127.0.0.1:8081", max_connections: 50}
upstreams: [{name: app, address: "127.0.0.1:9000"}]
agents: [{name: a, transport: grpc, address: "127.0.0.1:9100"}]
routes: [{upstream: app, agents: [a]}]
`, config.BufferEstimate{Requests: 150, PerRequest: 2 * mib, Total: 300 * mib, Key: "listeners[0].max_connections"}},
		{"no body", `listeners: [{address: "127.0.0.1:8080"}]
upstreams: [{name: app, address: "127.0.0.1:9000"}]
agents: [{name: a, transport: grpc, address: "127.0.0.1:9100", request_body: {mode: none}, response_body: {mode: none}}]
routes: [{upstream: app, agents: [a]}]
`, config.BufferEstimate{}},
	} {
		cfg, err := config.Parse([]byte(c.doc))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := cfg.BufferEstimate(); got != c.want {
			t.Errorf("%s:\n got %+v\nwant %+v", c.name, got, c.want)
		}
	}
}
