package dataplane_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

func allowWithOp(name string) func(protocol.MsgType, uint64) *protocol.Decision {
	return func(t protocol.MsgType, _ uint64) *protocol.Decision {
		d := &protocol.Decision{}
		if t == protocol.TypeRequestHeaders {
			d.RequestHeaderOps = []protocol.HeaderOp{{Op: protocol.HeaderAdd, Name: []byte("x-chain"), Value: []byte(name)}}
		}
		return d
	}
}

func TestChainOfThree(t *testing.T) {
	reqAndResp := protocol.Capabilities{HandlesRequestHeaders: true, HandlesResponseHeaders: true, SupportsCancellation: true}
	pathA, a := serveRaw(t, reqAndResp, allowWithOp("a"))
	pathB, b := serveRaw(t, reqAndResp, func(typ protocol.MsgType, _ uint64) *protocol.Decision {
		d := &protocol.Decision{}
		if typ == protocol.TypeRequestHeaders {
			d.RequestHeaderOps = []protocol.HeaderOp{{Op: protocol.HeaderAdd, Name: []byte("x-chain"), Value: []byte("b")}}
		}
		return d
	})
	pathC, c := serveRaw(t, reqAndResp, allowWithOp("c"))
	specs := map[string]agentSpec{"a": {Path: pathA}, "b": {Path: pathB}, "c": {Path: pathC}}
	p, up := setup(t, nil, []string{"a", "b", "c"}, nil, specs, nil)

	// All allow: operations accumulate in chain order; every agent sees
	// both phases.
	resp, _ := p.do(t, "GET", "/", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got := up.last(t).Header.Values("X-Chain"); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("x-chain %v, want [a b c]", got)
	}
	for name, r := range map[string]*rawAgent{"a": a, "b": b, "c": c} {
		if got := r.seen(); !slices.Equal(got, []string{"request_headers", "response_headers"}) {
			t.Errorf("agent %s saw %v", name, got)
		}
	}
}

func TestChainFirstNonAllowWins(t *testing.T) {
	reqAndResp := protocol.Capabilities{HandlesRequestHeaders: true, HandlesResponseHeaders: true, SupportsCancellation: true}
	pathA, a := serveRaw(t, reqAndResp, allowWithOp("a"))
	pathB, b := serveRaw(t, reqAndResp, func(typ protocol.MsgType, _ uint64) *protocol.Decision {
		return &protocol.Decision{Kind: protocol.DecisionBlock, Status: 403, Body: []byte("b says no")}
	})
	pathC, c := serveRaw(t, reqAndResp, allowWithOp("c"))
	specs := map[string]agentSpec{"a": {Path: pathA}, "b": {Path: pathB}, "c": {Path: pathC}}
	p, up := setup(t, nil, []string{"a", "b", "c"}, nil, specs, nil)

	resp, body := p.do(t, "GET", "/", nil)
	if resp.StatusCode != 403 || body != "b says no" || up.count() != 0 {
		t.Fatalf("got %d %q, upstream hits %d", resp.StatusCode, body, up.count())
	}
	// a had allowed and still expected the response: it is told the
	// request was decided. c never hears of the request.
	testutil.WaitFor(t, "a's CancelRequest", func() bool { return slices.Contains(a.seen(), "cancel:decided") })
	if got := a.seen(); !slices.Equal(got, []string{"request_headers", "cancel:decided"}) {
		t.Errorf("a saw %v", got)
	}
	if got := b.seen(); !slices.Equal(got, []string{"request_headers"}) {
		t.Errorf("b saw %v", got)
	}
	if got := c.seen(); len(got) != 0 {
		t.Errorf("c saw %v", got)
	}
}

// slowAgent answers request headers only after ctx ends or release closes.
func slowAgent(release chan struct{}, canceled chan struct{}) *agentFuncs {
	return &agentFuncs{Base: sdk.Base{Caps: headersOnly()}, reqHeaders: func(ctx context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
		select {
		case <-ctx.Done():
			if canceled != nil {
				select {
				case canceled <- struct{}{}:
				default:
				}
			}
		case <-release:
		}
		return nil
	}}
}

