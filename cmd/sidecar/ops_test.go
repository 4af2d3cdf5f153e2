package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	stest "github.com/zentinelproxy/sidecar/internal/supervisor/supervisortest"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
)

// The tests of this file run the real binary: what only a process shows
// (signals, exit codes, the log on stderr). The supervisor's behaviour is
// tested in-process in internal/supervisor.

const longWait = stest.LongWait

// --- The real binary. ---

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// TestMain removes the binary built for the signal tests.
func TestMain(m *testing.M) {
	code := m.Run()
	testutil.RemoveBinaries()
	os.Exit(code)
}

// proc is a running sidecar process.
type proc struct {
	*testutil.Sidecar
	t      *testing.T
	data   string // http://host:port of the first listener
	admin  string // http://host:port of the admin listener
	exited chan error
}

// startProc runs `sidecar run -config path` and waits until it serves.
func startProc(t *testing.T, path string, args ...string) *proc {
	t.Helper()
	return startProcEnv(t, path, nil, args...)
}

// startProcEnv is startProc with env as the process's environment (nil:
// this one's).
func startProcEnv(t *testing.T, path string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(testutil.BuildBinary(t, "./cmd/sidecar"), append([]string{"run", "-config", path}, args...)...)
	cmd.Env = env
	sc := testutil.StartSidecar(t, cmd)
	return &proc{Sidecar: sc, t: t, data: "http://" + sc.Addr, admin: "http://" + sc.Admin, exited: sc.Exited}
}

// oneRouteConfig writes a configuration with one route to a new upstream
// and an admin listener, and returns its path.
func oneRouteConfig(t *testing.T) string {
	t.Helper()
	up := stest.StartUpstream(t, "one")
	path := filepath.Join(testutil.SocketDir(t), "sidecar.yaml")
	stest.WriteConfig(t, path, fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q}]
routes: [{name: main, upstream: app}]
admin: {address: "127.0.0.1:0"}
`, up.Addr))
	return path
}

func (p *proc) log() string { return strings.Join(p.Lines(), "\n") }

func (p *proc) signal(sig os.Signal) {
	if err := p.Cmd.Process.Signal(sig); err != nil {
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
	dir := testutil.SocketDir(t)
	up := stest.StartUpstream(t, "app")
	sock := filepath.Join(dir, "policy.sock")
	testagent.Serve(t, sock, stest.NewPolicyAgent())
	path := filepath.Join(dir, "sidecar.yaml")
	stest.WriteConfig(t, path, fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q}]
agents: [{name: policy, transport: uds, address: %q}]
routes: [{upstream: app, agents: [policy]}]
admin: {address: "127.0.0.1:0"}
`, up.Addr, sock))
	p := startProc(t, path, "-drain", "15s")

	const clients = 16
	urls := []string{p.data + "/slow/a?ms=300", p.data + "/fast", p.data + "/slow/b?ms=100", p.data + "/fast2"}
	res := runLoad(clients, urls, nil)
	testutil.WaitFor(t, "load under way", func() bool {
		ok, _, _ := res.snapshot()
		return ok >= 50 && up.InFlight.Load() >= 4
	})
	inFlight := up.InFlight.Load()
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
	code, m := stest.GetJSON(t, admin+"/status")
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
	dir := testutil.SocketDir(t)
	up := stest.StartUpstream(t, "one")
	path := filepath.Join(dir, "sidecar.yaml")
	good := fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q}]
routes: [{name: main, upstream: app}]
admin: {address: "127.0.0.1:0"}
`, up.Addr)
	stest.WriteConfig(t, path, good)
	p := startProc(t, path)

	stest.WriteConfig(t, path, strings.Replace(good, "upstream: app}", "upstream: nope}", 1))
	p.signal(syscall.SIGHUP)
	testutil.WaitFor(t, "failed reload recorded", func() bool { return reloadField(status(t, p.admin), "failures") == 1.0 })
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
		stest.WriteConfig(t, path, bad)
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
	v := stest.Scrape(t, p.admin)
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
	dir := testutil.SocketDir(t)
	one := stest.StartUpstream(t, "one")
	two := stest.StartUpstream(t, "two")
	policySock := filepath.Join(dir, "policy.sock")
	tagSock := filepath.Join(dir, "tag.sock")
	policy := stest.NewPolicyAgent()
	testagent.Serve(t, policySock, policy)
	tagger := stest.NewPolicyAgent()
	testagent.Serve(t, tagSock, tagger)
	path := filepath.Join(dir, "sidecar.yaml")
	head := fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams:
  - {name: one, address: %q}
  - {name: two, address: %q}
agents:
  - {name: policy, transport: uds, address: %q}
`, one.Addr, two.Addr, policySock)
	stest.WriteConfig(t, path, head+`routes: [{name: main, upstream: one, agents: [policy]}]
admin: {address: "127.0.0.1:0"}
`)
	p := startProc(t, path)
	before := stest.Scrape(t, p.admin)[`sidecar_agent_exchanges_completed_total{agent="policy"}`]

	stop := make(chan struct{})
	res := runLoad(8, []string{p.data + "/x", p.data + "/two/y"}, stop)
	testutil.WaitFor(t, "load under way", func() bool { ok, _, _ := res.snapshot(); return ok >= 100 })
	if res.body("two") != 0 {
		t.Fatal("upstream two answered before the reload")
	}
	stest.WriteConfig(t, path, head+fmt.Sprintf(`  - {name: tagger, transport: uds, address: %q}
routes:
  - {name: main, upstream: one, agents: [policy]}
  - {name: two, path_prefix: /two/, upstream: two, agents: [policy, tagger]}
admin: {address: "127.0.0.1:0"}
`, tagSock))
	p.signal(syscall.SIGHUP)
	testutil.WaitFor(t, "the new route", func() bool { return res.body("two") >= 50 })
	close(stop)
	res.waitDone(t)

	ok, errs, statuses := res.snapshot()
	if len(errs) > 0 {
		t.Errorf("%d load errors, e.g. %s", len(errs), errs[0])
	}
	if statuses[200] != ok || len(statuses) != 1 {
		t.Errorf("statuses %v", statuses)
	}
	if tagger.Seen.Load() == 0 {
		t.Error("the new agent saw no request")
	}
	st := status(t, p.admin)
	if reloadField(st, "count") != 1.0 || reloadField(st, "failures") != 0.0 || fmt.Sprint(st["routes"]) != "[main two]" {
		t.Errorf("status after reload: %v", st)
	}
	v := stest.Scrape(t, p.admin)
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

