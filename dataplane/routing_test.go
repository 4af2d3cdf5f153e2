package dataplane_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// routingProxy serves routes (YAML list items, indented under routes:)
// with one upstream, app, that answers with the route that reached it
// (the X-Up header the routes set) and the target it got.
func routingProxy(t *testing.T, routes string, agents map[string]string) (*proxy, *upstream) {
	t.Helper()
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Got-Route", r.Header.Get("X-Route"))
		w.Header().Set("X-Remove-Me", "1")
		fmt.Fprintf(w, "%s %s", r.Header.Get("X-Route"), r.RequestURI)
	})
	var ag strings.Builder
	inst := map[string]agentmux.Agent{}
	for name, path := range agents {
		fmt.Fprintf(&ag, "  - {name: %s, transport: uds, address: %q}\n", name, path)
		inst[name] = udsAgent(t, name, path, nil)
	}
	agentsYAML := "agents: []\n"
	if ag.Len() > 0 {
		agentsYAML = "agents:\n" + ag.String()
	}
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q}]
%sroutes:
%s`, u.addr(), agentsYAML, routes)))
	if err != nil {
		t.Fatal(err)
	}
	return startProxy(t, cfg, inst, nil), u
}

// route renders a route that marks the requests it forwards with
// X-Route: name.
func route(name, match string) string {
	return fmt.Sprintf("  - {name: %s, upstream: app, request_headers: {set: [{name: X-Route, value: %s}]}, %s}\n", name, name, match)
}

// TestRouteMatchKinds: each match kind picks its route, in the documented
// order (exact path, regex, prefix longest first; the file's order among
// equals), on the normalised path.
func TestRouteMatchKinds(t *testing.T) {
	routes := route("exact", `path: /exact`) +
		route("regex", `path_regex: '/users/[0-9]+'`) +
		route("long", `path_prefix: /api/v1/`) +
		route("post", `path_prefix: /api/, methods: [POST, put]`) +
		route("canary", `path_prefix: /api/, headers: [{name: x-canary, exact: "yes"}]`) +
		route("beta", `path_prefix: /api/, headers: [{name: X-Tier, prefix: beta}]`) +
		route("agent", `path_prefix: /api/, headers: [{name: user-agent, regex: 'curl/.*'}]`) +
		route("nocookie", `path_prefix: /api/, headers: [{name: cookie, present: true, invert: true}]`) +
		route("debug", `path_prefix: /api/, query: [{name: debug, exact: "1"}]`) +
		route("api", `path_prefix: /api/`) +
		route("q-inv", `path_prefix: /q/, query: [{name: token, present: true, invert: true}]`) +
		route("q-re", `path_prefix: /q/, query: [{name: id, regex: '[0-9]{1,3}'}]`) +
		route("q", `path_prefix: /q/`) +
		route("root", `path_prefix: /`)
	p, _ := routingProxy(t, routes, nil)
	for _, tc := range []struct {
		method, path string
		hdr          []string
		want         string
	}{
		{"GET", "/exact", nil, "exact"},
		{"GET", "/exact/more", nil, "root"},
		{"GET", "/a/../exact", nil, "exact"}, // normalised first
		{"GET", "/users/42", nil, "regex"},
		{"GET", "/users/42x", nil, "root"}, // anchored
		{"GET", "/api/v1/x", []string{"Cookie", "a=b"}, "long"},
		{"POST", "/api/x", []string{"Cookie", "a=b"}, "post"},
		{"PUT", "/api/x", []string{"Cookie", "a=b"}, "post"},
		{"GET", "/api/x", []string{"Cookie", "a=b", "X-Canary", "yes"}, "canary"},
		{"GET", "/api/x", []string{"Cookie", "a=b", "X-Canary", "no"}, "api"},
		{"GET", "/api/x", []string{"Cookie", "a=b", "x-tier", "beta-2"}, "beta"},
		{"GET", "/api/x", []string{"Cookie", "a=b", "User-Agent", "curl/8.0"}, "agent"},
		{"GET", "/api/x", []string{"Cookie", "a=b", "User-Agent", "xcurl/8.0"}, "api"},
		{"GET", "/api/x", []string{"User-Agent", "browser"}, "nocookie"},
		{"GET", "/api/x?a=2&debug=1", []string{"Cookie", "a=b"}, "debug"},
		{"GET", "/api/x?debug=10", []string{"Cookie", "a=b"}, "api"},
		{"GET", "/other", nil, "root"},
		{"GET", "/q/x", nil, "q-inv"},
		{"GET", "/q/x?token", nil, "q"},
		{"GET", "/q/x?token=1&id=12", nil, "q-re"},
		{"GET", "/q/x?token=1&id=1234", nil, "q"},
		{"GET", "/q/x?id=12&token=", nil, "q-re"},
	} {
		resp, body := p.do(t, tc.method, tc.path, nil, tc.hdr...)
		if got := resp.Header.Get("X-Got-Route"); resp.StatusCode != 200 || got != tc.want {
			t.Errorf("%s %s %v: %d route %q (%s), want %q", tc.method, tc.path, tc.hdr, resp.StatusCode, got, body, tc.want)
		}
	}
}

// TestRouteRewrite: prefix and regex rewrites change the upstream's
// target (query kept, re-encoded); every agent's uri is the rewritten
// target, one with the client's view also gets the client's as
// request_target, metadata.path stays the path as routed, and only the
// forwarded view shows the route's request header operations.
func TestRouteRewrite(t *testing.T) {
	var mu sync.Mutex
	views := map[string]string{}
	record := func(name string) *agentFuncs {
		return &agentFuncs{Base: sdk.Base{Caps: headersOnly()}, reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, _ *protocol.Decision) error {
			route := ""
			for _, h := range m.Headers {
				if string(h.Name) == "x-route" {
					route = string(h.Value)
				}
			}
			mu.Lock()
			views[name] = string(m.URI) + " target=" + string(m.RequestTarget) + " path=" + string(m.Metadata.Path) + " route=" + route
			mu.Unlock()
			return nil
		}}
	}
	client := serveAgent(t, record("client"))
	fwd := serveAgentUpstreamView(t, record("fwd"))
	routes := `  - {name: pfx, upstream: app, path_prefix: /old/, rewrite: {prefix: /new/}, agents: [c, f],
     request_headers: {set: [{name: X-Route, value: pfx}]}}
  - {name: re, upstream: app, path_regex: '/u/([0-9]+)/(.*)', rewrite: {regex: {pattern: '^/u/([0-9]+)/(.*)$', substitution: '/users/$1/$2'}},
     request_headers: {set: [{name: X-Route, value: re}]}}
