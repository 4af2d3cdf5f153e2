package corazawaf_test

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// TestMain removes the binaries the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	testutil.RemoveBinaries()
	os.Exit(code)
}

// process is a started child whose stderr lines are kept.
type process struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	lines  []string
	exited chan struct{}
}

func startProcess(t *testing.T, bin string, args ...string) *process {
	t.Helper()
	p := &process{cmd: exec.Command(bin, args...), exited: make(chan struct{})}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.exited)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 8<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = p.cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			p.mu.Lock()
			t.Logf("%s log:\n%s", filepath.Base(bin), strings.Join(p.lines, "\n"))
			p.mu.Unlock()
		}
	})
	return p
}

// TestTablesThroughBinaries runs the attack and benign tables through the
// built sidecar and the built corazawaf agent, each its own process, as an
// operator runs them.
func TestTablesThroughBinaries(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two binaries; skipped with -short")
	}
	dir := t.TempDir()
	sidecarBin := testutil.BuildBinary(t, "./cmd/sidecar")
	agentBin := testutil.BuildBinary(t, "./examples/corazawaf/cmd/corazawaf")

	var upHits atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upHits.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("content-type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	defer up.Close()

	sock := filepath.Join(testutil.SocketDir(t), "waf.sock")
	startProcess(t, agentBin, "-socket", sock)
	testutil.WaitFor(t, "the agent's socket", func() bool {
		_, err := os.Stat(sock)
		return err == nil
	})

	cfgPath := filepath.Join(dir, "sidecar.yaml")
	if err := os.WriteFile(cfgPath, fmt.Appendf(nil, sidecarYAML, up.Listener.Addr(), sock), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := testutil.StartSidecar(t, exec.Command(sidecarBin, "run", "-config", cfgPath, "-log-level", "info")).Addr
	base := "http://" + addr
	client := &http.Client{Timeout: testutil.LongWait}
	for _, tc := range attacks {
		t.Run("attack/"+tc.name, func(t *testing.T) {
			before := upHits.Load()
			r := doRequest(t, client, tc.req(base))
			if want := cmp.Or(tc.status, http.StatusForbidden); r.status != want {
				t.Fatalf("status %d, want %d; body %q", r.status, want, r.body)
			}
			if r.ruleID == "" || (tc.rule != "" && r.ruleID != tc.rule) {
				t.Errorf("x-waf-rule-id %q, want %q", r.ruleID, tc.rule)
			}
			if n := upHits.Load() - before; n != 0 {
				t.Errorf("the upstream saw %d blocked request(s)", n)
			}
		})
	}
	for _, tc := range benign {
		t.Run("benign/"+tc.name, func(t *testing.T) {
			before := upHits.Load()
			r := doRequest(t, client, tc.req(base))
			if r.status != http.StatusOK || r.ruleID != "" {
				t.Fatalf("status %d, rule %q, want 200 and no rule; body %q", r.status, r.ruleID, r.body)
			}
			if n := upHits.Load() - before; n != 1 {
				t.Errorf("the upstream saw %d request(s), want 1", n)
			}
		})
	}
}

// TestDirectivesFlagsThroughBinaries: the shipped command's
// -setup-directives file goes before the CRS rules (a SecAction setting
// tx.allowed_methods refuses DELETE, which -allowed-methods allows by
// default) and its -directives file after them (a rule exclusion lets
// the scanner user agent through).
func TestDirectivesFlagsThroughBinaries(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two binaries; skipped with -short")
	}
	dir := t.TempDir()
	sidecarBin := testutil.BuildBinary(t, "./cmd/sidecar")
	agentBin := testutil.BuildBinary(t, "./examples/corazawaf/cmd/corazawaf")
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	defer up.Close()
	setup := filepath.Join(dir, "crs-setup.conf")
	extra := filepath.Join(dir, "exclusions.conf")
	if err := os.WriteFile(setup, []byte("# as in crs-setup.conf\nSecAction \"id:900200,phase:1,pass,t:none,nolog,setvar:'tx.allowed_methods=GET HEAD POST OPTIONS'\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(extra, []byte("SecRuleRemoveById 913100\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(testutil.SocketDir(t), "waf.sock")
	startProcess(t, agentBin, "-socket", sock, "-setup-directives", setup, "-directives", extra, "-handlers", "1")
	testutil.WaitFor(t, "the agent's socket", func() bool {
		_, err := os.Stat(sock)
		return err == nil
	})
	cfgPath := filepath.Join(dir, "sidecar.yaml")
	if err := os.WriteFile(cfgPath, fmt.Appendf(nil, sidecarYAML, up.Listener.Addr(), sock), 0o600); err != nil {
		t.Fatal(err)
	}
	base := "http://" + testutil.StartSidecar(t, exec.Command(sidecarBin, "run", "-config", cfgPath, "-log-level", "info")).Addr
	client := &http.Client{Timeout: testutil.LongWait}
	del := func(base string) *http.Request {
		r := get("/items/7")(base)
		r.Method = http.MethodDelete
		return r
	}
	if r := doRequest(t, client, del(base)); r.status != http.StatusForbidden || r.ruleID != "911100" {
		t.Errorf("DELETE: status %d rule %q, want 403 by 911100 (the setup's allowed methods)", r.status, r.ruleID)
	}
	if r := doRequest(t, client, get("/", "User-Agent", "sqlmap/1.7.2#stable (https://sqlmap.org)")(base)); r.status != http.StatusOK {
		t.Errorf("scanner: status %d rule %q, want 200 (913100 removed after the rules)", r.status, r.ruleID)
	}
	if r := doRequest(t, client, get("/products?id=1%27%20OR%20%271%27%3D%271")(base)); r.status != http.StatusForbidden {
		t.Errorf("sqli: status %d, want 403", r.status)
	}
}
