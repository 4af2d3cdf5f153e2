package config_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/config"
)

const base = `listeners:
  - address: 127.0.0.1:8080
upstreams:
  - name: app
    address: 127.0.0.1:9000
agents:
  - name: waf
    transport: uds
    address: /run/waf.sock
routes:
  - name: r
    upstream: app
    agents: [waf]
`

func TestExampleConfig(t *testing.T) {
	c, err := config.Load("../../testdata/config/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Routes) != 2 || len(c.Agents) != 2 {
		t.Fatalf("routes %d agents %d", len(c.Routes), len(c.Agents))
	}
	l := c.Listeners[0]
	if l.MaxRequestBody != 64<<20 || l.ReadBufferSize != 16<<10 || l.DisconnectCheck != 100*time.Millisecond {
		t.Errorf("listener %+v", l)
	}
	waf := c.Policy(&c.Routes[0].Agents[1])
	if waf.FailOpen || waf.RequestBody.Limit != 256<<10 || waf.RequestBody.OverLimit != "skip" || waf.RequestBody.Mode != "buffered" {
		t.Errorf("route override not applied: %+v", waf)
	}
	if waf.ResponseBody.Mode != "none" || waf.Timeout != 5*time.Second {
		t.Errorf("waf policy %+v", waf)
	}
	auth := c.Policy(&c.Routes[1].Agents[0])
	if auth.FailOpen || auth.Timeout != time.Second || auth.RequestBody.Mode != "auto" || auth.RequestBody.OverLimit != "reject" || auth.ResponseBody.OverLimit != "skip" {
		t.Errorf("auth policy %+v", auth)
	}
	if c.Agents[0].Timeouts.Message != 200*time.Millisecond || c.Agents[0].Conns != 2 || c.Agents[1].Conns != 1 {
		t.Errorf("agents %+v", c.Agents)
	}
	if r := c.Routes[1]; r.PathPrefix != "/" || r.HostHeader != "preserve" || len(r.Hosts) != 0 {
		t.Errorf("route defaults %+v", r)
	}
}

