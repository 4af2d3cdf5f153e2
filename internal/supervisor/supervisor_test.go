package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/examples/allowagent"
	"github.com/zentinelproxy/sidecar/internal/config"
	st "github.com/zentinelproxy/sidecar/internal/supervisor/supervisortest"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/sdk"
)

// shortAgentWait keeps tests with agents that never connect quick.
const shortAgentWait = 200 * time.Millisecond

func testLog(t *testing.T) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
}

// options returns the Options of a test sidecar reloading path.
func options(t *testing.T, path string) Options {
	o := DefaultOptions()
	o.Path, o.Log = path, testLog(t)
	return o
}

// startWith runs the sidecar of the file at path in this process with o
// and shuts it down when the test ends.
func startWith(t *testing.T, path string, o Options) *Supervisor {
	t.Helper()
	cfg, err := Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(context.Background(), cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), st.LongWait)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return s
}

// startInProcess runs the sidecar of the file at path with the default
// options.
func startInProcess(t *testing.T, path string) *Supervisor {
	t.Helper()
	return startWith(t, path, options(t, path))
}

func dataURL(s *Supervisor) string  { return "http://" + s.Addrs()[0].String() }
func adminURL(s *Supervisor) string { return "http://" + s.AdminAddr().String() }

// TestServe runs a configuration with a Unix socket listener (no port to
// race for), an upstream and a UDS agent until Run's context ends.
func TestServe(t *testing.T) {
	dir := testutil.SocketDir(t)
	up := st.StartUpstream(t, "app")
	agentSock := filepath.Join(dir, "allow.sock")
	aln, err := sdk.ListenUDS(agentSock, nil)
	if err != nil {
		t.Fatal(err)
	}
	agentCtx, stopAgent := context.WithCancel(context.Background())
	defer stopAgent()
	go func() { _ = sdk.Serve(agentCtx, aln, allowagent.New(false), nil) }()

	front := filepath.Join(dir, "front.sock")
	path := filepath.Join(dir, "sidecar.yaml")
	st.WriteConfig(t, path, `
listeners: [{address: "unix:`+front+`"}]
upstreams: [{name: app, address: "`+up.Addr+`"}]
agents: [{name: allow, transport: uds, address: "`+agentSock+`"}]
routes: [{upstream: app, agents: [allow]}]
admin: {address: "127.0.0.1:0"}
`)
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	o := DefaultOptions()
	o.Log, o.Drain = testLog(t), 5*time.Second
	s, err := Start(context.Background(), cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, nil) }()

	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", front)
		},
	}}
	resp, err := client.Get("http://sidecar.test/x")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Target") != "/x" || strings.TrimSpace(string(body)) != "app" {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
	}
	if err := s.Reload(); err == nil {
		t.Error("reload without a configuration file succeeded")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(st.LongWait):
		t.Fatal("run did not stop")
	}
	if _, err := client.Get("http://sidecar.test/x"); err == nil {
		t.Error("the listener still accepts after Run returned")
	}
}

