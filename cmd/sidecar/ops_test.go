package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// longWait bounds every wait so that a broken build fails instead of
// hanging; never a performance assertion.
const longWait = 20 * time.Second

// opsDir is a short private directory for sockets (107-byte limit).
func opsDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ops")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// upstreamServer answers every request with 200 and its name in the body
// and in X-Upstream; /slow/ waits ?ms= milliseconds first. inFlight
// counts the requests it is handling.
type upstreamServer struct {
	name     string
	addr     string
	inFlight atomic.Int64
	srv      *http.Server
}

func startTestUpstream(t *testing.T, name string) *upstreamServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstreamServer{name: name, addr: ln.Addr().String()}
	u.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.inFlight.Add(1)
		defer u.inFlight.Add(-1)
		_, _ = io.Copy(io.Discard, r.Body)
		if strings.Contains(r.URL.Path, "/slow/") {
			var ms int
			_, _ = fmt.Sscan(r.URL.Query().Get("ms"), &ms)
			time.Sleep(time.Duration(ms) * time.Millisecond)
		}
		w.Header().Set("X-Upstream", u.name)
		_, _ = io.WriteString(w, u.name+"\n")
	})}
	go func() { _ = u.srv.Serve(ln) }()
	t.Cleanup(func() { _ = u.srv.Close() })
	return u
}

// policyAgent blocks /block paths, redirects /redir paths and allows the
// rest, tagging allowed requests with x-policy.
type policyAgent struct {
	sdk.Base
	seen atomic.Int64
}

func newPolicyAgent() *policyAgent {
	return &policyAgent{Base: sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true}}}
}

func (a *policyAgent) OnRequestHeaders(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
	a.seen.Add(1)
	switch {
	case bytes.Contains(m.URI, []byte("/block")):
		d.Kind, d.Status, d.Body = protocol.DecisionBlock, 403, []byte("blocked\n")
	case bytes.Contains(m.URI, []byte("/redir")):
		d.Kind, d.Status, d.RedirectURL = protocol.DecisionRedirect, 302, []byte("/elsewhere")
	default:
		d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderSet, Name: []byte("x-policy"), Value: []byte("ok")})
	}
	return nil
}

