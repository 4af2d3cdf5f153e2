package dataplane_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
)

const slowBodyConfig = `
listeners:
  - name: test
    address: 127.0.0.1:0
    body_timeout: 1s
    body_min_rate: 4KiB
upstreams:
  - name: app
    address: {{.Upstream}}
routes:
  - name: main
    upstream: app
`

// slowPost sends a Content-Length body: 16 KiB at once (fasthttp reads up
// to 8 KiB of a body itself before the handler runs, under read_timeout),
// then pieces of size bytes, one every gap. It returns the status the
// proxy answered.
func slowPost(t *testing.T, addr string, pieces, size int, gap time.Duration) int {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(hangGuard))
	const burst = 16 << 10
	fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", burst+pieces*size, strings.Repeat("a", burst))
	go func() {
		for i := 0; i < pieces; i++ {
			if _, err := io.WriteString(c, strings.Repeat("b", size)); err != nil {
				return
			}
			time.Sleep(gap)
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: "POST"})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A request body below body_min_rate (4 KiB/s here) is answered 408 once
// it is body_timeout (1 s) behind, though each piece comes well within
// body_timeout; one well above the rate passes.
func TestBodyMinRate(t *testing.T) {
	u := newUpstream(t, nil)
	cfg := configText(t, slowBodyConfig, map[string]any{"Upstream": u.addr()})
	p := startProxy(t, cfg, map[string]agentmux.Agent{}, nil)
	if st := slowPost(t, p.addr, 40, 100, 100*time.Millisecond); st != 408 { // 1 KB/s
		t.Fatalf("a body at 1 KB/s: %d, want 408", st)
	}
	if n := p.srv.Stats().RequestBodyTooSlow; n != 1 {
		t.Errorf("RequestBodyTooSlow %d, want 1", n)
	}
	if st := slowPost(t, p.addr, 15, 2048, 50*time.Millisecond); st != 200 { // 40 KB/s
		t.Fatalf("a body at 40 KB/s: %d, want 200", st)
	}
}
