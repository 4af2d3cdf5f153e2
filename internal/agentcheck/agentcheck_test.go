package agentcheck

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/examples/allowagent"
	"github.com/zentinelproxy/sidecar/examples/demoagent"
	"github.com/zentinelproxy/sidecar/examples/wafagent"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/sdk/grpcsdk"
)

// serve starts h over transport and returns the address agent-check
// uses. For reverse the agent dials addr, where Run will listen.
func serve(t *testing.T, transport string, h sdk.Handler) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("agent did not stop")
		}
	})
	dir := testutil.SocketDir(t)
	addr := filepath.Join(dir, "a.sock")
	switch transport {
	case TransportUDS:
		ln, err := sdk.ListenUDS(addr, nil)
		if err != nil {
			t.Fatal(err)
		}
		go func() { defer close(done); _ = sdk.Serve(ctx, ln, h, &sdk.Options{Name: "test"}) }()
	case TransportGRPC:
		ln, err := net.Listen("unix", addr)
		if err != nil {
			t.Fatal(err)
		}
		go func() { defer close(done); _ = grpcsdk.Serve(ctx, ln, h, &grpcsdk.Options{Name: "test"}) }()
	case TransportReverse:
		go func() {
			defer close(done)
			_ = sdk.DialAndServe(ctx, sdk.ReverseConfig{Address: addr, AgentID: "test-1", Token: "s3cret",
				BackoffMin: 20 * time.Millisecond, BackoffMax: 500 * time.Millisecond}, h)
		}()
	}
	return addr
}

func run(t *testing.T, cfg Config) *Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func dump(t *testing.T, rep *Report) {
	t.Helper()
	var b strings.Builder
	_ = rep.WriteTable(&b)
	t.Log("\n" + b.String())
}

// wantAllPass fails t unless every result is PASS, or SKIP for a check
// that does not apply to the transport.
func wantAllPass(t *testing.T, rep *Report) {
	t.Helper()
	bad := false
	for _, r := range rep.Results {
		if r.Status != Pass && r.Status != Skip {
			bad = true
			t.Errorf("%s: %s: %s", r.ID, r.Status, r.Detail)
		}
	}
	if bad {
		dump(t, rep)
	}
}

func newDemo(t *testing.T) sdk.Handler {
	h, err := demoagent.New(demoagent.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	return h
}

var exampleAgents = []struct {
	name string
	h    func(t *testing.T) sdk.Handler
}{
	{"demoagent", newDemo},
	{"allowagent", func(*testing.T) sdk.Handler { return allowagent.New(false) }},
	{"allowagent-body", func(*testing.T) sdk.Handler { return allowagent.New(true) }},
	{"wafagent", func(*testing.T) sdk.Handler { return wafagent.New() }},
}

// TestExampleAgents runs every check against every Go example agent over
// every transport the SDK serves: all PASS (or SKIP where a check does not
// apply to the transport).
func TestExampleAgents(t *testing.T) {
	for _, a := range exampleAgents {
		for _, tr := range []string{TransportUDS, TransportGRPC, TransportReverse} {
			t.Run(a.name+"/"+tr, func(t *testing.T) {
				addr := serve(t, tr, a.h(t))
				rep := run(t, Config{Transport: tr, Address: addr, Token: "s3cret", Requests: 300})
				wantAllPass(t, rep)
				for _, id := range []string{"ping", "correlation", "phases", "early-close"} {
					if r := rep.Find(id); r == nil || r.Status != Pass {
						t.Errorf("%s did not PASS: %+v", id, r)
					}
				}
				if rep.Soak == nil || rep.Soak.Requests != 300 || rep.Soak.Decisions < 300 || rep.Soak.Errors != 0 {
					t.Errorf("soak: %+v", rep.Soak)
				}
				skipped := 0
				for _, r := range rep.Results {
					if r.Status == Skip {
						skipped++
					}
				}
				// Only transport-specific checks may be skipped.
				if max := map[string]int{TransportUDS: 2, TransportGRPC: 6, TransportReverse: 2}[tr]; skipped > max+1 {
					t.Errorf("%d checks skipped", skipped)
				}
			})
		}
	}
}

// TestReverseWrongToken: a registration with another token is refused and
// reported, never served.
func TestReverseWrongToken(t *testing.T) {
	addr := serve(t, TransportReverse, allowagent.New(false))
	rep := run(t, Config{Transport: TransportReverse, Address: addr, Token: "other", Only: []string{"registration"}, ReconnectWait: 5 * time.Second})
	r := rep.Find("registration")
	if r == nil || r.Status != Fail || !strings.Contains(r.Detail, "auth_token") {
		dump(t, rep)
		t.Fatalf("registration: %+v", r)
	}
}

// TestSilentAgent: an agent that accepts connections and never answers
// makes every check fail within its bound; nothing hangs.
func TestSilentAgent(t *testing.T) {
	addr := filepath.Join(testutil.SocketDir(t), "silent.sock")
	ln, err := net.Listen("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	var conns []net.Conn
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, nc) // held open, never read
		}
	}()
	rep := run(t, Config{Address: addr, Timeout: 200 * time.Millisecond, Requests: 10})
	if r := rep.Find("handshake"); r == nil || r.Status != Fail || !strings.Contains(r.Detail, "timed out") {
		dump(t, rep)
		t.Fatalf("handshake: %+v", r)
	}
	if !rep.Failed() {
		t.Fatal("no FAIL")
	}
}

