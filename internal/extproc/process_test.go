package extproc_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// TestMain removes the binary the tests built; with benchProcessorEnv
// set, the binary is the benchmarks' processor instead.
func TestMain(m *testing.M) {
	if os.Getenv(benchProcessorEnv) != "" {
		serveBenchProcessor()
	}
	code := m.Run()
	testutil.RemoveBinaries()
	os.Exit(code)
}

// TestBinary runs the real sidecar binary with an ext_proc agent from its
// YAML configuration: a processor's header mutation reaches the upstream,
// and the transport's counters are on /metrics.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sidecar binary")
	}
	dir := t.TempDir()
	bin := testutil.BuildBinary(t, "./cmd/sidecar")
	var mu sync.Mutex
	var upHeader http.Header
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		upHeader = r.Header.Clone()
		mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	}))
	defer up.Close()
	_, addr, _ := startProcessor(t, func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
		return []*extprocsvc.ProcessingResponse{cont(req, &extprocsvc.CommonResponse{
			HeaderMutation:  &extprocsvc.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{hdr("x-ext-proc", "seen", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD)}},
			ClearRouteCache: true,
		})}, nil
	}, nil)
	cfg := fmt.Sprintf(`listeners:
  - name: edge
    address: 127.0.0.1:0
admin:
  address: 127.0.0.1:0
upstreams:
  - name: app
    address: %s
agents:
  - name: authz
    transport: ext_proc
    address: %s
    options:
      processing_mode: "response_header_mode=SKIP"
routes:
  - name: default
    upstream: app
    agents: [authz]
`, strings.TrimPrefix(up.URL, "http://"), addr)
	path := filepath.Join(dir, "sidecar.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	sc := testutil.StartSidecar(t, exec.Command(bin, "run", "-config", path))
	listen, admin := sc.Addr, sc.Admin
	cl := &http.Client{Timeout: 10 * time.Second}
	var status int
	testutil.WaitFor(t, "a request through the processor", func() bool {
		resp, err := cl.Get("http://" + listen + "/")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		status = resp.StatusCode
		return status == 200
	})
	mu.Lock()
	got := upHeader.Get("X-Ext-Proc")
	mu.Unlock()
	if got != "seen" {
		t.Errorf("upstream header x-ext-proc = %q", got)
	}
	resp, err := cl.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), `sidecar_extproc_events_total{agent="authz",event="clear_route_cache_ignored"} 1`) {
		t.Errorf("/metrics lacks the ext_proc counter:\n%s", grepLines(string(body), "extproc"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