func TestMetricsAfterKnownMix(t *testing.T) {
	dir := testutil.SocketDir(t)
	up := st.StartUpstream(t, "app")
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close() // nothing listens there: connections are refused
	policy := st.NewPolicyAgent()
	testagent.Serve(t, filepath.Join(dir, "policy.sock"), policy)

	path := filepath.Join(dir, "sidecar.yaml")
	st.WriteConfig(t, path, fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams:
  - {name: app, address: %q}
  - {name: dead, address: %q, connect_timeout: 2s}
agents:
  - {name: policy, transport: uds, address: %q, request_body: {mode: buffered}}
  - {name: down-open, transport: uds, address: %q, failure_mode: open}
  - {name: down-closed, transport: uds, address: %q}
routes:
  - {name: app, path_prefix: /app/, upstream: app, agents: [policy]}
  - {name: open, path_prefix: /open/, upstream: app, agents: [down-open]}
  - {name: closed, path_prefix: /closed/, upstream: app, agents: [down-closed]}
  - {name: broken, path_prefix: /broken/, upstream: dead}
admin: {address: "127.0.0.1:0"}
`, up.Addr, deadAddr, filepath.Join(dir, "policy.sock"), filepath.Join(dir, "none1.sock"), filepath.Join(dir, "none2.sock")))
	s := startInProcess(t, path)
	base := dataURL(s)

	mix := []struct {
		method, path string
		n, status    int
	}{
		{"GET", "/app/ok", 5, 200},
		{"POST", "/app/upload", 1, 200},
		{"GET", "/app/block", 3, 403},
		{"GET", "/app/redir", 2, 302},
		{"GET", "/open/x", 4, 200},
		{"GET", "/closed/x", 2, 503},
		{"GET", "/broken/x", 1, 502},
		{"GET", "/nowhere", 2, 404},
	}
	for _, m := range mix {
		for range m.n {
			var body io.Reader
			if m.method == "POST" {
				body = strings.NewReader(strings.Repeat("a", 1000))
			}
			req, _ := http.NewRequest(m.method, base+m.path, body)
			resp, err := st.NoRedirects.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != m.status {
				t.Fatalf("%s %s: %d, want %d", m.method, m.path, resp.StatusCode, m.status)
			}
		}
	}

	v := st.Scrape(t, adminURL(s))
	want := map[string]float64{
		`sidecar_requests_total{outcome="allowed",route="app"}`:                       6,
		`sidecar_requests_total{outcome="blocked",route="app"}`:                       3,
		`sidecar_requests_total{outcome="redirected",route="app"}`:                    2,
		`sidecar_requests_total{outcome="failed_open",route="open"}`:                  4,
		`sidecar_requests_total{outcome="failed_closed",route="closed"}`:              2,
		`sidecar_requests_total{outcome="upstream_error",route="broken"}`:             1,
		`sidecar_requests_total{outcome="rejected",route="(none)"}`:                   2,
		`sidecar_requests_total{outcome="failed_open",route="app"}`:                   0,
		`sidecar_request_duration_seconds_count{route="app"}`:                         11,
		`sidecar_agent_decisions_total{agent="policy",decision="allow"}`:              6,
		`sidecar_agent_decisions_total{agent="policy",decision="continue"}`:           0, // the body went inline with its headers
		`sidecar_agent_decisions_total{agent="policy",decision="block"}`:              3,
		`sidecar_agent_decisions_total{agent="policy",decision="redirect"}`:           2,
		`sidecar_agent_latency_seconds_count{agent="policy",phase="request_headers"}`: 11,
		`sidecar_agent_latency_seconds_count{agent="policy",phase="request_body"}`:    0,
		`sidecar_agent_inline_bodies_total`:                                           1,
		`sidecar_agent_errors_total{agent="down-open",kind="unavailable"}`:            4,
		`sidecar_agent_errors_total{agent="down-closed",kind="unavailable"}`:          2,
		`sidecar_agent_errors_total{agent="policy",kind="late_reply"}`:                0,
		`sidecar_agent_failures_total{agent="down-open",policy="open"}`:               4,
		`sidecar_agent_failures_total{agent="down-closed",policy="closed"}`:           2,
		`sidecar_upstream_errors_total{kind="error",route="broken"}`:                  1,
		`sidecar_body_bytes_total{direction="in",route="app"}`:                        1000,
		`sidecar_body_bytes_inspected_total{direction="request",route="app"}`:         1000,
		`sidecar_agent_connections{agent="policy",transport="uds"}`:                   1,
		`sidecar_agent_ready{agent="down-open"}`:                                      0,
		`sidecar_requests_in_flight`:                                                  0,
	}
	for k, w := range want {
		got, ok := v[k]
		if !ok {
			t.Errorf("%s: missing", k)
		} else if got != w {
			t.Errorf("%s = %v, want %v", k, got, w)
		}
	}
	// The fail-closed agent is down: not ready, and it says why.
	code, m := st.GetJSON(t, adminURL(s)+"/readyz")
	if code != 503 || !strings.Contains(fmt.Sprint(m["reason"]), "down-closed") {
		t.Errorf("readyz %d %v", code, m)
	}
}

// TestReadyzFollowsFailClosedAgent: /readyz is 200 while the fail-closed
// agent is connected, 503 naming it while it is down, 200 again when it
// is back; a fail-open agent that is down does not matter.
func TestReadyzFollowsFailClosedAgent(t *testing.T) {
	dir := testutil.SocketDir(t)
	up := st.StartUpstream(t, "app")
	guardSock := filepath.Join(dir, "guard.sock")
	stop := testagent.Serve(t, guardSock, st.NewPolicyAgent())
	path := filepath.Join(dir, "sidecar.yaml")
	st.WriteConfig(t, path, fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q}]
agents:
  - {name: guard, transport: uds, address: %q}
  - {name: extra, transport: uds, address: %q, failure_mode: open}
routes: [{upstream: app, agents: [guard, extra]}]
admin: {address: "127.0.0.1:0"}
`, up.Addr, guardSock, filepath.Join(dir, "none.sock")))
	o := options(t, path)
	o.AgentWait = shortAgentWait
	s := startWith(t, path, o)
	readyz := func(want int) map[string]any {
		var m map[string]any
		testutil.WaitFor(t, fmt.Sprintf("readyz %d", want), func() bool {
			var code int
			code, m = st.GetJSON(t, adminURL(s)+"/readyz")
			return code == want
		})
		return m
	}
	readyz(200)
	stop()
	m := readyz(503)
	if r := fmt.Sprint(m["reason"]); !strings.Contains(r, "guard") || strings.Contains(r, "extra") {
		t.Errorf("reason %q", r)
	}
	// While it is down, its requests fail closed.
	resp, err := http.Get(dataURL(s) + "/x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Errorf("request with the agent down: %d", resp.StatusCode)
	}
	testagent.Serve(t, guardSock, st.NewPolicyAgent())
	readyz(200)
	if code, _ := st.GetJSON(t, adminURL(s)+"/healthz"); code != 200 {
		t.Errorf("healthz %d", code)
	}
}

