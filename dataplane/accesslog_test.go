package dataplane_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/accesslog"
	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// TestAccessLogProtocolAndRoute: an access log line names the protocol
// the client spoke, as it named it, and the route the request took.
func TestAccessLogProtocolAndRoute(t *testing.T) {
	up := newUpstream(t, nil)
	cfg := configText(t, `
listeners:
  - name: main
    address: 127.0.0.1:0
upstreams:
  - name: app
    address: {{.Upstream}}
routes:
  - name: api
    path_prefix: /api
    upstream: app
  - name: rest
    upstream: app
`, map[string]any{"Upstream": up.addr()})
	out := &testutil.LogBuffer{}
	al, err := accesslog.New(out, accesslog.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, cfg, nil, al)
	for _, req := range []string{
		"GET /api/x HTTP/1.0\r\nHost: a\r\n\r\n",
		"GET /other HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
	} {
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(hangGuard))
		_, _ = io.WriteString(c, req)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		c.Close()
	}
	var lines []map[string]any
	var raw []string
	testutil.WaitFor(t, "two access log lines", func() bool {
		lines, raw = lines[:0], raw[:0]
		for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil {
				lines = append(lines, m)
				raw = append(raw, l)
			}
		}
		return len(lines) == 2
	})
	for i, want := range []struct{ proto, route string }{{"HTTP/1.0", "api"}, {"HTTP/1.1", "rest"}} {
		if lines[i]["protocol"] != want.proto || lines[i]["route"] != want.route {
			t.Errorf("line %d: protocol %v route %v, want %s %s", i, lines[i]["protocol"], lines[i]["route"], want.proto, want.route)
		}
		// A JSON reader keeps one of a repeated key: the line itself
		// must carry the field once.
		if n := strings.Count(raw[i], `"protocol":`); n != 1 {
			t.Errorf("line %d: %d protocol fields: %s", i, n, raw[i])
		}
	}
}
