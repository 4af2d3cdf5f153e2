package dataplane_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// viewRecorder records the header list and target of each RequestHeaders
// it is shown.
type viewRecorder struct {
	mu      sync.Mutex
	headers [][][2]string
	targets []string
}

func (r *viewRecorder) handler() sdk.Handler {
	return &agentFuncs{Base: sdk.Base{Caps: headersOnly()}, reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, _ *protocol.Decision) error {
		var h [][2]string
		for _, f := range m.Headers {
			h = append(h, [2]string{string(f.Name), string(f.Value)})
		}
		r.mu.Lock()
		r.headers = append(r.headers, h)
		r.targets = append(r.targets, string(m.RequestTarget))
		r.mu.Unlock()
		return nil
	}}
}

func (r *viewRecorder) last(t *testing.T) ([][2]string, string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.headers) == 0 {
		t.Fatal("the agent saw no request")
	}
	return r.headers[len(r.headers)-1], r.targets[len(r.targets)-1]
}

// rawGet sends a raw request head to the proxy and wants a 200.
func rawGet(t *testing.T, addr, head string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(hangGuard))
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

// TestClientViewLargeOperationBatch: a reply with more operations than
// the scans handle (they go through the name index) reaches the next
// agent's client view as it reaches the upstream's list: sets in place,
// removes, adds at the end, in the order of the reply.
func TestClientViewLargeOperationBatch(t *testing.T) {
	batch := &agentFuncs{Base: sdk.Base{Caps: headersOnly()}, reqHeaders: func(_ context.Context, _ *protocol.RequestHeaders, d *protocol.Decision) error {
		set := func(k protocol.HeaderOpKind, n, v string) {
			d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: k, Name: []byte(n), Value: []byte(v)})
		}
		for i := 0; i < 10; i++ {
			set(protocol.HeaderSet, "x-b-"+strconv.Itoa(i), "v")
		}
		set(protocol.HeaderRemove, "X-Drop", "")
		set(protocol.HeaderSet, "x-keep", "agent")
		set(protocol.HeaderAdd, "x-keep", "again")
		return nil
	}}
	client, legacy := &viewRecorder{}, &viewRecorder{}
	u := newUpstream(t, nil)
	paths := map[string]string{"ops": serveAgent(t, batch), "c": serveAgent(t, client.handler()),
		"l": serveAgentUpstreamView(t, legacy.handler())}
	specs, agents := map[string]agentSpec{}, map[string]agentmux.Agent{}
	for name, path := range paths {
		specs[name] = agentSpec{Path: path}
		agents[name] = udsAgent(t, name, path, nil)
	}
	p := startProxy(t, configText(t, oneAgentConfig, map[string]any{"Upstream": u.addr(), "Chain": "ops, c, l", "Agents": specs}), agents, nil)
	rawGet(t, p.addr, "GET http://Example.COM./b?q HTTP/1.1\r\nHost: ignored.example\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nX-Drop: 1\r\nX-Keep: client\r\nX-Drop: 2\r\n\r\n")
	want := [][2]string{{"host", "example.com"}, {"connection", "keep-alive, X-Hop"}, {"x-hop", "1"}, {"x-keep", "agent"}}
	for i := 0; i < 10; i++ {
		want = append(want, [2]string{"x-b-" + strconv.Itoa(i), "v"})
	}
	want = append(want, [2]string{"x-keep", "again"})
	got, target := client.last(t)
	if !reflect.DeepEqual(got, want) || target != "http://Example.COM./b?q" {
		t.Errorf("client view %q (target %q)\nwant %q", got, target, want)
	}
	// The forwarded request's view got the same operations.
	lh, lt := legacy.last(t)
	if lt != "" {
		t.Errorf("upstream view carries request_target %q", lt)
	}
	var names []string
	for _, kv := range lh {
		names = append(names, kv[0]+"="+kv[1])
	}
	joined := strings.Join(names, " ")
	for _, w := range []string{"x-keep=agent", "x-b-9=v", "x-keep=again", "x-forwarded-for=127.0.0.1"} {
		if !strings.Contains(joined, w) {
			t.Errorf("upstream view %q lacks %s", joined, w)
		}
	}
	if strings.Contains(joined, "x-drop") || strings.Contains(joined, "x-hop") {
		t.Errorf("upstream view %q", joined)
	}
}

// TestClientViewCacheKey: a decision cache is keyed on the view its
// agent takes, at lookup as at store. Keyed on x-forwarded-for, a
// client_request agent's identical requests hit (the client's header),
// and a different claimed value is another key.
func TestClientViewCacheKey(t *testing.T) {
	u := newUpstream(t, nil)
	var calls atomic.Int64
	path := testutil.SocketPath(t)
	testagent.Serve(t, path, &agentFuncs{Base: sdk.Base{Caps: headersOnly()}, reqHeaders: func(context.Context, *protocol.RequestHeaders, *protocol.Decision) error {
		calls.Add(1)
		return nil
	}})
	cfg := configText(t, `
listeners:
  - name: test
    address: 127.0.0.1:0
upstreams:
  - name: app
    address: {{.Upstream}}
agents:
  - name: authz
    transport: uds
    address: {{.Path}}
    decision_cache:
      key: [method, path, "header:x-forwarded-for"]
      ttl: 1m
routes:
  - name: main
    upstream: app
    agents: [authz]
`, map[string]any{"Upstream": u.addr(), "Path": path})
	a := udsAgent(t, "authz", path, nil)
	if !a.Capabilities().SupportsClientRequest {
		t.Fatal("the agent did not negotiate client_request")
	}
	p := startProxy(t, cfg, map[string]agentmux.Agent{"authz": a}, nil)
	for i, xff := range []string{"198.51.100.1", "198.51.100.1", "198.51.100.1", "198.51.100.2"} {
		if resp, _ := p.do(t, "GET", "/k", nil, "x-forwarded-for", xff); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("agent asked %d times, want 2 (one per claimed x-forwarded-for)", n)
	}
}
