package edgetest

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// longWait bounds every wait of the suite on the sidecar: generous, since
// it only decides how long a broken build takes to fail.
const longWait = 30 * time.Second

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.RemoveBinaries()
	os.Exit(code)
}

// sidecarBinary builds ./cmd/sidecar once per run (or returns SIDECAR_BIN).
func sidecarBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SIDECAR_BIN"); p != "" {
		return p
	}
	return testutil.BuildBinary(t, "./cmd/sidecar")
}

// sidecar is a running sidecar process.
type sidecar struct {
	t      *testing.T
	cmd    *exec.Cmd
	addr   string // host:port of the first listener
	admin  string // host:port of the admin listener
	exited chan error

	mu    sync.Mutex
	lines []string
}

// startSidecar writes config to dir and runs the binary on it; shell, if
// set, wraps the command (e.g. "ulimit -n 256; exec").
func startSidecar(t *testing.T, dir, config, shell string) *sidecar {
	t.Helper()
	path := filepath.Join(dir, "sidecar.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := sidecarBinary(t)
	var cmd *exec.Cmd
	if shell != "" {
		cmd = exec.Command("sh", "-c", shell+` "$0" run -config "$1" -log-level debug`, bin, path)
	} else {
		cmd = exec.Command(bin, "run", "-config", path, "-log-level", "debug")
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &sidecar{t: t, cmd: cmd, exited: make(chan error, 1)}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	serving := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 8<<20)
		for sc.Scan() {
			line := sc.Text()
			s.mu.Lock()
			s.lines = append(s.lines, line)
			s.mu.Unlock()
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["message"] == "sidecar serving" {
				serving <- m
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		s.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("sidecar log (last 60 lines):\n%s", s.tail(60))
		}
	})
	select {
	case m := <-serving:
		ls, _ := m["listeners"].([]any)
		if len(ls) == 0 {
			t.Fatalf("serving line without listeners: %v", m)
		}
		s.addr = ls[0].(string)
		s.admin, _ = m["admin"].(string)
	case err := <-s.exited:
		t.Fatalf("sidecar exited at start: %v\n%s", err, s.tail(40))
	case <-time.After(longWait):
		t.Fatalf("sidecar did not start\n%s", s.tail(40))
	}
	return s
}

func (s *sidecar) log() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.lines...)
}

func (s *sidecar) tail(n int) string {
	l := s.log()
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// alive reports whether the process is still running.
func (s *sidecar) alive() bool {
	select {
	case err := <-s.exited:
		s.exited <- err
		return false
	default:
		return true
	}
}

// status fetches the admin /status document.
func (s *sidecar) status(t *testing.T) map[string]any {
	t.Helper()
	resp, err := http.Get("http://" + s.admin + "/status")
	if err != nil {
		t.Fatalf("admin /status: %v", err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatalf("admin /status: %v", err)
	}
	return m
}

// counter reads requests.<key> from /status (0 when absent).
func (s *sidecar) counter(t *testing.T, key string) float64 {
	t.Helper()
	req, _ := s.status(t)["requests"].(map[string]any)
	v, _ := req[key].(float64)
	return v
}