// TestShutdownDrains: Shutdown turns /readyz to 503 "shutting down" at
// once, stops accepting, and lets the request in flight finish.
func TestShutdownDrains(t *testing.T) {
	dir := testutil.SocketDir(t)
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		_, _ = io.WriteString(w, "late\n")
	})}
	go func() { _ = up.Serve(ln) }()
	defer up.Close()
	path := filepath.Join(dir, "sidecar.yaml")
	st.WriteConfig(t, path, fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q}]
routes: [{upstream: app}]
admin: {address: "127.0.0.1:0"}
`, ln.Addr().String()))
	cfg, err := Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(context.Background(), cfg, options(t, path))
	if err != nil {
		t.Fatal(err)
	}
	data, adm := dataURL(s), adminURL(s)
	if code, _ := st.GetJSON(t, adm+"/readyz"); code != 200 {
		t.Fatalf("readyz %d before shutdown", code)
	}
	type result struct {
		code int
		body string
		err  error
	}
	got := make(chan result, 1)
	go func() {
		resp, err := http.Get(data + "/held")
		if err != nil {
			got <- result{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- result{resp.StatusCode, string(b), err}
	}()
	<-arrived
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), st.LongWait)
		defer cancel()
		stopped <- s.Shutdown(ctx)
	}()
	testutil.WaitFor(t, "readyz 503 shutting down", func() bool {
		code, m := st.GetJSON(t, adm+"/readyz")
		return code == 503 && m["reason"] == "shutting down"
	})
	testutil.WaitFor(t, "the data listener closed", func() bool {
		c, err := net.Dial("tcp", strings.TrimPrefix(data, "http://"))
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	close(release)
	if r := <-got; r.err != nil || r.code != 200 || r.body != "late\n" {
		t.Errorf("the request in flight: %d %q %v", r.code, r.body, r.err)
	}
	if err := <-stopped; err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// TestAccessLogFile: with the access log on, a blocked and an allowed
// request each leave one line in the file, flushed on shutdown.
func TestAccessLogFile(t *testing.T) {
	dir := testutil.SocketDir(t)
	up := st.StartUpstream(t, "app")
	sock := filepath.Join(dir, "policy.sock")
	testagent.Serve(t, sock, st.NewPolicyAgent())
	logPath := filepath.Join(dir, "access.log")
	path := filepath.Join(dir, "sidecar.yaml")
	st.WriteConfig(t, path, fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q}]
agents: [{name: policy, transport: uds, address: %q}]
routes: [{name: main, upstream: app, agents: [policy]}]
admin: {enabled: false}
access_log: {enabled: true, output: %q}
`, up.Addr, sock, logPath))
	cfg, err := Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(context.Background(), cfg, options(t, path))
	if err != nil {
		t.Fatal(err)
	}
	if s.admin != nil || s.metrics != nil || s.AdminAddr() != nil {
		t.Error("admin listener or metrics running although disabled")
	}
	for _, p := range []string{"/block/me", "/fine"} {
		req, _ := http.NewRequest("GET", dataURL(s)+p, nil)
		req.Header.Set("X-Request-Id", "rid"+strings.ReplaceAll(p, "/", "-"))
		resp, err := st.NoRedirects.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), st.LongWait)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines:\n%s", len(lines), data)
	}
	var blocked, allowed map[string]any
	_ = json.Unmarshal([]byte(lines[0]), &blocked)
	_ = json.Unmarshal([]byte(lines[1]), &allowed)
	for k, v := range map[string]any{"outcome": "blocked", "status": 403.0, "agent": "policy", "route": "main", "corr": "rid-block-me", "path": "/block/me"} {
		if blocked[k] != v {
			t.Errorf("blocked line %s = %v, want %v (%s)", k, blocked[k], v, lines[0])
		}
	}
	if _, ok := blocked["agent_request_headers_us"]; !ok {
		t.Errorf("no agent time in %s", lines[0])
	}
	if allowed["outcome"] != "allowed" || allowed["status"] != 200.0 || allowed["bytes_out"] != 4.0 {
		t.Errorf("allowed line %s", lines[1])
	}
}