// serveAgent serves h on a socket in dir until the returned stop runs (or
// the test ends).
func serveAgent(t *testing.T, path string, h sdk.Handler) (stop func()) {
	t.Helper()
	ln, err := sdk.ListenUDS(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = sdk.Serve(ctx, ln, h, nil)
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

func writeConfig(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// startInProcess runs the sidecar of the file at path in this process.
func startInProcess(t *testing.T, path string) *sidecar {
	t.Helper()
	cfg, err := loadConfig(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
	s, err := startSidecar(cfg, path, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), longWait)
		defer cancel()
		if err := s.shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return s
}

func dataURL(s *sidecar) string  { return "http://" + s.srv.Load().Addrs()[0].String() }
func adminURL(s *sidecar) string { return "http://" + s.admin.Addr().String() }

// scrape reads /metrics into `name{a="x",b="y"}` → value (labels sorted
// by name, as the exposition writes them).
func scrape(t *testing.T, base string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var parts []string
			for _, l := range m.GetLabel() {
				parts = append(parts, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(parts)
			key := name
			if len(parts) > 0 {
				key += "{" + strings.Join(parts, ",") + "}"
			}
			switch {
			case m.Counter != nil:
				out[key] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[key] = m.GetGauge().GetValue()
			case m.Histogram != nil:
				out[strings.Replace(key, name, name+"_count", 1)] = float64(m.GetHistogram().GetSampleCount())
			case m.Untyped != nil:
				out[key] = m.GetUntyped().GetValue()
			}
		}
	}
	return out
}

func getJSON(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m
}

func TestMetricsAfterKnownMix(t *testing.T) {
	dir := opsDir(t)
	up := startTestUpstream(t, "app")
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close() // nothing listens there: connections are refused
	policy := newPolicyAgent()
	serveAgent(t, filepath.Join(dir, "policy.sock"), policy)

	path := filepath.Join(dir, "sidecar.yaml")
	writeConfig(t, path, fmt.Sprintf(`
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
`, up.addr, deadAddr, filepath.Join(dir, "policy.sock"), filepath.Join(dir, "none1.sock"), filepath.Join(dir, "none2.sock")))
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
			resp, err := noRedirects.Do(req)
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

	v := scrape(t, adminURL(s))
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
		`sidecar_agent_decisions_total{agent="policy",decision="continue"}`:           1, // the body chunk, passed
		`sidecar_agent_decisions_total{agent="policy",decision="block"}`:              3,
		`sidecar_agent_decisions_total{agent="policy",decision="redirect"}`:           2,
		`sidecar_agent_latency_seconds_count{agent="policy",phase="request_headers"}`: 11,
		`sidecar_agent_latency_seconds_count{agent="policy",phase="request_body"}`:    1,
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
	code, m := getJSON(t, adminURL(s)+"/readyz")
	if code != 503 || !strings.Contains(fmt.Sprint(m["reason"]), "down-closed") {
		t.Errorf("readyz %d %v", code, m)
	}
}

// shortAgentWait keeps tests with agents that never connect quick.
func shortAgentWait(t *testing.T) {
	old := agentWait
	agentWait = 200 * time.Millisecond
	t.Cleanup(func() { agentWait = old })
}

// TestReadyzFollowsFailClosedAgent: /readyz is 200 while the fail-closed
// agent is connected, 503 naming it while it is down, 200 again when it
// is back; a fail-open agent that is down does not matter.
func TestReadyzFollowsFailClosedAgent(t *testing.T) {
	shortAgentWait(t)
	dir := opsDir(t)
	up := startTestUpstream(t, "app")
	guardSock := filepath.Join(dir, "guard.sock")
	stop := serveAgent(t, guardSock, newPolicyAgent())
	path := filepath.Join(dir, "sidecar.yaml")
	writeConfig(t, path, fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q}]
agents:
  - {name: guard, transport: uds, address: %q}
  - {name: extra, transport: uds, address: %q, failure_mode: open}
routes: [{upstream: app, agents: [guard, extra]}]
admin: {address: "127.0.0.1:0"}
`, up.addr, guardSock, filepath.Join(dir, "none.sock")))
	s := startInProcess(t, path)
	readyz := func(want int) map[string]any {
		var m map[string]any
		waitFor(t, fmt.Sprintf("readyz %d", want), func() bool {
			var code int
			code, m = getJSON(t, adminURL(s)+"/readyz")
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
	serveAgent(t, guardSock, newPolicyAgent())
	readyz(200)
	if code, _ := getJSON(t, adminURL(s)+"/healthz"); code != 200 {
		t.Errorf("healthz %d", code)
	}
}

// TestAccessLogFile: with the access log on, a blocked and an allowed
// request each leave one line in the file, flushed on shutdown.
func TestAccessLogFile(t *testing.T) {
	dir := opsDir(t)
	up := startTestUpstream(t, "app")
	sock := filepath.Join(dir, "policy.sock")
	serveAgent(t, sock, newPolicyAgent())
	logPath := filepath.Join(dir, "access.log")
	path := filepath.Join(dir, "sidecar.yaml")
	writeConfig(t, path, fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q}]
agents: [{name: policy, transport: uds, address: %q}]
routes: [{name: main, upstream: app, agents: [policy]}]
admin: {enabled: false}
access_log: {enabled: true, output: %q}
`, up.addr, sock, logPath))
	cfg, err := loadConfig(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := startSidecar(cfg, path, nil, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	if err != nil {
		t.Fatal(err)
	}
	if s.admin != nil || s.metrics != nil {
		t.Error("admin listener or metrics running although disabled")
	}
	for _, p := range []string{"/block/me", "/fine"} {
		req, _ := http.NewRequest("GET", dataURL(s)+p, nil)
		req.Header.Set("X-Request-Id", "rid"+strings.ReplaceAll(p, "/", "-"))
		resp, err := noRedirects.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), longWait)
	defer cancel()
	if err := s.shutdown(ctx); err != nil {
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

// --- The real binary. ---

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// TestMain removes the binary built for the signal tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// sidecarBinary builds the command once per test run.
func sidecarBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sidecar-bin")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "sidecar")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// proc is a running sidecar process.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	data   string // http://host:port of the first listener
	admin  string // http://host:port of the admin listener
	exited chan error

	mu    sync.Mutex
	lines []string
}

// startProc runs `sidecar run -config path` and waits until it serves.
func startProc(t *testing.T, path string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(sidecarBinary(t), append([]string{"run", "-config", path}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, exited: make(chan error, 1)}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	serving := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.lines = append(p.lines, line)
			p.mu.Unlock()
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["message"] == "sidecar serving" {
				serving <- m
			}
		}
		p.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("sidecar log:\n%s", p.log())
		}
	})
	select {
	case m := <-serving:
		ls, _ := m["listeners"].([]any)
		if len(ls) == 0 {
			t.Fatalf("serving line without listeners: %v", m)
		}
		p.data = "http://" + ls[0].(string)
		p.admin = "http://" + m["admin"].(string)
	case err := <-p.exited:
		t.Fatalf("sidecar exited at start: %v\n%s", err, p.log())
	case <-time.After(longWait):
		t.Fatalf("sidecar did not start\n%s", p.log())
	}
	return p
}

