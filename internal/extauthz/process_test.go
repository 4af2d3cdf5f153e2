package extauthz_test

import (
	"context"
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
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// TestMain removes the binary the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	testutil.RemoveBinaries()
	os.Exit(code)
}

// TestBinary runs the real sidecar binary with an ext_authz agent and an
// http_auth agent, each on a route, from its YAML configuration: their
// verdicts reach the upstream and the client, their counters /metrics;
// and check-config refuses an option it does not support at its line.
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
	_, addr := startAuth(t, func(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		return okResponse(&authv3.OkHttpResponse{Headers: []*corev3.HeaderValueOption{hvoAppend("X-User", "opa", false)}}), nil
	}, nil)
	fa := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Cookie") != "session=1" {
			w.Header().Set("Location", "https://login.example/")
			w.WriteHeader(302)
			return
		}
		w.Header().Set("X-Auth-Request-User", "proxy")
	}))
	defer fa.Close()
	cfg := fmt.Sprintf(`listeners:
  - name: edge
    address: 127.0.0.1:0
admin:
  address: 127.0.0.1:0
upstreams:
  - name: app
    address: %s
agents:
  - name: opa
    transport: ext_authz
    address: %s
  - name: oauth2
    transport: http_auth
    address: %s/oauth2/auth
    options:
      auth_response_headers: X-Auth-Request-User
routes:
  - name: api
    path_prefix: /api
    upstream: app
    agents: [opa]
  - name: web
    upstream: app
    agents: [oauth2]
`, strings.TrimPrefix(up.URL, "http://"), addr, fa.URL)
	path := filepath.Join(dir, "sidecar.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	sc := testutil.StartSidecar(t, exec.Command(bin, "run", "-config", path))
	cl := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(p, cookie string) int {
		req, _ := http.NewRequest(http.MethodGet, "http://"+sc.Addr+p, nil)
		if cookie != "" {
			req.Header.Set("Cookie", cookie)
		}
		resp, err := cl.Do(req)
		if err != nil {
			return 0
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	testutil.WaitFor(t, "a request through the ext_authz agent", func() bool { return do("/api/x", "") == 200 })
	mu.Lock()
	got := upHeader.Get("X-User")
	mu.Unlock()
	if got != "opa" {
		t.Errorf("upstream X-User = %q", got)
	}
	testutil.WaitFor(t, "a request through the http_auth agent", func() bool { return do("/web", "session=1") == 200 })
	mu.Lock()
	got = upHeader.Get("X-Auth-Request-User")
	mu.Unlock()
	if got != "proxy" {
		t.Errorf("upstream X-Auth-Request-User = %q", got)
	}
	if s := do("/web", ""); s != 302 {
		t.Errorf("without a session: status %d, want 302", s)
	}
	resp, err := cl.Get("http://" + sc.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		`sidecar_authz_events_total{agent="opa",event="ok",transport="ext_authz"} 1`,
		`sidecar_authz_events_total{agent="oauth2",event="denied",transport="http_auth"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	bad := strings.Replace(cfg, "      auth_response_headers: X-Auth-Request-User", "      auth_response_headers: X-Auth-Request-User\n      with_request_body: \"true\"", 1)
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "check-config", path).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "line 18: agents[1].options.with_request_body") {
		t.Errorf("check-config: %v\n%s", err, out)
	}
}