func TestFailurePolicies(t *testing.T) {
	for _, tc := range []struct {
		name, failure string
		down          bool
		wantStatus    int
	}{
		{"timeout-closed", "closed", false, 504},
		{"timeout-open", "open", false, 200},
		{"down-closed", "closed", true, 503},
		{"down-open", "open", true, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			defer close(release)
			u := newUpstream(t, nil)
			var path string
			if tc.down {
				path = testutil.SocketPath(t) // nothing listens here
			} else {
				path = serveAgent(t, slowAgent(release, nil))
			}
			cfg := configText(t, oneAgentConfig, map[string]any{
				"Upstream": u.addr(), "Chain": "a",
				"Agents": map[string]agentSpec{"a": {Path: path, Failure: tc.failure, Message: "100ms"}},
			})
			ucfg := udsclient.DefaultConfig("a", path)
			ucfg.MessageTimeout = 100 * time.Millisecond
			ucfg.BackoffMin, ucfg.BackoffMax = 5*time.Millisecond, 20*time.Millisecond
			client, err := udsclient.NewClient(ucfg)
			if err != nil {
				t.Fatal(err)
			}
			if !tc.down {
				ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
				if err := client.WaitReady(ctx); err != nil {
					t.Fatal(err)
				}
				cancel()
			}
			p := startProxy(t, cfg, map[string]agentmux.Agent{"a": client}, nil)
			resp, body := p.do(t, "GET", "/", nil)
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d, want %d (%q)", resp.StatusCode, tc.wantStatus, body)
			}
			st := p.srv.Stats()
			if tc.failure == "open" {
				if resp.Header.Get("X-Sidecar-Fail-Open") != "a" || u.last(t).Header.Get("X-Sidecar-Fail-Open") != "a" {
					t.Errorf("fail-open mark: response %q upstream %q", resp.Header.Get("X-Sidecar-Fail-Open"), u.last(t).Header.Get("X-Sidecar-Fail-Open"))
				}
				if st.FailOpen != 1 || body != "hello from upstream" {
					t.Errorf("fail-open counter %d body %q", st.FailOpen, body)
				}
				return
			}
			if u.count() != 0 || st.FailClosed != 1 {
				t.Errorf("upstream hits %d fail-closed counter %d", u.count(), st.FailClosed)
			}
			if strings.Contains(body, "agentmux") || strings.Contains(body, "timed out") {
				t.Errorf("internal error text leaked: %q", body)
			}
			if !strings.Contains(p.logs.String(), `"agent failed"`) {
				t.Errorf("failure not logged")
			}
		})
	}
}

func TestRequestTimeoutBudget(t *testing.T) {
	// Message timeout is generous; the per-request budget is what ends it.
	release := make(chan struct{})
	defer close(release)
	path := serveAgent(t, slowAgent(release, nil))
	u := newUpstream(t, nil)
	cfg := configText(t, oneAgentConfig, map[string]any{
		"Upstream": u.addr(), "Chain": "a",
		"Agents": map[string]agentSpec{"a": {Path: path, Message: "5s", Request: "100ms"}},
	})
	p := startProxy(t, cfg, map[string]agentmux.Agent{"a": udsAgent(t, "a", path, nil)}, nil)
	resp, _ := p.do(t, "GET", "/", nil)
	if resp.StatusCode != 504 {
		t.Fatalf("status %d, want 504", resp.StatusCode)
	}
}

func TestClientDisconnectCancelsAgent(t *testing.T) {
	canceled := make(chan struct{}, 1)
	release := make(chan struct{})
	defer close(release)
	agent := slowAgent(release, canceled)
	p, up := setup(t, nil, []string{"a"}, map[string]sdk.Handler{"a": agent}, map[string]agentSpec{"a": {Message: "10s", Request: "10s"}}, nil)
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
	time.Sleep(50 * time.Millisecond) // let the request reach the agent
	c.Close()
	select {
	case <-canceled:
	case <-time.After(hangGuard):
		t.Fatal("agent's context was not canceled after the client went away")
	}
	testutil.WaitFor(t, "client-gone counter", func() bool { return p.srv.Stats().ClientGone == 1 })
	if up.count() != 0 {
		t.Errorf("upstream contacted for a vanished client")
	}
}

func TestClientDisconnectAbortsUpstream(t *testing.T) {
	upstreamGone := make(chan struct{})
	p, _ := setup(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
			close(upstreamGone)
		case <-time.After(hangGuard):
		}
	}, nil, nil, nil, nil)
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
	time.Sleep(50 * time.Millisecond)
	c.Close()
	select {
	case <-upstreamGone:
	case <-time.After(hangGuard):
		t.Fatal("upstream request not aborted after the client went away")
	}
}

