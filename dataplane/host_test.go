package dataplane_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// rawExchange sends raw on a fresh connection to addr and reads one
// response.
func rawExchange(t *testing.T, addr, raw string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(hangGuard))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: "GET"})
	if err != nil {
		t.Fatalf("%q: %v", raw, err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// TestHostGuardCanonical: a route for one host holds against every
// spelling of that host. The admin route (configured as "Admin.Example.")
// has a guard that blocks everything; the catch-all route has no agent.
// A trailing dot, upper case, a port or an absolute-form target must not
// reach the catch-all, and the guard, the upstream's Host and
// X-Forwarded-Host see the canonical host (server_name without the
// port). Percent-escapes and empty labels are refused outright.
func TestHostGuardCanonical(t *testing.T) {
	u := newUpstream(t, nil)
	var mu sync.Mutex
	var seen []string // "host|server_name" per guarded request
	guard := serveAgent(t, &agentFuncs{Base: sdk.Base{Caps: headersOnly()}, reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
		host := ""
		for _, h := range m.Headers {
			if string(h.Name) == "host" {
				host = string(h.Value)
			}
		}
		mu.Lock()
		seen = append(seen, host+"|"+string(m.Metadata.ServerName))
		mu.Unlock()
		d.Kind, d.Status, d.Body = protocol.DecisionBlock, 403, []byte("guarded")
		return nil
	}})
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q}]
agents: [{name: guard, transport: uds, address: %q}]
routes:
  - {name: admin, hosts: [Admin.Example.], upstream: app, agents: [guard]}
  - {name: default, upstream: app}
`, u.addr(), guard)))
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, cfg, map[string]agentmux.Agent{"guard": udsAgent(t, "guard", guard, nil)}, nil)
	for _, tc := range []struct {
		name, req string
		status    int
		seen      string // what the guard saw ("" for none)
		upHost    string // the upstream's Host and X-Forwarded-Host ("" for no upstream request)
	}{
		{"trailing dot", "GET /x HTTP/1.1\r\nHost: admin.example.\r\n\r\n", 403, "admin.example|admin.example", ""},
		{"trailing dot and port", "GET /x HTTP/1.1\r\nHost: admin.example.:80\r\n\r\n", 403, "admin.example:80|admin.example", ""},
		{"upper case and trailing dot", "GET /x HTTP/1.1\r\nHost: ADMIN.EXAMPLE.\r\n\r\n", 403, "admin.example|admin.example", ""},
		{"absolute-form with trailing dot", "GET http://admin.example./x HTTP/1.1\r\nHost: public.example\r\n\r\n", 403, "admin.example|admin.example", ""},
		{"two trailing dots", "GET /x HTTP/1.1\r\nHost: admin.example..\r\n\r\n", 400, "", ""},
		// fasthttp's parser refuses a percent-escaped ASCII byte itself
		// (reason "parse"); the sidecar refuses every other escape.
		{"percent-escape of an ASCII byte", "GET /x HTTP/1.1\r\nHost: adm%69n.example\r\n\r\n", 400, "", ""},
		{"percent-escape", "GET /x HTTP/1.1\r\nHost: adm%C3%AFn.example\r\n\r\n", 400, "", ""},
		{"leading dot", "GET /x HTTP/1.1\r\nHost: .admin.example\r\n\r\n", 400, "", ""},
		{"other host, trailing dot and port", "GET /x HTTP/1.1\r\nHost: Public.Example.:8080\r\n\r\n", 200, "", "public.example:8080"},
		{"other host", "GET /x HTTP/1.1\r\nHost: public.example\r\n\r\n", 200, "", "public.example"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := u.count()
			mu.Lock()
			seen = nil
			mu.Unlock()
			resp, body := rawExchange(t, p.addr, tc.req)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d %q, want %d", resp.StatusCode, body, tc.status)
			}
			mu.Lock()
			got := seen
			mu.Unlock()
			if (tc.seen == "" && len(got) != 0) || (tc.seen != "" && (len(got) != 1 || got[0] != tc.seen)) {
				t.Errorf("guard saw %q, want %q", got, tc.seen)
			}
			if tc.upHost == "" {
				if n := u.count(); n != before {
					t.Fatalf("upstream got %d requests", n-before)
				}
				return
			}
			r := u.last(t)
			if r.Host != tc.upHost || r.Header.Get("X-Forwarded-Host") != tc.upHost {
				t.Errorf("upstream Host %q X-Forwarded-Host %q, want %q", r.Host, r.Header.Get("X-Forwarded-Host"), tc.upHost)
			}
		})
	}
	if st := p.srv.Stats(); st.Rejected["host"] != 3 || st.Rejected["parse"] != 1 {
		t.Errorf("rejected %v, want host 3, parse 1", st.Rejected)
	}
}

// TestAllocsCanonicalHost: rewriting a Host to its canonical form
// allocates nothing either (the gate of TestAllocsProxiedRequest, with
// a Host in upper case, with a trailing dot and a port; what the upstream
// gets for such a Host is TestHostGuardCanonical's).
func TestAllocsCanonicalHost(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	p := startProxy(t, configText(t, oneAgentConfig, map[string]any{"Upstream": fastUpstream(t), "Chain": ""}), nil, nil)
	req := fasthttp.AcquireRequest()
	req.SetRequestURI("http://x/alloc")
	req.UseHostHeader = true
	req.Header.SetHost("WWW.Example.COM.:8080")
	do := steadyRequest(t, p.addr, req)
	if n := testing.AllocsPerRun(500, do); n > 0 {
		t.Errorf("%.2f allocations per proxied request, want 0", n)
	}
}
