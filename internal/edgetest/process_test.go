package edgetest

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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
	*testutil.Sidecar
	t      *testing.T
	addr   string // host:port of the first listener
	admin  string // host:port of the admin listener
	exited chan error
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
	sc := testutil.StartSidecar(t, cmd)
	return &sidecar{Sidecar: sc, t: t, addr: sc.Addr, admin: sc.Admin, exited: sc.Exited}
}

func (s *sidecar) log() []string { return s.Lines() }

func (s *sidecar) tail(n int) string { return s.Tail(n) }

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
