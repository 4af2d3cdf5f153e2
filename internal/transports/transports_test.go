package transports_test

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/config"
	st "github.com/zentinelproxy/sidecar/internal/supervisor/supervisortest"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/internal/transports"
)

// Every field of config.Agent is either read by the transport when it
// builds the instance (and so in the key, for the transports that read
// it) or applied by the dataplane per request (never in the key). A new
// field must be added to one of these lists.
var (
	instanceFields = map[string][]string{ // field → transports whose key has it
		"Name":               {config.TransportUDS, config.TransportGRPC, config.TransportReverse, config.TransportExtProc},
		"Transport":          {config.TransportUDS, config.TransportGRPC, config.TransportReverse, config.TransportExtProc},
		"Address":            {config.TransportUDS, config.TransportGRPC, config.TransportReverse, config.TransportExtProc},
		"Conns":              {config.TransportUDS, config.TransportGRPC, config.TransportExtProc},
		"MaxInFlight":        {config.TransportUDS, config.TransportGRPC, config.TransportReverse, config.TransportExtProc},
		"MaxQueue":           {config.TransportUDS, config.TransportGRPC, config.TransportReverse, config.TransportExtProc},
		"Timeouts.Connect":   {config.TransportUDS, config.TransportGRPC, config.TransportExtProc},
		"Timeouts.Handshake": {config.TransportUDS, config.TransportGRPC, config.TransportExtProc},
		"Timeouts.Message":   {config.TransportUDS, config.TransportGRPC, config.TransportReverse, config.TransportExtProc},
		"Timeouts.Frame":     {config.TransportUDS, config.TransportReverse},
		"MaxPendingBytes":    {config.TransportUDS, config.TransportReverse},
		"PayloadEncoding":    {config.TransportUDS, config.TransportReverse},
		"Options":            {config.TransportUDS, config.TransportGRPC, config.TransportReverse, config.TransportExtProc},
		"Addresses":          {config.TransportUDS, config.TransportGRPC, config.TransportReverse, config.TransportExtProc},
		// Failover is read by the instance only with addresses (an
		// agentmux.Multi); the base agent here has none.
		"Failover": {},
	}
	policyFields = []string{"FailureMode", "FailureStatus", "Timeouts.Request", "RequestBody", "ResponseBody", "Limits",
		"CircuitBreaker", "Shadow", "ShadowQueue", "ShadowQueueBytes", "ShadowWorkers", "DecisionCache"}
)

// leaves lists the fields of config.Agent, Timeouts expanded.
func leaves() []string {
	var out []string
	at := reflect.TypeFor[config.Agent]()
	for i := range at.NumField() {
		f := at.Field(i)
		if f.Name == "Timeouts" {
			for j := range f.Type.NumField() {
				out = append(out, "Timeouts."+f.Type.Field(j).Name)
			}
			continue
		}
		out = append(out, f.Name)
	}
	return out
}

// change returns a copy of a with field changed.
func change(t *testing.T, a config.Agent, field string) config.Agent {
	t.Helper()
	a.Options = map[string]string{"k": "v"}
	b := a
	b.Options = map[string]string{"k": "w"}
	switch field {
	case "Name":
		b.Name += "x"
	case "Transport":
		b.Transport = map[string]string{config.TransportUDS: config.TransportGRPC}[a.Transport]
		if b.Transport == "" {
			b.Transport = config.TransportUDS
		}
	case "Address":
		b.Address += "x"
	case "Conns":
		b.Conns++
	case "MaxInFlight":
		b.MaxInFlight++
	case "MaxQueue":
		b.MaxQueue++
	case "Timeouts.Connect":
		b.Timeouts.Connect += time.Second
	case "Timeouts.Handshake":
		b.Timeouts.Handshake += time.Second
	case "Timeouts.Message":
		b.Timeouts.Message += time.Second
	case "Timeouts.Frame":
		b.Timeouts.Frame += time.Second
	case "MaxPendingBytes":
		b.MaxPendingBytes += 1 << 20
	case "PayloadEncoding":
		b.PayloadEncoding = config.EncodingJSON
	case "Timeouts.Request":
		b.Timeouts.Request += time.Second
	case "Options":
		return b
	case "FailureMode":
		b.FailureMode = config.FailOpen
	case "FailureStatus":
		b.FailureStatus = 502
	case "RequestBody":
		b.RequestBody.Mode, b.RequestBody.Limit = config.BodyStreaming, 7
	case "ResponseBody":
		b.ResponseBody.Mode = config.BodyBuffered
	case "Limits":
		b.Limits.HeaderOps, b.Limits.HeaderValue = 3, 5
	case "CircuitBreaker":
		b.CircuitBreaker.Failures = 4
	case "Shadow":
		b.Shadow = true
	case "ShadowQueue":
		b.ShadowQueue = 9
	case "ShadowWorkers":
		b.ShadowWorkers = 3
	case "ShadowQueueBytes":
		b.ShadowQueueBytes = 1 << 20
	case "DecisionCache":
		b.DecisionCache.Key = []string{config.KeyMethod}
	case "Addresses":
		b.Addresses = []string{"unix:/run/b.sock"}
	case "Failover":
		off := false
		b.Failover = &off
	default:
		t.Fatalf("config.Agent.%s is neither an instance nor a policy field: classify it in InstanceKey and here", field)
	}
	b.Options = a.Options
	return b
}