// TestReloadReverseListeners: a reload keeps an unchanged reverse
// listener and its connections, binds one at a new address, closes one
// whose address is gone, and refuses to change one in place.
func TestReloadReverseListeners(t *testing.T) {
	dir := testutil.SocketDir(t)
	up := st.StartUpstream(t, "app")
	rv1, rv2 := filepath.Join(dir, "rv1.sock"), filepath.Join(dir, "rv2.sock")
	path := filepath.Join(dir, "sidecar.yaml")
	conf := func(extraAgents, extraOpts, extraRoute string) string {
		return fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q}]
agents:
  - {name: rv1, transport: reverse, address: "unix:%s", failure_mode: open, options: {allow_no_token: "true"%s}}
%sroutes:
  - {name: main, upstream: app, agents: [rv1]}
%sadmin: {enabled: false}
`, up.Addr, rv1, extraOpts, extraAgents, extraRoute)
	}
	st.WriteConfig(t, path, conf("", "", ""))
	o := options(t, path)
	o.AgentWait = shortAgentWait
	s := startWith(t, path, o)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dial := func(sock, id string) {
		go func() {
			_ = sdk.DialAndServe(ctx, sdk.ReverseConfig{Address: sock, AgentID: id, BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond}, st.NewPolicyAgent())
		}()
	}
	connected := func(name string) bool {
		for _, a := range s.Agents() {
			if a.Name == name {
				return a.Connections > 0
			}
		}
		return false
	}
	dial(rv1, "rv1")
	testutil.WaitFor(t, "rv1 connected", func() bool { return connected("rv1") })
	first := s.agents.Listeners()[0]

	// A new route and a second reverse agent at a new address.
	st.WriteConfig(t, path, conf("  - {name: rv2, transport: reverse, address: \"unix:"+rv2+"\", failure_mode: open, options: {allow_no_token: \"true\"}}\n", "",
		"  - {name: two, path_prefix: /two/, upstream: app, agents: [rv2]}\n"))
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if s.agents.Listeners()[0] != first || !connected("rv1") {
		t.Error("the unchanged reverse listener was replaced")
	}
	dial(rv2, "rv2")
	testutil.WaitFor(t, "rv2 connected", func() bool { return connected("rv2") })

	// Changing rv1's listener in place is refused; nothing changes.
	st.WriteConfig(t, path, conf("", `, registration_timeout: "3s"`, ""))
	err := s.Reload()
	if err == nil || !errors.Is(err, config.ErrConfigInvalid) || !strings.Contains(err.Error(), "restart") {
		t.Fatalf("in-place change: %v", err)
	}
	if !connected("rv2") {
		t.Error("a refused reload dropped rv2")
	}

	// rv2's address is gone: its listener closes once idle.
	st.WriteConfig(t, path, conf("", "", ""))
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "rv2's listener closed", func() bool {
		c, err := net.Dial("unix", rv2)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	if !connected("rv1") || s.agents.Listeners()[0] != first {
		t.Error("rv1 lost its listener or connection")
	}
}

// TestReverseReport: a running sidecar's reverse agent describes itself
// and its listener, and both reach /status and /metrics through the
// agents' reports alone: two agents share the listener, whose series are
// exported once.
func TestReverseReport(t *testing.T) {
	dir := testutil.SocketDir(t)
	up := st.StartUpstream(t, "app")
	rv := filepath.Join(dir, "rv.sock")
	path := filepath.Join(dir, "sidecar.yaml")
	st.WriteConfig(t, path, fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q}]
agents:
  - {name: rv1, transport: reverse, address: "unix:%[2]s", failure_mode: open, options: {tokens: t1}}
  - {name: rv2, transport: reverse, address: "unix:%[2]s", failure_mode: open, options: {tokens: t2}}
routes:
  - {name: main, upstream: app, agents: [rv1, rv2]}
admin: {address: "127.0.0.1:0"}
`, up.Addr, rv))
	o := options(t, path)
	o.AgentWait = shortAgentWait
	s := startWith(t, path, o)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_ = sdk.DialAndServe(ctx, sdk.ReverseConfig{Address: rv, AgentID: "rv1", Token: "t1", BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond}, st.NewPolicyAgent())
	}()
	listener := "unix:" + rv
	testutil.WaitFor(t, "rv1 registered", func() bool {
		return st.Scrape(t, adminURL(s))[fmt.Sprintf(`sidecar_reverse_registrations_accepted_total{listener=%q}`, listener)] == 1
	})
	v := st.Scrape(t, adminURL(s))
	for key, want := range map[string]float64{
		`sidecar_agent_connections{agent="rv1",transport="reverse"}`:                                     1,
		`sidecar_agent_connections{agent="rv2",transport="reverse"}`:                                     0,
		fmt.Sprintf(`sidecar_reverse_connections{listener=%q,state="active"}`, listener):                 1,
		fmt.Sprintf(`sidecar_reverse_registrations_rejected_total{listener=%q,reason="auth"}`, listener): 0,
	} {
		if got, ok := v[key]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", key, got, ok, want)
		}
	}
	code, m := st.GetJSON(t, adminURL(s)+"/status")
	if code != 200 {
		t.Fatalf("/status: %d", code)
	}
	agents, _ := m["agents"].([]any)
	seen := 0
	for _, x := range agents {
		a, _ := x.(map[string]any)
		l, _ := a["listener"].(map[string]any)
		if l["address"] != listener || l["accepted"] != 1.0 {
			t.Errorf("/status agent %v: listener %v", a["name"], l)
		}
		seen++
	}
	if seen != 2 {
		t.Errorf("/status agents %v", agents)
	}
}
