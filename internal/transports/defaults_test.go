package transports_test

import (
	"reflect"
	"testing"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/extproc"
	"github.com/zentinelproxy/sidecar/internal/grpcclient"
	"github.com/zentinelproxy/sidecar/internal/transports"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/reverse"
)

// TestDefaultsAgree: a transport's own defaults are the configuration
// file's, so that an agent configured with nothing set behaves like the
// transport used on its own (benchmarks, tools, tests).
func TestDefaultsAgree(t *testing.T) {
	cfg, err := config.Parse([]byte(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: "127.0.0.1:1"}]
agents:
  - {name: u, transport: uds, address: /run/u.sock}
  - {name: g, transport: grpc, address: "127.0.0.1:1"}
  - {name: e, transport: ext_proc, address: "127.0.0.1:1"}
  - {name: r, transport: reverse, address: "unix:/run/r.sock", options: {allow_no_token: "true"}}
routes: [{upstream: app, agents: [u, g, e, r]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	a := cfg.Agent("u")
	u := udsclient.DefaultConfig("u", "/run/u.sock")
	g := grpcclient.DefaultConfig("g", "127.0.0.1:1")
	e := extproc.DefaultConfig("e", "127.0.0.1:1")
	r := reverse.DefaultConfig()
	check := func(what string, got, want any) {
		t.Helper()
		if got != want {
			t.Errorf("%s: %v, the configuration's default is %v", what, got, want)
		}
	}
	check("uds message timeout", u.MessageTimeout, a.Timeouts.Message)
	check("grpc message timeout", g.MessageTimeout, a.Timeouts.Message)
	check("ext_proc message timeout", e.MessageTimeout, a.Timeouts.Message)
	check("reverse message timeout", r.MessageTimeout, a.Timeouts.Message)
	check("uds frame timeout", u.FrameTimeout, a.Timeouts.Frame)
	check("reverse frame timeout", r.FrameTimeout, a.Timeouts.Frame)
	check("uds max pending bytes", u.MaxPendingBytes, int(a.MaxPendingBytes))
	check("uds connect timeout", u.DialTimeout, a.Timeouts.Connect)
	check("uds handshake timeout", u.HandshakeTimeout, a.Timeouts.Handshake)
	check("grpc dial budget", g.DialTimeout, a.Timeouts.Connect+a.Timeouts.Handshake)
	check("ext_proc dial budget", e.DialTimeout, a.Timeouts.Connect+a.Timeouts.Handshake)
	for what, v := range map[string][2]int{
		"uds":      {u.MaxInFlight, u.MaxQueue},
		"grpc":     {g.MaxInFlight, g.MaxQueue},
		"ext_proc": {e.MaxInFlight, e.MaxQueue},
	} {
		check(what+" max in flight", v[0], a.MaxInFlight)
		check(what+" max queue", v[1], a.MaxQueue)
	}
	check("reverse max queue", r.MaxQueue, a.MaxQueue)
	check("reverse ping interval", r.PingInterval, u.PingInterval)
	check("reverse ping timeout", r.PingTimeout, u.PingTimeout)
	check("reverse write timeout", r.WriteTimeout, u.WriteTimeout)
	// And the mapping keeps them: what the file leaves unset reaches the
	// transport as its default.
	got := transports.UDSConfig(a, zerolog.Nop())
	got.Logger, u.Logger = zerolog.Nop(), zerolog.Nop()
	if !reflect.DeepEqual(got, u) {
		t.Errorf("uds config from defaults %+v, want %+v", got, u)
	}
}