func TestInstanceKeyFields(t *testing.T) {
	for _, tr := range []string{config.TransportUDS, config.TransportGRPC, config.TransportReverse, config.TransportExtProc} {
		a := config.Agent{Name: "a", Transport: tr, Address: "unix:/run/a.sock", Conns: 1, MaxInFlight: 8, MaxQueue: 8,
			Timeouts:    config.AgentTimeouts{Connect: time.Second, Handshake: time.Second, Message: time.Second, Request: time.Second, Frame: time.Second},
			FailureMode: config.FailClosed}
		for _, field := range leaves() {
			t.Run(tr+"/"+field, func(t *testing.T) {
				x := change(t, a, field)
				a := a
				a.Options = map[string]string{"k": "v"}
				same := transports.InstanceKey(a) == transports.InstanceKey(x)
				want := true
				for _, u := range instanceFields[field] {
					if u == tr {
						want = false
					}
				}
				if same != want {
					t.Errorf("changing %s: same instance %v, want %v", field, same, want)
				}
			})
		}
	}
}

func TestInstanceKeyClassifiesEveryField(t *testing.T) {
	for _, f := range leaves() {
		_, inst := instanceFields[f]
		pol := false
		for _, p := range policyFields {
			pol = pol || p == f
		}
		if inst == pol {
			t.Errorf("config.Agent.%s: instance field %v, policy field %v; it must be exactly one", f, inst, pol)
		}
	}
}

func TestInstanceKeyNormalizes(t *testing.T) {
	a := config.Agent{Name: "a", Transport: config.TransportUDS, Address: "/run/a.sock"}
	b := a
	b.Address = "unix:/run/a.sock"
	if transports.InstanceKey(a) != transports.InstanceKey(b) {
		t.Error("uds: the unix: prefix made a different instance")
	}
	// gRPC dials within one budget: connect + handshake.
	g := config.Agent{Name: "g", Transport: config.TransportGRPC, Address: "127.0.0.1:1",
		Timeouts: config.AgentTimeouts{Connect: time.Second, Handshake: 2 * time.Second}}
	h := g
	h.Timeouts.Connect, h.Timeouts.Handshake = 2*time.Second, time.Second
	if transports.InstanceKey(g) != transports.InstanceKey(h) {
		t.Error("grpc: the same dial budget made a different instance")
	}
	// Options: order of insertion does not matter, nil and empty agree.
	o1, o2 := g, g
	o1.Options, o2.Options = map[string]string{"tls": "true", "tls_server_name": "x"}, map[string]string{"tls_server_name": "x", "tls": "true"}
	if transports.InstanceKey(o1) != transports.InstanceKey(o2) {
		t.Error("equal options made different instances")
	}
	o1.Options, o2.Options = nil, map[string]string{}
	if transports.InstanceKey(o1) != transports.InstanceKey(o2) {
		t.Error("nil and empty options made different instances")
	}
}