`
	p, u := routingProxy(t, routes, map[string]string{"c": client, "f": fwd})
	resp, body := p.do(t, "GET", "/old/a%20b/c?x=1&y=%2F", nil)
	if resp.StatusCode != 200 || u.last(t).URI != "/new/a%20b/c?x=1&y=%2F" {
		t.Fatalf("prefix rewrite: %d %q, upstream got %q", resp.StatusCode, body, u.last(t).URI)
	}
	mu.Lock()
	c, f := views["client"], views["fwd"]
	mu.Unlock()
	if c != "/new/a%20b/c?x=1&y=%2F target=/old/a%20b/c?x=1&y=%2F path=/old/a b/c route=" || f != "/new/a%20b/c?x=1&y=%2F target= path=/old/a b/c route=pfx" {
		t.Errorf("client view %q, forwarded view %q", c, f)
	}
	resp, body = p.do(t, "GET", "/u/42/profile?z", nil)
	if resp.StatusCode != 200 || u.last(t).URI != "/users/42/profile?z" {
		t.Fatalf("regex rewrite: %d %q, upstream got %q", resp.StatusCode, body, u.last(t).URI)
	}
}

// TestRouteHeaderOps: request and response header operations of a route
// (remove, set, add) reach the upstream and the client.
func TestRouteHeaderOps(t *testing.T) {
	routes := `  - name: h
    upstream: app
    request_headers:
      remove: [x-secret]
      set: [{name: X-Route, value: h}, {name: X-Env, value: prod}]
      add: [{name: X-Multi, value: b}]
    response_headers:
      remove: [x-remove-me]
      set: [{name: Cache-Control, value: no-store}]
      add: [{name: X-Served-By, value: sidecar}]
`
	p, u := routingProxy(t, routes, nil)
	resp, _ := p.do(t, "GET", "/", nil, "X-Secret", "s", "X-Env", "dev", "X-Multi", "a")
	got := u.last(t).Header
	if got.Get("X-Secret") != "" || got.Get("X-Env") != "prod" || strings.Join(got.Values("X-Multi"), ",") != "a,b" || got.Get("X-Route") != "h" {
		t.Errorf("upstream headers %v", got)
	}
	if resp.Header.Get("X-Remove-Me") != "" || resp.Header.Get("Cache-Control") != "no-store" || resp.Header.Get("X-Served-By") != "sidecar" || resp.Header.Get("X-Got-Route") != "h" {
		t.Errorf("response headers %v", resp.Header)
	}
}

// TestRouteDirectAndRedirect: direct responses and redirects answer
// without the upstream, with the route's response headers; the redirect
// builds its Location from the request's URL.
func TestRouteDirectAndRedirect(t *testing.T) {
	routes := `  - {name: health, path: /healthz, direct_response: {status: 200, body: "ok\n"}, response_headers: {add: [{name: X-Direct, value: "1"}]}}
  - {name: gone, path_prefix: /gone/, direct_response: {status: 410}}
  - {name: up, hosts: [plain.example], redirect: {https: true, status: 308}}
  - {name: moved, path_prefix: /old/, redirect: {prefix_rewrite: /new/, status: 302}}
  - {name: elsewhere, path_prefix: /x/, redirect: {host: "other.example:8443", path: /y, strip_query: true}}
  - {name: default, upstream: app}
`
	p, u := routingProxy(t, routes, nil)
	for _, tc := range []struct {
		path, host string
		status     int
		loc, body  string
	}{
		{"/healthz", "", 200, "", "ok\n"},
		{"/gone/x", "", 410, "", ""},
		{"/a/b?q=1", "plain.example:8080", 308, "https://plain.example/a/b?q=1", ""},
		{"/old/p%20q?z=2", "", 302, "http://HOST/new/p%20q?z=2", ""},
		{"/x/1?z=3", "", 301, "http://other.example:8443/y", ""},
	} {
		var hdr []string
		if tc.host != "" {
			hdr = []string{"Host", tc.host}
		}
		resp, body := p.do(t, "GET", tc.path, nil, hdr...)
		loc := strings.ReplaceAll(tc.loc, "HOST", p.addr)
		if resp.StatusCode != tc.status || resp.Header.Get("Location") != loc || body != tc.body {
			t.Errorf("%s: %d Location %q body %q; want %d %q %q", tc.path, resp.StatusCode, resp.Header.Get("Location"), body, tc.status, loc, tc.body)
		}
		if tc.path == "/healthz" && (resp.Header.Get("X-Direct") != "1" || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain")) {
			t.Errorf("direct response headers %v", resp.Header)
		}
	}
	if n := u.count(); n != 0 {
		t.Errorf("upstream saw %d requests", n)
	}
}
