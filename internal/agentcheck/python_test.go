package agentcheck

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/handshake"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

const pythonAgent = "../../examples/python-agent/agent.py"

// startPython runs examples/python-agent, or skips t (saying why) when
// python3 is not installed.
func startPython(t *testing.T) (addr string, pid int) {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found in PATH: the Python example agent cannot run here")
	}
	addr = filepath.Join(testutil.SocketDir(t), "py.sock")
	cmd := startProc(t, py, pythonAgent, "--socket", addr, "--log-level", "warning")
	waitSocket(t, addr)
	return addr, cmd.Process.Pid
}

// TestPythonAgent: the Python example passes every check, a soak with its
// memory watched, and the policy expectations of the demo agent.
func TestPythonAgent(t *testing.T) {
	addr, pid := startPython(t)
	x, err := LoadExpectations("../../examples/python-agent/expectations.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rep := run(t, Config{Address: addr, PID: pid, Requests: 2000, Expectations: x})
	wantAllPass(t, rep)
	if rep.Agent != "python-agent" || rep.Soak == nil || rep.Soak.Errors != 0 || len(rep.Soak.RSS) < 4 {
		t.Fatalf("report: agent %q soak %+v", rep.Agent, rep.Soak)
	}
	n := 0
	for _, r := range rep.Results {
		if strings.HasPrefix(r.ID, "expect:") {
			n++
		}
	}
	if n != len(x.Cases) {
		t.Fatalf("%d expectations ran, want %d", n, len(x.Cases))
	}
	t.Logf("soak: %s", rep.Find("soak").Detail)
}

// TestDemoAgentExpectations: the Go demo agent meets the same
// expectations as its Python port.
func TestDemoAgentExpectations(t *testing.T) {
	x, err := LoadExpectations("../../examples/python-agent/expectations.yaml")
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, TransportUDS, newDemo(t))
	wantAllPass(t, run(t, Config{Address: addr, SkipChecks: true, Expectations: x}))
}

// TestPythonAgentThroughSidecar runs the Python agent behind the real
// sidecar binary and checks its policy from an HTTP client.
func TestPythonAgentThroughSidecar(t *testing.T) {
	sock, _ := startPython(t)
	bin := testutil.BuildBinary(t, "./cmd/sidecar")
	var upstreamHits atomic.Int64
	var mu sync.Mutex
	seen := map[string]http.Header{}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamHits.Add(1)
		mu.Lock()
		seen[r.URL.Path] = r.Header.Clone()
		mu.Unlock()
		if r.URL.Path == "/doc" {
			w.Header().Set("Content-Type", "text/plain")
			f := w.(http.Flusher)
			// The word split over two writes, so over two body chunks.
			_, _ = io.WriteString(w, "the sec")
			f.Flush()
			_, _ = io.WriteString(w, "ret is out, SECRET too")
			return
		}
		_, _ = io.WriteString(w, "hello from upstream")
	}))
	t.Cleanup(up.Close)

	cfgPath := filepath.Join(testutil.SocketDir(t), "sidecar.yaml")
	cfg := fmt.Sprintf(`listeners: [{name: main, address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q}]
agents:
  - name: python
    transport: uds
    address: %q
    failure_mode: closed
    request_body: {mode: none}
    response_body: {mode: streaming}
routes: [{name: default, upstream: app, agents: [python]}]
admin: {address: "127.0.0.1:0"}
logging: {level: info, format: json}
`, strings.TrimPrefix(up.URL, "http://"), sock)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	base := "http://" + testutil.StartSidecar(t, exec.Command(bin, "run", "-config", cfgPath)).Addr

	client := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path, ua string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", base+path, nil)
		if ua != "" {
			req.Header.Set("User-Agent", ua)
		}
		// The agent connects in the background: retry 503 until it is up.
		deadline := time.Now().Add(20 * time.Second)
		for {
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("GET %s: %v", path, err)
			}
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable || time.Now().After(deadline) {
				return resp, string(b)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	resp, body := get("/hello", "curl/8.5.0")
	if resp.StatusCode != 200 || body != "hello from upstream" || resp.Header.Get("X-Inspected-By") != "python-agent" {
		t.Fatalf("/hello: %d %v %q", resp.StatusCode, resp.Header, body)
	}
	mu.Lock()
	h := seen["/hello"]
	mu.Unlock()
	if h.Get("X-Demo") != "1" || h.Get("X-Client-Class") != "cli" {
		t.Fatalf("upstream saw %v", h)
	}

	hits := upstreamHits.Load()
	resp, body = get("/admin/settings", "")
	if resp.StatusCode != 403 || resp.Header.Get("X-Blocked-By") != "python-agent" || !strings.Contains(body, `"forbidden"`) {
		t.Fatalf("/admin: %d %v %q", resp.StatusCode, resp.Header, body)
	}
	resp, _ = get("/old/page?x=1", "")
	if resp.StatusCode != 302 || resp.Header.Get("Location") != "/new/page?x=1" {
		t.Fatalf("/old: %d %v", resp.StatusCode, resp.Header)
	}
	if n := upstreamHits.Load(); n != hits {
		t.Fatalf("blocked and redirected requests reached the upstream (%d hits)", n-hits)
	}

	resp, body = get("/doc", "")
	if resp.StatusCode != 200 || body != "the ****** is out, ****** too" {
		t.Fatalf("/doc: %d %q", resp.StatusCode, body)
	}

	// Concurrent requests through one agent connection.
	var wg sync.WaitGroup
	var bad atomic.Int64
	for i := 0; i < 32; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := client.Get(fmt.Sprintf("%s/item/%d", base, i))
			if err != nil {
				bad.Add(1)
				return
			}
			_, _ = io.Copy(io.Discard, r.Body)
			_ = r.Body.Close()
			if r.StatusCode != 200 || r.Header.Get("X-Inspected-By") != "python-agent" {
				bad.Add(1)
			}
		}()
	}
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d of 32 concurrent requests failed", bad.Load())
	}
}

// TestPythonAgentClientRequest: the Python example declares
// supports_client_request to a proxy that offers client_request, and
// only to one that does.
func TestPythonAgentClientRequest(t *testing.T) {
	addr, _ := startPython(t)
	for _, tc := range []struct {
		features []string
		want     bool
	}{
		{handshake.NewRequest("t").SupportedFeatures, true},
		{[]string{protocol.FeatureCancellation, protocol.FeatureInlineBody}, false},
	} {
		c, err := net.Dial("unix", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		req := protocol.HandshakeRequest{ProtocolVersion: 2, ClientName: "t", SupportedFeatures: tc.features}
		if err := uds.WriteFrame(c, &req); err != nil {
			t.Fatal(err)
		}
		typ, p, err := uds.NewFrameReader(c).Next()
		c.Close()
		if err != nil || typ != protocol.TypeHandshakeResponse {
			t.Fatalf("handshake answer: %s %v", typ, err)
		}
		var resp protocol.HandshakeResponse
		if err := protocol.DecodeHandshakeResponse(p, &resp); err != nil {
			t.Fatal(err)
		}
		if resp.Capabilities.SupportsClientRequest != tc.want {
			t.Errorf("offered %v: supports_client_request %v, want %v", tc.features, resp.Capabilities.SupportsClientRequest, tc.want)
		}
	}
}