func (p *proc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

func (p *proc) signal(sig os.Signal) {
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatal(err)
	}
}

// wait waits for the process to exit and returns its error.
func (p *proc) wait() error {
	select {
	case err := <-p.exited:
		return err
	case <-time.After(longWait):
		p.t.Fatalf("sidecar did not exit\n%s", p.log())
		return nil
	}
}

// waitFor polls cond until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(longWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// loadResult is what a load run saw.
type loadResult struct {
	mu       sync.Mutex
	ok       int
	statuses map[int]int
	refused  int      // errors on connections never used before (the listener was gone)
	errs     []string // every other error
	bodies   map[string]int
	okAfter  int // 200s received after mark was set
	mark     atomic.Bool
	done     chan struct{}
}

// runLoad sends GETs to urls round-robin from n keep-alive clients until
// stop is closed or every client saw its listener gone.
func runLoad(n int, urls []string, stop <-chan struct{}) *loadResult {
	res := &loadResult{statuses: map[int]int{}, bodies: map[string]int{}, done: make(chan struct{})}
	var wg sync.WaitGroup
	for c := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := &http.Transport{MaxIdleConnsPerHost: 1}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr, Timeout: longWait}
			for i := c; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// reused tells the last connection attempt of the request:
				// an error on a fresh connection means the listener is gone
				// (the transport itself retries a GET whose reused
				// keep-alive connection was closed before it was read).
				var reused atomic.Bool
				trace := &httptrace.ClientTrace{
					GetConn: func(string) { reused.Store(false) },
					GotConn: func(ci httptrace.GotConnInfo) { reused.Store(ci.Reused) },
				}
				req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", urls[i%len(urls)], nil)
				resp, err := client.Do(req)
				if err != nil {
					res.mu.Lock()
					if !reused.Load() && isRefused(err) {
						res.refused++
						res.mu.Unlock()
						return // the listener is gone: this client is done
					}
					res.errs = append(res.errs, err.Error())
					res.mu.Unlock()
					return
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				res.mu.Lock()
				if err != nil {
					res.errs = append(res.errs, "body: "+err.Error())
				} else {
					res.statuses[resp.StatusCode]++
					res.bodies[strings.TrimSpace(string(body))]++
					if resp.StatusCode == 200 {
						res.ok++
						if res.mark.Load() {
							res.okAfter++
						}
					}
				}
				res.mu.Unlock()
			}
		}()
	}
	go func() { wg.Wait(); close(res.done) }()
	return res
}

