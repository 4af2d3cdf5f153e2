package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/dataplane"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/metrics"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// start serves cfg on a free loopback port until the test ends.
func start(t *testing.T, cfg Config) (*Server, string) {
	t.Helper()
	cfg.Address = "127.0.0.1:0"
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return s, "http://" + s.Addr().String()
}

func do(t *testing.T, method, url string, hdr map[string]string) (int, map[string]any, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatalf("%s %s: body %q: %v", method, url, body, err)
		}
	}
	return resp.StatusCode, m, string(body)
}

func TestHealthAndReady(t *testing.T) {
	var ready atomic.Bool
	s, base := start(t, Config{Ready: func() (bool, string) {
		if ready.Load() {
			return true, ""
		}
		return false, "listeners not up"
	}})
	if code, _, _ := do(t, "GET", base+"/healthz", nil); code != 200 {
		t.Errorf("healthz %d", code)
	}
	code, m, _ := do(t, "GET", base+"/readyz", nil)
	if code != 503 || m["reason"] != "listeners not up" || m["ready"] != false {
		t.Errorf("readyz before ready: %d %v", code, m)
	}
	ready.Store(true)
	if code, m, _ := do(t, "GET", base+"/readyz", nil); code != 200 || m["ready"] != true {
		t.Errorf("readyz when ready: %d %v", code, m)
	}
	s.SetDraining()
	if code, m, _ := do(t, "GET", base+"/readyz", nil); code != 503 || m["reason"] != "shutting down" {
		t.Errorf("readyz while draining: %d %v", code, m)
	}
	// Liveness does not follow readiness.
	if code, _, _ := do(t, "GET", base+"/healthz", nil); code != 200 {
		t.Errorf("healthz while draining %d", code)
	}
	for _, p := range []string{"/healthz", "/readyz", "/status"} {
		if code, _, _ := do(t, "POST", base+p, nil); code != http.StatusMethodNotAllowed {
			t.Errorf("POST %s: %d, want 405", p, code)
		}
	}
	if code, _, _ := do(t, "GET", base+"/nothing", nil); code != 404 {
		t.Errorf("unknown path: %d", code)
	}
	// No gatherer: no /metrics.
	if code, _, _ := do(t, "GET", base+"/metrics", nil); code != 404 {
		t.Errorf("metrics without gatherer: %d", code)
	}
}

func TestMetricsEndpoint(t *testing.T) {
	m, err := metrics.New(metrics.Config{Version: "v9"})
	if err != nil {
		t.Fatal(err)
	}
	m.Reset([]string{"api"}, []string{"waf"})
	m.RecordRequest(&dataplane.RequestSummary{Route: 0, Outcome: dataplane.RequestBlocked, Agent: 0, Status: 403})
	_, base := start(t, Config{Gatherer: m.Registry()})
	code, _, body := do(t, "GET", base+"/metrics", nil)
	if code != 200 {
		t.Fatalf("metrics %d", code)
	}
	for _, want := range []string{
		`sidecar_requests_total{outcome="blocked",route="api"} 1`,
		`sidecar_build_info{go_version=`,
		`go_goroutines `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestStatus(t *testing.T) {
	agents := []agentmux.AgentStatus{{Name: "waf", Transport: "uds", Connections: 1, Ready: true, InFlight: 2}}
	s, base := start(t, Config{
		Version: "v1.0.0",
		Routes:  func() []string { return []string{"api", "static"} },
		Agents:  func() []agentmux.AgentStatus { return agents },
		Stats:   func() dataplane.Stats { return dataplane.Stats{Requests: 12, InFlight: 3} },
		Reload:  func() error { return nil },
	})
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	code, _, body := do(t, "GET", base+"/status", nil)
	if code != 200 {
		t.Fatalf("status %d", code)
	}
	var st Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	if st.Version != "v1.0.0" || !st.Ready || len(st.Routes) != 2 || st.Routes[1] != "static" {
		t.Errorf("status %+v", st)
	}
	if len(st.Agents) != 1 || st.Agents[0].Name != "waf" || st.Agents[0].InFlight != 2 || !st.Agents[0].Ready {
		t.Errorf("agents %+v", st.Agents)
	}
	if st.Requests == nil || st.Requests.Requests != 12 || st.Requests.InFlight != 3 {
		t.Errorf("requests %+v", st.Requests)
	}
	if st.Reload.Count != 1 || st.Reload.Failures != 0 || st.Reload.LastSuccess.IsZero() {
		t.Errorf("reload %+v", st.Reload)
	}
	if st.UptimeSeconds < 0 || st.Started.IsZero() {
		t.Errorf("uptime %v started %v", st.UptimeSeconds, st.Started)
	}
}

const goodConfig = `listeners:
  - address: 127.0.0.1:18080
upstreams:
  - name: app
    address: 127.0.0.1:9000
routes:
  - name: default
    upstream: app
`

// TestReload drives POST /reload over a real configuration file: a good
// file is applied, a broken one answers 400 with the line while the
// applied configuration stays.
func TestReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sidecar.yaml")
	var applied atomic.Pointer[config.Config]
	reload := func() error {
		c, err := config.Load(path)
		if err != nil {
			return err
		}
		if c.Routes[0].Name == "boom" {
			return errors.New("building agents: socket in use")
		}
		applied.Store(c)
		return nil
	}
	s, base := start(t, Config{Reload: reload, Log: zerolog.Nop()})
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	write(goodConfig)
	code, m, _ := do(t, "POST", base+"/reload", nil)
	if code != 200 || m["reloaded"] != true {
		t.Fatalf("good reload: %d %v", code, m)
	}
	first := applied.Load()

	write(strings.Replace(goodConfig, "upstream: app", "upstream: nope", 1))
	code, m, _ = do(t, "POST", base+"/reload", nil)
	msg, _ := m["error"].(string)
	if code != 400 || !strings.Contains(msg, "line 8") || !strings.Contains(msg, "nope") {
		t.Errorf("invalid config: %d %v", code, m)
	}
	write("listeners: [")
	if code, m, _ = do(t, "POST", base+"/reload", nil); code != 400 {
		t.Errorf("syntax error: %d %v", code, m)
	}
	if applied.Load() != first {
		t.Error("a failed reload replaced the configuration")
	}

	write(strings.Replace(goodConfig, "name: default", "name: boom", 1))
	if code, m, _ = do(t, "POST", base+"/reload", nil); code != 500 {
		t.Errorf("non-config failure: %d %v", code, m)
	}

	if code, _, _ = do(t, "POST", base+"/reload", map[string]string{"Origin": "http://evil.example"}); code != 403 {
		t.Errorf("cross-origin reload: %d", code)
	}
	if code, _, _ = do(t, "GET", base+"/reload", nil); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /reload: %d", code)
	}
	st := s.ReloadStatus()
	if st.Count != 4 || st.Failures != 3 || st.LastError == "" {
		t.Errorf("reload status %+v", st)
	}
	write(goodConfig)
	if code, _, _ = do(t, "POST", base+"/reload", nil); code != 200 {
		t.Errorf("reload after fixing: %d", code)
	}
	if st := s.ReloadStatus(); st.LastError != "" || st.Count != 5 {
		t.Errorf("reload status after success %+v", st)
	}
}