func TestDialingFactories(t *testing.T) {
	dir := testutil.SocketDir(t)
	sock := filepath.Join(dir, "a.sock")
	testagent.Serve(t, sock, st.NewPolicyAgent())
	cfg, err := config.Parse(fmt.Appendf(nil, `
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: "127.0.0.1:1"}]
agents:
  - {name: a, transport: uds, address: %q}
  - {name: g, transport: grpc, address: "127.0.0.1:1", options: {health_interval: 1s}}
  - {name: r, transport: reverse, address: "unix:%s/r.sock", options: {allow_no_token: "true"}}
routes: [{name: r, upstream: app, agents: [a, g, r]}]
`, sock, dir))
	if err != nil {
		t.Fatal(err)
	}
	if err := transports.Check(cfg); err != nil {
		t.Fatal(err)
	}
	f := transports.Dialing()
	if f[config.TransportReverse] != nil {
		t.Error("reverse agents have no dialing factory")
	}
	a, err := f[config.TransportUDS](cfg.Agent("a"), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	g, err := f[config.TransportGRPC](cfg.Agent("g"), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if a.Name() != "a" || a.Snapshot().Transport != "uds" || g.Snapshot().Transport != "grpc" {
		t.Fatalf("agents %+v %+v", a.Snapshot(), g.Snapshot())
	}
	ctx, cancel := context.WithTimeout(context.Background(), st.LongWait)
	defer cancel()
	for !a.Snapshot().Ready {
		select {
		case <-ctx.Done():
			t.Fatalf("uds agent not ready: %s", a.Snapshot().LastError)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if specs := transports.ReverseSpecs(cfg); len(specs) != 1 || specs[0].Name != "r" || specs[0].Options["allow_no_token"] != "true" {
		t.Errorf("reverse specs %+v", specs)
	}
}

// TestPayloadEncodingKey: agents[].payload_encoding defaults to auto,
// json reaches the UDS client and the reverse listener's agent as
// JSON-only, and another value is refused naming the key.
func TestPayloadEncodingKey(t *testing.T) {
	cfg, err := config.Parse([]byte(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: "127.0.0.1:1"}]
agents:
  - {name: u, transport: uds, address: /run/u.sock, payload_encoding: json}
  - {name: r, transport: reverse, address: "unix:/run/r.sock", payload_encoding: json, options: {allow_no_token: "true"}}
  - {name: d, transport: uds, address: /run/d.sock}
routes: [{upstream: app, agents: [u]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Agents[2].PayloadEncoding != config.EncodingAuto {
		t.Errorf("default payload_encoding %q, want auto", cfg.Agents[2].PayloadEncoding)
	}
	if !transports.UDSConfig(&cfg.Agents[0], zerolog.Nop()).JSONOnly || transports.UDSConfig(&cfg.Agents[2], zerolog.Nop()).JSONOnly {
		t.Error("payload_encoding json does not reach the UDS client as JSONOnly (or auto does)")
	}
	if specs := transports.ReverseSpecs(cfg); len(specs) != 1 || !specs[0].JSONOnly {
		t.Errorf("reverse specs %+v", specs)
	}
	_, err = config.Parse([]byte(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: "127.0.0.1:1"}]
agents: [{name: u, transport: uds, address: /run/u.sock, payload_encoding: xml}]
routes: [{upstream: app, agents: [u]}]
`))
	if err == nil || !strings.Contains(err.Error(), "payload_encoding") {
		t.Errorf("payload_encoding xml accepted: %v", err)
	}
}

// TestMaxPendingBytesKey: agents[].max_pending_bytes reaches the UDS
// client and the reverse listener's agent, and is validated.
func TestMaxPendingBytesKey(t *testing.T) {
	cfg, err := config.Parse([]byte(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: "127.0.0.1:1"}]
agents:
  - {name: u, transport: uds, address: /run/u.sock, max_pending_bytes: 1MiB}
  - {name: r, transport: reverse, address: "unix:/run/r.sock", max_pending_bytes: 2MiB, options: {allow_no_token: "true"}}
  - {name: d, transport: uds, address: /run/d.sock}
routes: [{upstream: app, agents: [u]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := transports.UDSConfig(&cfg.Agents[0], zerolog.Nop()).MaxPendingBytes; got != 1<<20 {
		t.Errorf("uds max pending %d, want 1MiB", got)
	}
	if got := transports.UDSConfig(&cfg.Agents[2], zerolog.Nop()).MaxPendingBytes; got != 4<<20 {
		t.Errorf("uds default max pending %d, want 4MiB", got)
	}
	specs := transports.ReverseSpecs(cfg)
	if len(specs) != 1 || specs[0].MaxPending != 2<<20 {
		t.Errorf("reverse specs %+v", specs)
	}
	_, err = config.Parse([]byte(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: "127.0.0.1:1"}]
agents: [{name: u, transport: uds, address: /run/u.sock, max_pending_bytes: 1KiB}]
routes: [{upstream: app, agents: [u]}]
`))
	if err == nil || !strings.Contains(err.Error(), "max_pending_bytes") {
		t.Errorf("1KiB accepted: %v", err)
	}
}