// isRefused reports a new connection the sidecar did not take: refused,
// or reset before any byte because the listener closed with it queued.
func isRefused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF)
}

func (r *loadResult) snapshot() (ok int, errs []string, statuses map[int]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := make(map[int]int, len(r.statuses))
	for k, v := range r.statuses {
		st[k] = v
	}
	return r.ok, append([]string(nil), r.errs...), st
}

func (r *loadResult) body(s string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bodies[s]
}

// waitDone waits for every load client to stop.
func (r *loadResult) waitDone(t *testing.T) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(longWait):
		t.Fatal("load clients did not stop")
	}
}

// TestSIGTERMDrainsInFlight runs the real binary under load and sends
// SIGTERM: every request in flight completes, the process exits 0, and
// the load sees no error but refused connections once the listener is
// gone.
func TestSIGTERMDrainsInFlight(t *testing.T) {
	dir := opsDir(t)
	up := startTestUpstream(t, "app")
	sock := filepath.Join(dir, "policy.sock")
	serveAgent(t, sock, newPolicyAgent())
	path := filepath.Join(dir, "sidecar.yaml")
	writeConfig(t, path, fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q}]
agents: [{name: policy, transport: uds, address: %q}]
routes: [{upstream: app, agents: [policy]}]
admin: {address: "127.0.0.1:0"}
`, up.addr, sock))
	p := startProc(t, path, "-drain", "15s")

	const clients = 16
	urls := []string{p.data + "/slow/a?ms=300", p.data + "/fast", p.data + "/slow/b?ms=100", p.data + "/fast2"}
	res := runLoad(clients, urls, nil)
	waitFor(t, "load under way", func() bool {
		ok, _, _ := res.snapshot()
		return ok >= 50 && up.inFlight.Load() >= 4
	})
	inFlight := up.inFlight.Load()
	res.mark.Store(true)
	p.signal(syscall.SIGTERM)
	if err := p.wait(); err != nil {
		t.Errorf("exit: %v", err)
	}
	res.waitDone(t)

	ok, errs, statuses := res.snapshot()
	if len(errs) > 0 {
		t.Errorf("%d load errors besides refused connections, e.g. %s", len(errs), errs[0])
	}
	for code, n := range statuses {
		if code != 200 {
			t.Errorf("%d responses with status %d", n, code)
		}
	}
	res.mu.Lock()
	okAfter, refused := res.okAfter, res.refused
	res.mu.Unlock()
	if int64(okAfter) < inFlight {
		t.Errorf("%d requests completed after SIGTERM, but %d were in flight at the upstream", okAfter, inFlight)
	}
	if refused != clients {
		t.Errorf("%d clients ended on a refused connection, want all %d", refused, clients)
	}
	log := p.log()
	if !strings.Contains(log, `"message":"stopped"`) || strings.Contains(log, "before every request finished") {
		t.Errorf("shutdown log:\n%s", log)
	}
	t.Logf("%d requests, %d completed after SIGTERM (%d in flight at the upstream then)", ok, okAfter, inFlight)
}

// status fetches /status.
func status(t *testing.T, admin string) map[string]any {
	t.Helper()
	code, m := getJSON(t, admin+"/status")
	if code != 200 {
		t.Fatalf("status %d", code)
	}
	return m
}

func reloadField(m map[string]any, k string) any {
	r, _ := m["reload"].(map[string]any)
	return r[k]
}

// TestSIGHUPBrokenConfigKeepsOld: a reload of an invalid file (SIGHUP or
// POST /reload) is refused with its line and the running configuration
// keeps serving.
func TestSIGHUPBrokenConfigKeepsOld(t *testing.T) {
	dir := opsDir(t)
	up := startTestUpstream(t, "one")
	path := filepath.Join(dir, "sidecar.yaml")
	good := fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q}]
routes: [{name: main, upstream: app}]
admin: {address: "127.0.0.1:0"}
`, up.addr)
	writeConfig(t, path, good)
	p := startProc(t, path)

	writeConfig(t, path, strings.Replace(good, "upstream: app}", "upstream: nope}", 1))
	p.signal(syscall.SIGHUP)
	waitFor(t, "failed reload recorded", func() bool { return reloadField(status(t, p.admin), "failures") == 1.0 })
	st := status(t, p.admin)
	if msg := fmt.Sprint(reloadField(st, "last_error")); !strings.Contains(msg, "line 4") || !strings.Contains(msg, "nope") {
		t.Errorf("last_error %q", msg)
	}
	if routes := fmt.Sprint(st["routes"]); routes != "[main]" {
		t.Errorf("routes %s", routes)
	}
	resp, err := http.Get(p.data + "/x")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.TrimSpace(string(body)) != "one" {
		t.Errorf("after the failed reload: %d %q", resp.StatusCode, body)
	}

	// The same through the admin endpoint, and for an error only the
	// transport finds (an unknown gRPC option).
	for _, bad := range []string{
		"listeners: [\n",
		good + "agents: [{name: g, transport: grpc, address: \"127.0.0.1:1\", options: {tls_ca: x}}]\n",
	} {
		writeConfig(t, path, bad)
		resp, err := http.Post(p.admin+"/reload", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(b), "error") {
			t.Errorf("POST /reload of a bad file: %d %s", resp.StatusCode, b)
		}
	}
	v := scrape(t, p.admin)
	if v[`sidecar_config_reloads_total{result="failure"}`] != 3 || v[`sidecar_config_reloads_total{result="success"}`] != 0 {
		t.Errorf("reload counters %v %v", v[`sidecar_config_reloads_total{result="failure"}`], v[`sidecar_config_reloads_total{result="success"}`])
	}
	if !strings.Contains(p.log(), "the previous configuration keeps serving") {
		t.Error("no log line for the failed reload")
	}
	p.signal(syscall.SIGTERM)
	if err := p.wait(); err != nil {
		t.Errorf("exit: %v", err)
	}
}