// TestUnreachable: nothing at the address is one error naming it, and no
// check runs (each would fail on the same dial error).
func TestUnreachable(t *testing.T) {
	dir := testutil.SocketDir(t)
	file := filepath.Join(dir, "file.sock")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Address: filepath.Join(dir, "none.sock")}, "cannot connect to " + filepath.Join(dir, "none.sock") + ": no such file or directory"},
		{Config{Address: file}, "cannot connect to " + file + ": it exists and is not a socket (connection refused)"},
		{Config{Transport: TransportGRPC, Address: closed}, "cannot connect to " + closed + ": connection refused"},
		{Config{Transport: TransportReverse, Address: filepath.Join(dir, "rev.sock"), ReconnectWait: 100 * time.Millisecond},
			"cannot connect to " + filepath.Join(dir, "rev.sock") + ": no agent connected within 100ms (-reconnect-wait)"},
	} {
		rep, err := Run(context.Background(), c.cfg)
		var ue *UnreachableError
		if rep != nil || !errors.Is(err, ErrUnreachable) || !errors.As(err, &ue) || err.Error() != c.want {
			t.Errorf("%s %s: report %v, error %v; want %q", c.cfg.Transport, c.cfg.Address, rep, err, c.want)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []Config{{Transport: "tcp", Address: "x"}, {Transport: "uds"}, {Address: "x", Soak: -time.Second}} {
		if _, err := Run(context.Background(), c); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

func TestReportOutput(t *testing.T) {
	rep := &Report{Transport: "uds", Address: "/x", Results: []Result{
		{ID: "ping", Status: Pass, Detail: "ok"},
		{ID: "phases", Status: Fail, Detail: "bad", Rule: "docs/protocol.md §7.2", Sent: []string{"0x10 RequestHeaders {}"}, Received: []string{"0x21 BodyMutation {}"}},
	}}
	var b strings.Builder
	if err := rep.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"FAIL phases", "rule: docs/protocol.md §7.2", "sent:     0x10", "received: 0x21", "1 PASS, 0 WARN, 1 FAIL"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	if err := rep.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), `"status": "FAIL"`) || !strings.Contains(b.String(), `"FAIL": 1`) {
		t.Errorf("json: %s", b.String())
	}
	if !rep.Failed() {
		t.Error("Failed false")
	}
}

// TestExampleAgentsProtobuf runs every check on protobuf payloads
// (-payload-encoding protobuf) over UDS and reverse connections: the SDK
// speaks them, so all PASS; only the checks that send hand-made JSON
// bytes are skipped.
func TestExampleAgentsProtobuf(t *testing.T) {
	for _, a := range []int{0, 2} { // demoagent, allowagent-body
		a := exampleAgents[a]
		for _, tr := range []string{TransportUDS, TransportReverse} {
			t.Run(a.name+"/"+tr, func(t *testing.T) {
				addr := serve(t, tr, a.h(t))
				rep := run(t, Config{Transport: tr, Address: addr, Token: "s3cret", Requests: 300, PayloadEncoding: protocol.EncodingProtobuf})
				wantAllPass(t, rep)
				setup := map[string]string{TransportUDS: "handshake", TransportReverse: "registration"}[tr]
				for _, id := range []string{setup, "ping", "correlation", "phases", "early-close", "unknown-frames", "malformed-json"} {
					if r := rep.Find(id); r == nil || r.Status != Pass {
						t.Errorf("%s did not PASS: %+v", id, r)
					}
				}
				if rep.Soak == nil || rep.Soak.Requests != 300 || rep.Soak.Decisions < 300 || rep.Soak.Errors != 0 {
					t.Errorf("soak: %+v", rep.Soak)
				}
			})
		}
	}
}

// TestProtobufRequiresTheCapability: asked to check protobuf payloads, the
// checker fails the setup of an agent that keeps JSON, naming the
// capability, instead of misreading its frames.
func TestProtobufRequiresTheCapability(t *testing.T) {
	dir := testutil.SocketDir(t)
	addr := filepath.Join(dir, "a.sock")
	testagent.ServeWith(t, addr, allowagent.New(false), &sdk.Options{Name: "json-only", JSONPayloads: true})
	rep := run(t, Config{Transport: TransportUDS, Address: addr, Only: []string{"handshake"}, PayloadEncoding: protocol.EncodingProtobuf})
	r := rep.Find("handshake")
	if r == nil || r.Status != Fail || !strings.Contains(r.Detail, "supports_protobuf_payloads") {
		dump(t, rep)
		t.Fatalf("handshake result %+v, want FAIL naming supports_protobuf_payloads", r)
	}
}
