package edgetest

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/protocol"
)

// The head-ambiguity rows: spellings of a host, fragments in a target
// and agent header values that two HTTP implementations read two ways.
// They run on a sidecar of their own (hostConfig) whose catch-all route
// has no agent, as in the deployment they guard: a host route with a
// guard agent in front of an upstream with name-based virtual hosts
// (nginx's server_name, Go's ServeMux host patterns). A spelling of the
// guarded host that routes past the guard is answered by the upstream
// for that very host.

// hostConfig routes admin.example through the policy agent (which blocks
// it), checked.example (configured as "Checked.Example.") through the
// policy agent (which allows it, or does what x-edge says), and anything
// else straight to the upstream.
func hostConfig(dir, upstream string) string {
	return fmt.Sprintf(`listeners:
  - name: edge
    address: 127.0.0.1:0
    read_timeout: 1s
admin:
  address: 127.0.0.1:0
upstreams:
  - name: app
    address: %s
agents:
  - name: policy
    transport: uds
    address: %s
    failure_mode: closed
    timeouts: {message: 5s, request: 10s}
routes:
  - name: admin
    hosts: [admin.example]
    upstream: app
    agents: [policy]
  - name: checked
    hosts: [Checked.Example.]
    upstream: app
    agents: [policy]
  - name: default
    upstream: app
`, upstream, filepath.Join(dir, "policy.sock"))
}

// ctlValues are the request header operations of x-edge: ctl-req: six
// values RFC 9110 does not allow (refused), then two it does.
var ctlValues = [][2]string{
	{"x-ctl-soh", "a\x01b"}, {"x-ctl-vt", "a\x0bb"}, {"x-ctl-del", "a\x7fb"}, {"x-ctl-esc", "a\x1bb"},
	{"x-ctl-lead", " a"}, {"x-ctl-trail", "a\t"},
	{"x-ctl-ok", "a b\tc"}, {"x-ctl-obs", "caf\xe9"},
}

// ctlReply is the policy agent's answer to x-edge: ctl-…:
//
//	ctl-req    allow, setting the request headers of ctlValues
//	ctl-resp   allow, setting response headers x-ctl (with an ESC) and x-ctl-ok
//	ctl-block  block 403 with headers X-Ctl (with a DEL) and X-Ctl-Ok
func ctlReply(edge string, d *protocol.Decision) {
	set := func(name, value string) protocol.HeaderOp {
		return protocol.HeaderOp{Op: protocol.HeaderSet, Name: []byte(name), Value: []byte(value)}
	}
	switch edge {
	case "ctl-req":
		for _, kv := range ctlValues {
			d.RequestHeaderOps = append(d.RequestHeaderOps, set(kv[0], kv[1]))
		}
	case "ctl-resp":
		d.ResponseHeaderOps = append(d.ResponseHeaderOps, set("x-ctl", "a\x1bb"), set("x-ctl-ok", "fine"))
	case "ctl-block":
		d.Kind, d.Status = protocol.DecisionBlock, 403
		d.BlockHeaders = append(d.BlockHeaders, protocol.Header{Name: []byte("X-Ctl"), Value: []byte("a\x7fb")},
			protocol.Header{Name: []byte("X-Ctl-Ok"), Value: []byte("fine")})
	}
}

// withHeaders is a forwarded request with header lines added at its end
// (where an agent's set operations go).
func withHeaders(req string, lines ...string) string {
	return strings.TrimSuffix(req, "\r\n") + strings.Join(lines, "\r\n") + "\r\n\r\n"
}