// TestSIGHUPNewRoute: a reload under load that adds a route, an upstream
// and an agent takes effect without a single failed request, and keeps
// the connection of the agent that did not change.
func TestSIGHUPNewRoute(t *testing.T) {
	dir := opsDir(t)
	one := startTestUpstream(t, "one")
	two := startTestUpstream(t, "two")
	policySock := filepath.Join(dir, "policy.sock")
	tagSock := filepath.Join(dir, "tag.sock")
	policy := newPolicyAgent()
	serveAgent(t, policySock, policy)
	tagger := newPolicyAgent()
	serveAgent(t, tagSock, tagger)
	path := filepath.Join(dir, "sidecar.yaml")
	head := fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams:
  - {name: one, address: %q}
  - {name: two, address: %q}
agents:
  - {name: policy, transport: uds, address: %q}
`, one.addr, two.addr, policySock)
	writeConfig(t, path, head+`routes: [{name: main, upstream: one, agents: [policy]}]
admin: {address: "127.0.0.1:0"}
`)
	p := startProc(t, path)
	before := scrape(t, p.admin)[`sidecar_agent_exchanges_completed_total{agent="policy"}`]

	stop := make(chan struct{})
	res := runLoad(8, []string{p.data + "/x", p.data + "/two/y"}, stop)
	waitFor(t, "load under way", func() bool { ok, _, _ := res.snapshot(); return ok >= 100 })
	if res.body("two") != 0 {
		t.Fatal("upstream two answered before the reload")
	}
	writeConfig(t, path, head+fmt.Sprintf(`  - {name: tagger, transport: uds, address: %q}
routes:
  - {name: main, upstream: one, agents: [policy]}
  - {name: two, path_prefix: /two/, upstream: two, agents: [policy, tagger]}
admin: {address: "127.0.0.1:0"}
`, tagSock))
	p.signal(syscall.SIGHUP)
	waitFor(t, "the new route", func() bool { return res.body("two") >= 50 })
	close(stop)
	res.waitDone(t)

	ok, errs, statuses := res.snapshot()
	if len(errs) > 0 {
		t.Errorf("%d load errors, e.g. %s", len(errs), errs[0])
	}
	if statuses[200] != ok || len(statuses) != 1 {
		t.Errorf("statuses %v", statuses)
	}
	if tagger.seen.Load() == 0 {
		t.Error("the new agent saw no request")
	}
	st := status(t, p.admin)
	if reloadField(st, "count") != 1.0 || reloadField(st, "failures") != 0.0 || fmt.Sprint(st["routes"]) != "[main two]" {
		t.Errorf("status after reload: %v", st)
	}
	v := scrape(t, p.admin)
	if v[`sidecar_config_reloads_total{result="success"}`] != 1 {
		t.Error("reload not counted")
	}
	// The unchanged agent kept its instance: its counter went on.
	if after := v[`sidecar_agent_exchanges_completed_total{agent="policy"}`]; after <= before {
		t.Errorf("policy exchanges %v before, %v after: instance replaced?", before, after)
	}
	if v[`sidecar_requests_total{outcome="allowed",route="two"}`] == 0 {
		t.Error("no requests counted on the new route")
	}
	p.signal(syscall.SIGTERM)
	if err := p.wait(); err != nil {
		t.Errorf("exit: %v", err)
	}
	t.Logf("%d requests, %d on the new route", ok, res.body("two"))
}

// TestReloadReverseListeners: a reload keeps an unchanged reverse
// listener and its connections, binds one at a new address, closes one
// whose address is gone, and refuses to change one in place.
func TestReloadReverseListeners(t *testing.T) {
	shortAgentWait(t)
	dir := opsDir(t)
	up := startTestUpstream(t, "app")
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
`, up.addr, rv1, extraOpts, extraAgents, extraRoute)
	}
	writeConfig(t, path, conf("", "", ""))
	s := startInProcess(t, path)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dial := func(sock, id string) {
		go func() {
			_ = sdk.DialAndServe(ctx, sdk.ReverseConfig{Address: sock, AgentID: id, BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond}, newPolicyAgent())
		}()
	}
	connected := func(name string) bool {
		for _, st := range s.srv.Load().AgentStatus() {
			if st.Name == name {
				return st.Connections > 0
			}
		}
		return false
	}
	dial(rv1, "rv1")
	waitFor(t, "rv1 connected", func() bool { return connected("rv1") })
	first := s.set.reverse[0]

	// A new route and a second reverse agent at a new address.
	writeConfig(t, path, conf("  - {name: rv2, transport: reverse, address: \"unix:"+rv2+"\", failure_mode: open, options: {allow_no_token: \"true\"}}\n", "",
		"  - {name: two, path_prefix: /two/, upstream: app, agents: [rv2]}\n"))
	if err := s.reload(); err != nil {
		t.Fatal(err)
	}
	if s.set.reverse[0] != first || !connected("rv1") {
		t.Error("the unchanged reverse listener was replaced")
	}
	dial(rv2, "rv2")
	waitFor(t, "rv2 connected", func() bool { return connected("rv2") })

	// Changing rv1's listener in place is refused; nothing changes.
	writeConfig(t, path, conf("", `, registration_timeout: "3s"`, ""))
	err := s.reload()
	if err == nil || !errors.Is(err, config.ErrConfigInvalid) || !strings.Contains(err.Error(), "restart") {
		t.Fatalf("in-place change: %v", err)
	}
	if !connected("rv2") {
		t.Error("a refused reload dropped rv2")
	}

	// rv2's address is gone: its listener closes once idle.
	writeConfig(t, path, conf("", "", ""))
	if err := s.reload(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "rv2's listener closed", func() bool {
		c, err := net.Dial("unix", rv2)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	if !connected("rv1") || s.set.reverse[0] != first {
		t.Error("rv1 lost its listener or connection")
	}
}