func TestReloadNotConfigured(t *testing.T) {
	s, base := start(t, Config{})
	if code, _, _ := do(t, "POST", base+"/reload", nil); code != 404 {
		t.Errorf("reload without func: %d", code)
	}
	if err := s.Reload(); !errors.Is(err, ErrAdminNoReload) {
		t.Errorf("Reload: %v", err)
	}
}

func TestStartErrors(t *testing.T) {
	s, _ := start(t, Config{})
	if err := s.Start(); !errors.Is(err, ErrAdminStarted) {
		t.Errorf("second Start: %v", err)
	}
	busy, err := New(Config{Address: s.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	if err := busy.Start(); err == nil {
		t.Error("Start on a bound address succeeded")
	}
	if _, err := New(Config{Address: "no-port"}); !errors.Is(err, ErrAdminConfig) {
		t.Errorf("bad address: %v", err)
	}
}

func TestFailClosedAgents(t *testing.T) {
	c, err := config.Parse([]byte(`listeners: [{address: "127.0.0.1:18080"}]
upstreams: [{name: app, address: "127.0.0.1:9000"}]
agents:
  - {name: waf, transport: uds, address: /tmp/waf.sock}
  - {name: log, transport: uds, address: /tmp/log.sock, failure_mode: open}
  - {name: auth, transport: uds, address: /tmp/auth.sock, failure_mode: open}
  - {name: idle, transport: uds, address: /tmp/idle.sock}
routes:
  - {name: a, upstream: app, agents: [waf, log]}
  - name: b
    upstream: app
    path_prefix: /b/
    agents: [{name: auth, failure_mode: closed}]
`))
	if err != nil {
		t.Fatal(err)
	}
	got := FailClosedAgents(c)
	if fmt.Sprint(got) != "[auth waf]" {
		t.Errorf("fail-closed agents %v, want [auth waf] (idle is on no route, log is open)", got)
	}
	st := []agentmux.AgentStatus{{Name: "waf", Ready: true}, {Name: "auth", Ready: false}, {Name: "log"}}
	ok, reason := AgentsReady(st, got)
	if ok || reason != "fail-closed agent not connected: auth" {
		t.Errorf("AgentsReady: %v %q", ok, reason)
	}
	st[1].Ready = true
	if ok, _ := AgentsReady(st, got); !ok {
		t.Error("not ready with every fail-closed agent connected")
	}
	if ok, reason := AgentsReady(st[:1], got); ok || !strings.Contains(reason, "auth") {
		t.Errorf("missing agent: %v %q", ok, reason)
	}
}

// TestReadyFollowsRealAgent: /readyz over a real UDS agent flips to 503
// when the agent goes away and back to 200 when it returns.
func TestReadyFollowsRealAgent(t *testing.T) {
	dir, err := os.MkdirTemp("", "adm")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "waf.sock")
	serveAgent := func() (stop func()) {
		ln, err := sdk.ListenUDS(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = sdk.Serve(ctx, ln, sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true}}, &sdk.Options{Name: "waf"})
		}()
		return func() { cancel(); <-done }
	}
	stop := serveAgent()
	cc := udsclient.DefaultConfig("waf", path)
	cc.BackoffMin, cc.BackoffMax = 10*time.Millisecond, 50*time.Millisecond
	client, err := udsclient.NewClient(cc)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	required := []string{"waf"}
	_, base := start(t, Config{Ready: func() (bool, string) {
		return AgentsReady([]agentmux.AgentStatus{client.Snapshot()}, required)
	}})
	waitCode := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			code, m, _ := do(t, "GET", base+"/readyz", nil)
			if code == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("readyz %d %v, want %d", code, m, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitCode(200)
	stop()
	waitCode(503)
	_, m, _ := do(t, "GET", base+"/readyz", nil)
	if r, _ := m["reason"].(string); !strings.Contains(r, "waf") {
		t.Errorf("reason %q does not name the agent", r)
	}
	stop = serveAgent()
	defer stop()
	waitCode(200)
}
