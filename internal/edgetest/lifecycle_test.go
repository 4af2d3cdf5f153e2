package edgetest

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
)

// The client connection's life at the edge, from accept to close: idle
// connections, the connection limit, closing after a refused request
// (lingering close) and the end of an Upgrade tunnel (idle_test.go,
// connlimit_test.go, linger_test.go, tunnelend_test.go). Here: the
// sidecar they run and the helpers they share.

// lcEnv is a sidecar with the suite's agent in front of the recording
// upstream (host *.example) and a tunnel upstream (host tunnel.example).
type lcEnv struct {
	sc    *sidecar
	up    *rawUpstream
	tun   *tunnelUpstream
	agent *policyAgent
	addrs []string // the listeners' addresses, in configuration order
	pki   *testutil.PKI
	cert  testutil.Cert // the TLS listeners' certificate, for edge.example
}

// startLifecycle runs a sidecar whose listeners are the YAML list items
// of listeners ("%[1]s" in it is replaced by the TLS block for
// edge.example), with args added to its command line.
func startLifecycle(t *testing.T, listeners string, args ...string) *lcEnv {
	t.Helper()
	dir := testutil.SocketDir(t)
	env := &lcEnv{up: startUpstream(t), tun: startTunnelUpstream(t), agent: newPolicyAgent()}
	env.pki = testutil.NewPKI(t, "edge-ca")
	env.cert = env.pki.Server(t, "edge", "edge.example")
	tlsBlock := fmt.Sprintf("    tls:\n      certificates: [{cert_file: %s, key_file: %s}]", env.cert.CertFile, env.cert.KeyFile)
	listeners = strings.ReplaceAll(listeners, "%[1]s", tlsBlock)
	testagent.Serve(t, filepath.Join(dir, "policy.sock"), env.agent)
	config := fmt.Sprintf(`listeners:
%s
admin:
  address: 127.0.0.1:0
upstreams:
  - name: app
    address: %s
  - name: tun
    address: %s
agents:
  - name: policy
    transport: uds
    address: %s
    failure_mode: closed
    timeouts: {message: 5s, request: 10s}
routes:
  - name: tunnel
    hosts: [tunnel.example]
    upstream: tun
    agents: [policy]
  - name: default
    upstream: app
    agents: [policy]
`, listeners, env.up.addr, env.tun.addr, filepath.Join(dir, "policy.sock"))
	path := filepath.Join(dir, "sidecar.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(sidecarBinary(t), append([]string{"run", "-config", path, "-log-level", "debug"}, args...)...)
	sc := testutil.StartSidecar(t, cmd)
	env.sc = &sidecar{Sidecar: sc, t: t, addr: sc.Addr, admin: sc.Admin, exited: sc.Exited}
	env.addrs = servingAddrs(t, env.sc)
	testutil.WaitFor(t, "agent connected", func() bool {
		resp, err := http.Get("http://" + env.sc.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return env
}

// servingAddrs reads every listener's address from the "sidecar serving"
// line.
func servingAddrs(t *testing.T, sc *sidecar) []string {
	t.Helper()
	for _, line := range sc.log() {
		var m struct {
			Message   string   `json:"message"`
			Listeners []string `json:"listeners"`
		}
		if json.Unmarshal([]byte(line), &m) == nil && m.Message == "sidecar serving" {
			return m.Listeners
		}
	}
	t.Fatal("no serving line")
	return nil
}

// tlsDial opens a TLS connection to a listener of env (handshake done).
func (env *lcEnv) tlsDial(t *testing.T, addr string) *tls.Conn {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: longWait}, "tcp", addr,
		&tls.Config{RootCAs: env.pki.Pool, ServerName: "edge.example"})
	if err != nil {
		t.Fatalf("TLS dial %s: %v", addr, err)
	}
	return c
}

// connStats is the listener's entry of /status requests.connections.
func connStats(t *testing.T, sc *sidecar, listener string) map[string]float64 {
	t.Helper()
	req, _ := sc.status(t)["requests"].(map[string]any)
	list, _ := req["connections"].([]any)
	for _, e := range list {
		m, _ := e.(map[string]any)
		if m["listener"] == listener {
			out := map[string]float64{}
			for k, v := range m {
				if f, ok := v.(float64); ok {
					out[k] = f
				}
			}
			return out
		}
	}
	t.Fatalf("/status has no connection counters for listener %s: %v", listener, req["connections"])
	return nil
}

// tunnelStats is /status requests.tunnels.
func tunnelStats(t *testing.T, sc *sidecar) map[string]any {
	t.Helper()
	req, _ := sc.status(t)["requests"].(map[string]any)
	m, _ := req["tunnels"].(map[string]any)
	return m
}

// promText is the admin /metrics page.
func promText(t *testing.T, sc *sidecar) string {
	t.Helper()
	resp, err := http.Get("http://" + sc.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// closedUnanswered reads c until it ends: it must end (EOF or a reset)
// without a single byte.
func closedUnanswered(c net.Conn) error {
	_ = c.SetReadDeadline(time.Now().Add(longWait))
	b, err := io.ReadAll(c)
	switch {
	case len(b) > 0:
		return fmt.Errorf("read %q, want the connection closed without a byte", clipText(b))
	case err == nil, errors.Is(err, syscall.ECONNRESET):
		return nil
	default:
		return fmt.Errorf("connection not closed: %v", err)
	}
}

func clipText(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "…"
	}
	return string(b)
}

// roundTrip sends a GET on c and reads its response's status.
func roundTrip(c net.Conn, br *bufio.Reader, target, host, id string) (int, error) {
	_ = c.SetDeadline(time.Now().Add(longWait))
	if _, err := io.WriteString(c, get(target, host, id)); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(br, &http.Request{Method: "GET"})
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// readerConn reads through br (bytes it buffered first).
type readerConn struct {
	net.Conn
	br *bufio.Reader
}

func (c readerConn) Read(p []byte) (int, error) { return c.br.Read(p) }

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
