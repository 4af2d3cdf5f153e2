package supervisor

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	st "github.com/zentinelproxy/sidecar/internal/supervisor/supervisortest"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// countingListener counts the connections the agent accepted.
type countingListener struct {
	net.Listener
	accepted atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// bodyAgent allows everything, tags requests with x-agent: its name
// (two bytes or more), and counts the request body bytes it was shown.
type bodyAgent struct {
	sdk.Base
	name      string
	bodyBytes atomic.Int64
}

func (a *bodyAgent) OnRequestHeaders(_ context.Context, _ *protocol.RequestHeaders, d *protocol.Decision) error {
	d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderSet, Name: []byte("x-agent"), Value: []byte(a.name)})
	return nil
}

func (a *bodyAgent) OnRequestBody(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
	a.bodyBytes.Add(int64(len(m.Data)))
	r.Pass()
	return nil
}

// serveCounting serves a bodyAgent named name on path, counting its
// connections.
func serveCounting(t *testing.T, path, name string) (*bodyAgent, *countingListener) {
	t.Helper()
	ln, err := sdk.ListenUDS(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	a := &bodyAgent{Base: sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true}}, name: name}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = sdk.Serve(ctx, cl, a, nil)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return a, cl
}

// post sends body to url and returns the status and the X-Sidecar-Fail-Open mark.
func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "text/plain", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("X-Sidecar-Fail-Open")
}

// TestReloadReusesInstanceByKey reloads through real requests: a change
// of only the policy the dataplane applies per request (body policy,
// header limits, failure mode) keeps the agent's instance and its
// connection, and the next request runs under the new policy; a change
// of address builds a new instance that connects to the new agent.
func TestReloadReusesInstanceByKey(t *testing.T) {
	dir := testutil.SocketDir(t)
	up := st.StartUpstream(t, "app")
	sockA, sockB := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock")
	agentA, lnA := serveCounting(t, sockA, "agent-a")
	agentB, lnB := serveCounting(t, sockB, "agent-b")
	down := filepath.Join(dir, "down.sock") // nothing listens there
	path := filepath.Join(dir, "sidecar.yaml")
	conf := func(addr, body, limits, downMode string) string {
		return fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q}]
agents:
  - {name: policy, transport: uds, address: %q, request_body: {mode: %s}, limits: %s}
  - {name: down, transport: uds, address: %q, failure_mode: %s}
routes:
  - {name: main, upstream: app, agents: [policy]}
  - {name: down, path_prefix: /down/, upstream: app, agents: [down]}
admin: {address: "127.0.0.1:0"}
`, up.Addr, addr, body, limits, down, downMode)
	}
	st.WriteConfig(t, path, conf(sockA, "none", "{}", "closed"))
	o := options(t, path)
	o.AgentWait = shortAgentWait
	s := startWith(t, path, o)
	base := dataURL(s)
	reload := func(content string) {
		t.Helper()
		st.WriteConfig(t, path, content)
		if err := s.Reload(); err != nil {
			t.Fatal(err)
		}
	}

	// Before: bodies are not shown to the agent; the down agent fails
	// closed.
	if code, _ := post(t, base+"/x", "12345"); code != 200 || agentA.bodyBytes.Load() != 0 {
		t.Fatalf("before: %d, the agent saw %d body bytes", code, agentA.bodyBytes.Load())
	}
	if code, mark := post(t, base+"/down/x", ""); code != 503 || mark != "" {
		t.Fatalf("down agent, fail closed: %d %q", code, mark)
	}
	policy, downInst := s.agents.Agent("policy"), s.agents.Agent("down")
	if lnA.accepted.Load() != 1 {
		t.Fatalf("agent a accepted %d connections", lnA.accepted.Load())
	}

	// Policy only: buffered bodies, fail open for the down agent.
	reload(conf(sockA, "buffered", "{}", "open"))
	if s.agents.Agent("policy") != policy || s.agents.Agent("down") != downInst {
		t.Fatal("a policy change replaced an agent instance")
	}
	// The new policies apply to the next request.
	if code, mark := post(t, base+"/down/x", ""); code != 200 || mark != "down" {
		t.Fatalf("down agent, fail open after reload: %d %q", code, mark)
	}
	if code, _ := post(t, base+"/x", "12345"); code != 200 || agentA.bodyBytes.Load() != 5 {
		t.Fatalf("buffered after reload: %d, the agent saw %d body bytes, want 5", code, agentA.bodyBytes.Load())
	}

	// Policy only: a header value limit the agent's x-agent header
	// exceeds. Its reply is refused and the agent (fail-closed) fails the
	// request.
	reload(conf(sockA, "buffered", "{header_value: 1B}", "open"))
	if code, _ := post(t, base+"/x", ""); code != 503 {
		t.Fatalf("reply over the new header limit: %d", code)
	}
	reload(conf(sockA, "buffered", "{}", "open"))
	if code, _ := post(t, base+"/x", ""); code != 200 {
		t.Fatalf("default limits again: %d", code)
	}
	if s.agents.Agent("policy") != policy || lnA.accepted.Load() != 1 {
		t.Fatalf("instance replaced or reconnected: %d connections to a", lnA.accepted.Load())
	}
	if snap := policy.Snapshot(); !snap.Ready || snap.Completed == 0 {
		t.Fatalf("the kept instance: %+v", snap)
	}

	// A new address: a new instance, connected to agent b before the
	// swap; agent a's old instance is closed.
	reload(conf(sockB, "buffered", "{}", "open"))
	if s.agents.Agent("policy") == policy {
		t.Fatal("an address change kept the instance")
	}
	if lnB.accepted.Load() != 1 {
		t.Fatalf("agent b accepted %d connections", lnB.accepted.Load())
	}
	resp, err := http.Get(base + "/x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || agentB.bodyBytes.Load() != 0 {
		t.Fatalf("after the address change: %d", resp.StatusCode)
	}
	testutil.WaitFor(t, "the old instance closed", func() bool { return !policy.Snapshot().Ready })
	if lnA.accepted.Load() != 1 {
		t.Errorf("agent a accepted %d connections after it was dropped", lnA.accepted.Load())
	}
}