// TestRunSchedBatch: `run -sched batch` puts every thread, including those
// the runtime starts while the sidecar serves, under SCHED_BATCH (3); the
// default leaves them at SCHED_OTHER (0).
func TestRunSchedBatch(t *testing.T) {
	path := oneRouteConfig(t)
	for _, c := range []struct {
		args []string
		want int
	}{{nil, 0}, {[]string{"-sched", "batch"}, 3}} {
		p := startProc(t, path, c.args...)
		// Load starts more runtime threads after the policy was set.
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 50 {
					if resp, err := http.Get(p.data + "/"); err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}
			}()
		}
		wg.Wait()
		pols := testutil.ThreadPolicies(t, p.Cmd.Process.Pid)
		if len(pols) < 2 {
			t.Fatalf("%v: only %d threads", c.args, len(pols))
		}
		for i, pol := range pols {
			if pol != c.want {
				t.Errorf("%v: thread %d of %d has policy %d, want %d", c.args, i, len(pols), pol, c.want)
			}
		}
		if c.want == 3 && !strings.Contains(p.log(), "SCHED_BATCH") {
			t.Errorf("the policy is not logged:\n%s", p.log())
		}
		p.signal(syscall.SIGTERM)
		_ = p.wait()
	}
}

// TestRunRefusesUnknownModes: a typo in -sched or -gomaxprocs is a usage
// error, not ignored.
func TestRunRefusesUnknownModes(t *testing.T) {
	for _, c := range []struct{ flag, value, want string }{
		{"-sched", "fifo", `-sched must be normal or batch, not "fifo"`},
		{"-gomaxprocs", "auto", `-gomaxprocs must be adaptive or runtime, not "auto"`},
	} {
		out, err := exec.Command(testutil.BuildBinary(t, "./cmd/sidecar"), "run", c.flag, c.value, "-config", "x.yaml").CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Fatalf("%s %s: err %v, output:\n%s", c.flag, c.value, err, out)
		}
	}
}

// TestRunAdaptsGOMAXPROCS: by default an idle sidecar lowers GOMAXPROCS to
// 1 and says so in its metrics; -gomaxprocs runtime, or GOMAXPROCS in the
// environment, leaves the runtime's default alone.
func TestRunAdaptsGOMAXPROCS(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("one CPU: nothing to adapt")
	}
	path := oneRouteConfig(t)
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GOMAXPROCS=") })
	start := func(extraEnv []string, args ...string) *proc {
		return startProcEnv(t, path, append(slices.Clip(env), extraEnv...), args...)
	}

	// Waiting on the log, not on /metrics: scraping in a loop would be the
	// load that keeps it from lowering.
	p := start(nil, "-log-level", "debug")
	testutil.WaitFor(t, "GOMAXPROCS lowered", func() bool { return strings.Contains(p.log(), "GOMAXPROCS changed") })
	v := stest.Scrape(t, p.admin)
	if v["go_sched_gomaxprocs_threads"] != 1 {
		t.Errorf("GOMAXPROCS %v after the change, want 1:\n%s", v["go_sched_gomaxprocs_threads"], p.log())
	}
	if v["sidecar_gomaxprocs_adaptive"] != 1 || v[`sidecar_gomaxprocs_changes_total{direction="down"}`] < 1 {
		t.Errorf("adaptive %v, lowered %v times", v["sidecar_gomaxprocs_adaptive"], v[`sidecar_gomaxprocs_changes_total{direction="down"}`])
	}
	if resp, err := http.Get(p.data + "/"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("a request with one P: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	p.signal(syscall.SIGTERM)
	if err := p.wait(); err != nil {
		t.Errorf("exit: %v", err)
	}

	cases := []struct {
		env  []string
		args []string
		p    *proc
	}{{nil, []string{"-gomaxprocs", "runtime"}, nil}, {[]string{"GOMAXPROCS=2"}, nil, nil}}
	for i := range cases {
		cases[i].p = start(cases[i].env, cases[i].args...)
	}
	// Longer than an adapting sidecar's wait before it lowers (2s).
	time.Sleep(3 * time.Second)
	for _, c := range cases {
		p := c.p
		v := stest.Scrape(t, p.admin)
		if v["sidecar_gomaxprocs_adaptive"] != 0 || v["go_sched_gomaxprocs_threads"] < 2 ||
			v[`sidecar_gomaxprocs_changes_total{direction="down"}`] != 0 {
			t.Errorf("%v %v: adaptive %v, GOMAXPROCS %v, lowered %v times", c.env, c.args,
				v["sidecar_gomaxprocs_adaptive"], v["go_sched_gomaxprocs_threads"], v[`sidecar_gomaxprocs_changes_total{direction="down"}`])
		}
		if c.env != nil && !strings.Contains(p.log(), "GOMAXPROCS stays as it is") {
			t.Errorf("%v: the reason is not logged:\n%s", c.env, p.log())
		}
		p.signal(syscall.SIGTERM)
		_ = p.wait()
	}
}
