package edgetest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

// stallingAgent completes the handshake, then answers the first request
// frame with the header of a 1 MiB Decision frame and 100 bytes of it, and
// never sends the rest.
func stallingAgent(t *testing.T, path string) {
	t.Helper()
	caps := protocol.Capabilities{HandlesRequestHeaders: true, MaxConcurrentRequests: 100}
	testagent.Raw(t, path, caps, func(nc net.Conn, fr *uds.FrameReader) {
		stalled := false
		for {
			t, _, err := fr.Next()
			if err != nil {
				return
			}
			if t == protocol.TypeRequestHeaders && !stalled {
				stalled = true
				hdr := []byte{0x00, 0x10, 0x00, 0x00, byte(protocol.TypeDecision)}
				_, _ = nc.Write(append(hdr, []byte(strings.Repeat("{", 100))...))
			}
		}
	})
}

// TestStalledAgentFrame: an agent that starts a frame and stalls must not
// wedge its connection until the ping timeout. Past timeouts.frame the
// connection is dropped and the requests on it fail at once (503, the
// connection-lost answer of a fail-closed agent) — not after the message
// timeout (which would answer 504).
func TestStalledAgentFrame(t *testing.T) {
	dir := testutil.SocketDir(t)
	up := startUpstream(t)
	stallingAgent(t, filepath.Join(dir, "stall.sock"))
	sc := startSidecar(t, dir, fmt.Sprintf(`listeners:
  - name: edge
    address: 127.0.0.1:0
admin:
  address: 127.0.0.1:0
upstreams:
  - name: app
    address: %s
agents:
  - name: stall
    transport: uds
    address: %s
    failure_mode: closed
    timeouts: {message: 20s, request: 25s, frame: 300ms}
routes:
  - name: default
    upstream: app
    agents: [stall]
`, up.addr, filepath.Join(dir, "stall.sock")), "")
	testutil.WaitFor(t, "agent connected", func() bool {
		resp, err := http.Get("http://" + sc.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	var wg sync.WaitGroup
	statuses := make([]int, 8)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := (&http.Client{Timeout: longWait}).Get("http://" + sc.addr + "/")
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			statuses[i] = resp.StatusCode
		}()
	}
	wg.Wait()
	for i, st := range statuses {
		if st != 503 {
			t.Errorf("request %d: %d, want 503 (the connection dropped, not the message timeout)", i, st)
		}
	}
	found := false
	for _, line := range sc.log() {
		if strings.Contains(line, "stalled mid-frame") {
			found = true
		}
	}
	if !found {
		t.Errorf("no log line about the stalled frame")
	}
}

// TestAgentOutageLogsRateLimited: while a fail-closed agent is down every
// request fails the same way; the log gets a bounded number of lines for
// it, the counters get every request.
func TestAgentOutageLogsRateLimited(t *testing.T) {
	dir := testutil.SocketDir(t)
	up := startUpstream(t)
	sc := startSidecar(t, dir, edgeConfig(dir, up.addr, ""), "") // nobody serves policy.sock
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: longWait}
	const n = 300
	for i := 0; i < n; i++ {
		resp, err := client.Get("http://" + sc.addr + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 503 {
			t.Fatalf("request %d: %d, want 503", i, resp.StatusCode)
		}
	}
	if v := sc.counter(t, "fail_closed"); v != n {
		t.Errorf("fail_closed %v, want %d", v, n)
	}
	lines := 0
	for _, line := range sc.log() {
		if strings.Contains(line, `"message":"agent failed"`) {
			lines++
		}
	}
	if lines == 0 || lines > 10 {
		t.Errorf("%d 'agent failed' lines for %d failures, want 1..10", lines, n)
	}
}

// TestAdminHostCheck: the admin listener answers only loopback, IP and
// configured host names, so a DNS-rebound browser page cannot read it.
func TestAdminHostCheck(t *testing.T) {
	dir := testutil.SocketDir(t)
	up := startUpstream(t)
	sc := startSidecar(t, dir, edgeConfig(dir, up.addr, ""), "")
	for _, tc := range []struct {
		host string
		want int
	}{
		{"evil.example", 421},
		{"evil.example:" + strings.Split(sc.admin, ":")[1], 421},
		{"", 421},
		{sc.admin, 200},
		{"localhost", 200},
		{"[::1]:9901", 200},
	} {
		for _, path := range []string{"/status", "/metrics", "/healthz"} {
			c, err := net.Dial("tcp", sc.admin)
			if err != nil {
				t.Fatal(err)
			}
			req := "GET " + path + " HTTP/1.1\r\nHost: " + tc.host + "\r\nConnection: close\r\n\r\n"
			if tc.host == "" {
				req = "GET " + path + " HTTP/1.0\r\n\r\n"
			}
			_, _ = io.WriteString(c, req)
			resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: "GET"})
			if err != nil {
				t.Fatalf("%s Host %q: %v", path, tc.host, err)
			}
			resp.Body.Close()
			c.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("%s with Host %q: %d, want %d", path, tc.host, resp.StatusCode, tc.want)
			}
		}
	}
}