var hostCases = []edgeCase{
	// --- One host, one spelling: every form of admin.example meets its guard.
	{name: "trailing dot", req: get("/x", "admin.example.", "h1"),
		want: []int{403}, body: "admin-blocked", agent: []string{"GET admin.example /x"}},
	{name: "trailing dot and port", req: get("/x", "admin.example.:80", "h2"),
		want: []int{403}, body: "admin-blocked", agent: []string{"GET admin.example:80 /x"}},
	{name: "upper case and trailing dot", req: get("/x", "ADMIN.EXAMPLE.", "h3"),
		want: []int{403}, body: "admin-blocked", agent: []string{"GET admin.example /x"}},
	{name: "absolute-form with trailing dot", req: get("http://admin.example./x", "public.example", "h4"),
		want: []int{403}, body: "admin-blocked", agent: []string{"GET admin.example /x"}},
	{name: "two trailing dots refused", req: get("/x", "admin.example..", "h5"), want: []int{400}, closed: true},
	{name: "leading dot refused", req: get("/x", ".admin.example", "h6"), want: []int{400}, closed: true},
	{name: "empty label refused", req: get("/x", "admin..example", "h7"), want: []int{400}, closed: true},
	// fasthttp refuses a percent-escaped ASCII byte in a host itself; the
	// sidecar refuses every other escape.
	{name: "percent-escaped ASCII refused", req: get("/x", "adm%69n.example", "h8"), want: []int{400}, closed: true},
	{name: "percent-escape refused", req: get("/x", "adm%C3%AFn.example", "h9"), want: []int{400}, closed: true},
	{name: "absolute-form with a percent-escape refused", req: get("http://adm%C3%AFn.example/x", "public.example", "h10"), want: []int{400}, closed: true},
	// The canonical host reaches the upstream, the client's port kept.
	{name: "other host: upstream gets the canonical form", req: get("/x", "Public.Example.:8080", "h11"),
		want: []int{200}, up: []string{fwdNoAgent("/x", "public.example:8080", "h11")}},
	{name: "configured Checked.Example. routes checked.example", req: get("/c", "checked.example", "h12"),
		want: []int{200}, up: []string{fwd("GET", "/c", "checked.example", "h12")}, agent: []string{"GET checked.example /c"}},

	// --- A fragment is never sent: "/public#/../admin" is /admin to a
	// server that takes '#' for a path byte and cleans the path.
	{name: "fragment in an origin-form target refused", req: get("/public#/../admin", "public.example", "h13"), want: []int{400}, closed: true},
	{name: "fragment after a query refused", req: get("/public?a=#/../admin", "checked.example", "h14"), want: []int{400}, closed: true},
	// A backslash is '/' to some servers (IIS): "/public\..\admin" is
	// /admin to them, raw or percent-escaped.
	{name: "backslash in the path refused", req: get(`/public\..\admin`, "public.example", "h18"), want: []int{400}, closed: true},
	{name: "escaped backslash in the path refused", req: get("/public%5C..%5Cadmin", "public.example", "h19"), want: []int{400}, closed: true},

	// --- Agent header values are RFC 9110 field-values.
	{name: "request values with controls refused", req: get("/x", "checked.example", "h15", "X-Edge: ctl-req"),
		want: []int{200}, agent: []string{"GET checked.example /x"},
		up: []string{withHeaders(fwdNoAgent("/x", "checked.example", "h15", "X-Edge: ctl-req"), "x-ctl-ok: a b\tc", "x-ctl-obs: caf\xe9")}},
	{name: "response value with ESC refused", req: get("/x", "checked.example", "h16", "X-Edge: ctl-resp"),
		want: []int{200}, noHeader: "X-Ctl", header: "X-Ctl-Ok: fine",
		up: []string{fwdNoAgent("/x", "checked.example", "h16", "X-Edge: ctl-resp")}},
	{name: "block header value with DEL refused", req: get("/x", "checked.example", "h17", "X-Edge: ctl-block"),
		want: []int{403}, noHeader: "X-Ctl", header: "X-Ctl-Ok: fine"},
}

// TestHostTable runs hostCases against one sidecar (hostConfig) with the
// suite's row runner: the client's statuses and connection, and exactly
// what the upstream and the agent got.
func TestHostTable(t *testing.T) {
	dir := testutil.SocketDir(t)
	env := &edgeEnv{up: startUpstream(t), agent: newPolicyAgent(), dir: dir}
	testagent.Serve(t, filepath.Join(dir, "policy.sock"), env.agent)
	env.sc = startSidecar(t, dir, hostConfig(dir, env.up.addr), "")
	testutil.WaitFor(t, "agent connected", func() bool {
		resp, err := http.Get("http://" + env.sc.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	for _, tc := range hostCases {
		t.Run(tc.name, func(t *testing.T) {
			env.up.take()
			env.agent.take()
			runCase(t, env.sc.addr, tc)
			got := env.up.take()
			if !tc.closed {
				// The probe came last (probe.example: the catch-all, no agent).
				if len(got) == 0 || !strings.HasPrefix(got[len(got)-1], "GET /probe ") {
					t.Fatalf("upstream did not get the probe last: %q", got)
				}
				got = got[:len(got)-1]
			}
			if len(got) != len(tc.up) || (len(got) > 0 && !reflect.DeepEqual(got, tc.up)) {
				t.Errorf("upstream received:\n%s\nwant:\n%s", quoteAll(got), quoteAll(tc.up))
			}
			if seen := env.agent.take(); tc.agent != nil && !reflect.DeepEqual(seen, tc.agent) {
				t.Errorf("agent saw %q, want %q", seen, tc.agent)
			}
		})
	}
	t.Run("counters", func(t *testing.T) {
		// ctl-req: 6 refused, ctl-resp: 1, ctl-block: 1. Rejected: host
		// h5, h6, h7, h9, h10 (an absolute-form authority is the Host);
		// target h13, h14, h18, h19; parse h8 (fasthttp).
		if v := env.sc.counter(t, "mutations_refused"); v != 8 {
			t.Errorf("mutations_refused %v, want 8", v)
		}
		resp, err := http.Get("http://" + env.sc.admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		prom, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, want := range []string{
			`sidecar_requests_rejected_total{reason="host"} 5`,
			`sidecar_requests_rejected_total{reason="target"} 4`,
			`sidecar_requests_rejected_total{reason="parse"} 1`,
		} {
			if !strings.Contains(string(prom), want) {
				t.Errorf("/metrics lacks %q", want)
			}
		}
	})
}