func TestUpstreamDownAndSlow(t *testing.T) {
	deadAddr := testutil.RefusedAddr(t)
	slow := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(hangGuard):
		}
	})
	for _, tc := range []struct {
		name, addr string
		want       int
	}{{"down", deadAddr, 502}, {"slow", slow.addr(), 504}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := configText(t, oneAgentConfig, map[string]any{"Upstream": tc.addr, "UpstreamTimeout": "150ms", "Chain": ""})
			p := startProxy(t, cfg, nil, nil)
			resp, body := p.do(t, "GET", "/", nil)
			if resp.StatusCode != tc.want || strings.Contains(body, "127.0.0.1") || strings.Contains(body, "fasthttp") {
				t.Fatalf("got %d %q, want %d with a generic body", resp.StatusCode, body, tc.want)
			}
		})
	}
}

func TestKeepAliveBothSides(t *testing.T) {
	conns := make(map[string]bool)
	var mu = make(chan struct{}, 1)
	p, _ := setup(t, func(w http.ResponseWriter, r *http.Request) {
		mu <- struct{}{}
		conns[r.RemoteAddr] = true
		<-mu
		w.Write([]byte("ok"))
	}, nil, nil, nil, nil)
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	for i := 0; i < 5; i++ {
		fmt.Fprintf(c, "GET /%d HTTP/1.1\r\nHost: x\r\n\r\n", i)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d on one client connection: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Close {
			t.Fatalf("request %d: status %d close %v", i, resp.StatusCode, resp.Close)
		}
	}
	if len(conns) != 1 {
		t.Errorf("upstream saw %d connections for 5 sequential requests", len(conns))
	}
}

func TestNoRouteAndConfigHosts(t *testing.T) {
	u := newUpstream(t, nil)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q}]
routes:
  - {name: api, hosts: [api.example.com], path_prefix: /v1, upstream: app}
  - {name: wild, hosts: ["*.example.com"], upstream: app, host_header: upstream}
`, u.addr())))
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, cfg, nil, nil)
	cases := []struct {
		host, path string
		want       int
		upHost     string
	}{
		{"api.example.com", "/v1/users", 200, "api.example.com"},
		{"API.example.com:80", "/v1", 200, "api.example.com:80"}, // canonical, the client's port kept
		{"a.b.example.com", "/x", 200, u.addr()},
		{"api.example.com", "/v2", 200, u.addr()}, // falls back to the wildcard
		{"other.org", "/v1", 404, ""},
	}
	for _, c := range cases {
		resp, body := p.do(t, "GET", c.path, nil, "Host", c.host)
		if resp.StatusCode != c.want {
			t.Errorf("%s%s: %d %q, want %d", c.host, c.path, resp.StatusCode, body, c.want)
			continue
		}
		if c.want == 200 && u.last(t).Host != c.upHost {
			t.Errorf("%s%s: upstream Host %q, want %q", c.host, c.path, u.last(t).Host, c.upHost)
		}
	}
}

func TestAgentErrorIsAFailure(t *testing.T) {
	for _, failure := range []string{"closed", "open"} {
		t.Run(failure, func(t *testing.T) {
			agent := &agentFuncs{Base: sdk.Base{Caps: headersOnly()}, reqHeaders: func(context.Context, *protocol.RequestHeaders, *protocol.Decision) error {
				return fmt.Errorf("database on fire")
			}}
			p, up := setup(t, nil, []string{"a"}, map[string]sdk.Handler{"a": agent}, map[string]agentSpec{"a": {Failure: failure}}, nil)
			resp, body := p.do(t, "GET", "/", nil)
			if failure == "closed" {
				if resp.StatusCode != 503 || body != "service unavailable" || up.count() != 0 {
					t.Fatalf("got %d %q upstream hits %d", resp.StatusCode, body, up.count())
				}
				return
			}
			if resp.StatusCode != 200 || resp.Header.Get("X-Sidecar-Fail-Open") != "a" {
				t.Fatalf("got %d mark %q", resp.StatusCode, resp.Header.Get("X-Sidecar-Fail-Open"))
			}
		})
	}
}