func TestMinimalConfigDefaults(t *testing.T) {
	c, err := config.Parse([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	a := c.Agents[0]
	if a.FailureMode != "closed" || a.Timeouts.Message != time.Second || a.RequestBody.ChunkSize != 64<<10 || a.MaxInFlight != 1024 {
		t.Errorf("agent defaults %+v", a)
	}
	if c.Logging.Level != "info" || c.Logging.Format != "json" || c.Listeners[0].Name == "" {
		t.Errorf("defaults %+v %+v", c.Logging, c.Listeners[0])
	}
}

// TestBadConfigs checks each error names the key and its line.
func TestBadConfigs(t *testing.T) {
	cases := []struct {
		name, yaml, want string
		syntax           bool
	}{
		{"unknown route agent", strings.Replace(base, "agents: [waf]", "agents: [waf, auth]", 1),
			`config: line 13: routes[0].agents[1]: unknown agent "auth"`, false},
		{"unknown key", strings.Replace(base, "    address: 127.0.0.1:9000", "    adress: 127.0.0.1:9000", 1),
			`config: line 5: upstreams[0].adress: unknown key (known: address,`, true},
		{"unknown top-level key", base + "metrics: {}\n", `config: line 14: metrics: unknown key`, true},
		{"bad transport", strings.Replace(base, "transport: uds", "transport: carrier-pigeon", 1),
			`config: line 8: agents[0].transport: unknown transport "carrier-pigeon"`, false},
		{"bad duration", strings.Replace(base, "    address: /run/waf.sock", "    address: /run/waf.sock\n    timeouts: {message: fast}", 1),
			`config: line 10: agents[0].timeouts.message: invalid duration "fast"`, true},
		{"bad size", strings.Replace(base, "    address: /run/waf.sock", "    address: /run/waf.sock\n    request_body:\n      limit: 1 parsec", 1),
			`config: line 11: agents[0].request_body.limit: invalid size "1 parsec"`, true},
		{"chunk too big", strings.Replace(base, "    address: /run/waf.sock", "    address: /run/waf.sock\n    request_body:\n      chunk_size: 16MiB", 1),
			`config: line 11: agents[0].request_body.chunk_size: 16MiB is not in 1KiB..4MiB`, false},
		{"unknown upstream", strings.Replace(base, "    upstream: app", "    upstream: api", 1),
			`config: line 12: routes[0].upstream: unknown upstream "api"`, false},
		{"bad failure mode", strings.Replace(base, "    address: /run/waf.sock", "    address: /run/waf.sock\n    failure_mode: sideways", 1),
			`config: line 10: agents[0].failure_mode: unknown failure mode "sideways"`, false},
		{"route override", strings.Replace(base, "agents: [waf]", "agents:\n      - name: waf\n        failure_mode: maybe", 1),
			`config: line 15: routes[0].agents[0].failure_mode: unknown failure mode "maybe"`, false},
		{"duplicate agent name", strings.Replace(base, "routes:", "  - name: waf\n    transport: uds\n    address: /x.sock\nroutes:", 1),
			`config: line 10: agents[1].name: duplicate agent name "waf"`, false},
		{"bad listener address", strings.Replace(base, "127.0.0.1:8080", "localhost", 1),
			`config: line 2: listeners[0].address: "localhost" is not host:port or unix:/path`, false},
		{"no listeners", strings.Replace(base, "listeners:\n  - address: 127.0.0.1:8080\n", "", 1),
			`config: listeners: at least one listener is required`, false},
		{"bad path prefix", strings.Replace(base, "    upstream: app\n    agents", "    upstream: app\n    path_prefix: api\n    agents", 1),
			`config: line 13: routes[0].path_prefix: "api" must start with /`, false},
		{"bad host", strings.Replace(base, "    upstream: app\n    agents", "    upstream: app\n    hosts: [\"a b\"]\n    agents", 1),
			`config: line 13: routes[0].hosts[0]: "a b" is not a host name`, false},
		{"duplicate route", base + "  - name: r2\n    upstream: app\n",
			`config: line 14: routes[1].hosts[0]: host "*" with path_prefix "/" is already routed by routes[0]`, false},
		{"list where mapping", strings.Replace(base, "    address: /run/waf.sock", "    address: /run/waf.sock\n    timeouts: [1s]", 1),
			`config: line 10: agents[0].timeouts: expected a mapping, got a list`, true},
		{"duplicate key", strings.Replace(base, "    address: /run/waf.sock", "    address: /run/waf.sock\n    address: /b.sock", 1),
			`config: line 10: agents[0].address: duplicate key`, true},
		{"bad name", strings.Replace(base, "name: waf\n", "name: \"w a f\"\n", 1),
			`config: line 7: agents[0].name: agent name "w a f" may only contain`, false},
		{"bad level", base + "logging: {level: loud}\n",
			`config: line 14: logging.level: unknown level "loud"`, false},
		{"yaml syntax", "listeners: [\n", `config: syntax error: yaml: line 1:`, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := config.Parse([]byte(c.yaml))
			if err == nil {
				t.Fatalf("accepted:\n%s", c.yaml)
			}
			if !strings.HasPrefix(err.Error(), c.want) {
				t.Fatalf("error %q\nwant prefix %q", err, c.want)
			}
			want := config.ErrConfigInvalid
			if c.syntax {
				want = config.ErrConfigSyntax
			}
			if !errors.Is(err, want) {
				t.Errorf("error %v is not %v", err, want)
			}
		})
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]config.Size{"0": 0, "512": 512, "64KiB": 64 << 10, "1 MiB": 1 << 20, "2GiB": 2 << 30, "1KB": 1000, "3MB": 3e6} {
		got, err := config.ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "1XB", "MiB", "99999999999GiB"} {
		if _, err := config.ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) accepted", bad)
		}
	}
}

func TestValidateProgrammaticConfig(t *testing.T) {
	c := &config.Config{
		Listeners: []config.Listener{{Address: "127.0.0.1:0"}},
		Upstreams: []config.Upstream{{Name: "app", Address: "127.0.0.1:1"}},
		Routes:    []config.Route{{Name: "r", Upstream: "app", Agents: []config.RouteAgent{{Name: "ghost"}}}},
	}
	c.SetDefaults()
	err := c.Validate()
	if err == nil || err.Error() != `config: routes[0].agents[0]: unknown agent "ghost"` {
		t.Fatalf("got %v", err)
	}
}

func TestLoggingLogger(t *testing.T) {
	var json, console strings.Builder
	jl := config.Logging{Level: "warn", Format: "json"}.Logger(&json)
	jl.Info().Msg("hidden")
	jl.Warn().Msg("shown")
	cl := config.Logging{Level: "debug", Format: "console"}.Logger(&console)
	cl.Debug().Msg("hello")
	if strings.Contains(json.String(), "hidden") || !strings.Contains(json.String(), `"message":"shown"`) {
		t.Errorf("json log %q", json.String())
	}
	if !strings.Contains(console.String(), "hello") || strings.HasPrefix(console.String(), "{") {
		t.Errorf("console log %q", console.String())
	}
}
