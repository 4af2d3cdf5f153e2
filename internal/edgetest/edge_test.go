package edgetest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
)

// edgeCase is one row: raw bytes sent at once on a fresh connection.
type edgeCase struct {
	name string
	req  string
	// method of the requests whose responses are read (HEAD has no body).
	method string
	// want are the statuses the client must read, in order.
	want []int
	// closed: the sidecar must close the connection after them; otherwise
	// it must keep it open (a probe request on it must succeed).
	closed bool
	// up are the exact requests the upstream must receive (nil: none).
	up []string
	// agent, when set, are the "METHOD host target" the agent must see.
	agent []string
	// body, when set, is the first response's body.
	body string
	// noHeader must not appear in any response.
	noHeader string
	// header "Name: value" must appear in the first response.
	header string
}

// fwd is the request the upstream gets for a GET/HEAD without a body
// sent with X-Request-Id: id and the given client headers, through the
// default agent (which adds x-agent: seen).
func fwd(method, target, host, id string, headers ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\nX-Request-Id: %s\r\n", method, target, host, id)
	for _, h := range headers {
		b.WriteString(h + "\r\n")
	}
	fmt.Fprintf(&b, "X-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\nX-Forwarded-Host: %s\r\nx-agent: seen\r\n\r\n", host)
	return b.String()
}

// fwdNoAgent is fwd for a GET the agent did not add its header to.
func fwdNoAgent(target, host, id string, headers ...string) string {
	return strings.Replace(fwd("GET", target, host, id, headers...), "x-agent: seen\r\n", "", 1)
}

// get is a GET request with an id and extra header lines.
func get(target, host, id string, headers ...string) string {
	s := "GET " + target + " HTTP/1.1\r\nHost: " + host + "\r\nX-Request-Id: " + id + "\r\n"
	for _, h := range headers {
		s += h + "\r\n"
	}
	return s + "\r\n"
}

const probe = "GET /probe HTTP/1.1\r\nHost: probe.example\r\nX-Request-Id: probe\r\n\r\n"

var edgeCases = []edgeCase{
	// --- Baseline.
	{name: "plain GET", req: get("/a?b=1", "public.example", "t1"), want: []int{200},
		up: []string{fwd("GET", "/a?b=1", "public.example", "t1")}, agent: []string{"GET public.example /a?b=1"}},

	// --- Absolute-form targets (RFC 9112 3.2.2): the URI's authority is the host.
	{name: "absolute-form routes by its authority, not Host", req: get("http://admin.example/secret", "public.example", "t2"),
		want: []int{403}, body: "admin-blocked", agent: []string{"GET admin.example /secret"}},
	{name: "absolute-form authority is case-insensitive and may carry a port", req: get("HTTP://ADMIN.Example:8080/secret", "public.example", "t3"),
		want: []int{403}, agent: []string{"GET admin.example:8080 /secret"}},
	{name: "absolute-form normalised to origin-form for agents and upstream", req: get("http://public.example/x?y=1", "other.example", "t4"),
		want: []int{200}, up: []string{fwd("GET", "/x?y=1", "public.example", "t4")}, agent: []string{"GET public.example /x?y=1"}},
	{name: "absolute-form without a path gets /", req: get("http://public.example?q", "other.example", "t5"),
		want: []int{200}, up: []string{fwd("GET", "/?q", "public.example", "t5")}},
	{name: "absolute-form with userinfo refused", req: get("http://user@admin.example/", "public.example", "t6"), want: []int{400}, closed: true},
	{name: "absolute-form with another scheme refused", req: get("ftp://admin.example/", "public.example", "t7"), want: []int{400}, closed: true},
	{name: "asterisk-form only for OPTIONS", req: get("*", "public.example", "t8"), want: []int{400}, closed: true},
	{name: "OPTIONS *", req: "OPTIONS * HTTP/1.1\r\nHost: public.example\r\nX-Request-Id: t9\r\n\r\n", want: []int{200},
		up: []string{fwd("OPTIONS", "*", "public.example", "t9")}},
	{name: "Host with @ refused", req: get("/", "admin.example@public.example", "t10"), want: []int{400}, closed: true},
	{name: "Host with a bad port refused", req: get("/", "public.example:99999", "t11"), want: []int{400}, closed: true},

	// --- Framing: smuggling attempts.
	{name: "Content-Length with Transfer-Encoding refused and closed",
		req:  "POST / HTTP/1.1\r\nHost: public.example\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: public.example\r\n\r\n",
		want: []int{400}, closed: true},
	{name: "Transfer-Encoding before Content-Length refused and closed",
		req:  "POST / HTTP/1.1\r\nHost: public.example\r\nTransfer-Encoding: chunked\r\nContent-Length: 48\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: public.example\r\n\r\n",
		want: []int{400}, closed: true},
	{name: "Connection: close in a token list closes", req: get("/c", "public.example", "t12", "Connection: close, x-foo", "X-Foo: hop"),
		want: []int{200}, closed: true, up: []string{fwd("GET", "/c", "public.example", "t12")}},
	{name: "two differing Content-Length", req: "POST / HTTP/1.1\r\nHost: public.example\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", want: []int{400}, closed: true},
	{name: "chunked, identity", req: "POST / HTTP/1.1\r\nHost: public.example\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n", want: []int{400}, closed: true},
	{name: "xchunked", req: "POST / HTTP/1.1\r\nHost: public.example\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", want: []int{400}, closed: true},
	{name: "obs-fold", req: "GET / HTTP/1.1\r\nHost: public.example\r\nX-A: a\r\n b\r\n\r\n", want: []int{400}, closed: true},
	// A bare LF never ends a header line for fasthttp: the head never
	// completes and read_timeout answers 408.
	{name: "bare LF", req: "GET / HTTP/1.1\nHost: public.example\n\n", want: []int{408}, closed: true},
	// Bare LF line ends in a head that a CRLF line completes: fasthttp
	// parses it, but its fields in order (what agents and the upstream
	// get) would be empty. Refused.
	{name: "bare LF lines, CRLF end", req: "GET / HTTP/1.1\r\nHost: public.example\nX-A: 1\n\r\n\r\n", want: []int{400}, closed: true},
	{name: "bad chunk size", req: "POST / HTTP/1.1\r\nHost: public.example\r\nX-Request-Id: t13\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", want: []int{400}, closed: true},
	{name: "NUL in a header value", req: "GET / HTTP/1.1\r\nHost: public.example\r\nX-A: a\x00b\r\n\r\n", want: []int{400}, closed: true},
	{name: "CR in a header value", req: "GET / HTTP/1.1\r\nHost: public.example\r\nX-A: a\rb\r\n\r\n", want: []int{400}, closed: true},
	{name: "space before colon", req: "GET / HTTP/1.1\r\nHost: public.example\r\nX-A : b\r\n\r\n", want: []int{400}, closed: true},
	{name: "duplicate Host", req: "GET / HTTP/1.1\r\nHost: public.example\r\nHost: admin.example\r\n\r\n", want: []int{400}, closed: true},
	{name: "HTTP/1.1 without Host", req: "GET / HTTP/1.1\r\n\r\n", want: []int{400}, closed: true},

	// --- Sizes.
	{name: "1 MB URI", req: "GET /" + strings.Repeat("a", 1<<20) + " HTTP/1.1\r\nHost: public.example\r\n\r\n", want: []int{414}, closed: true},
	{name: "10k headers", req: "GET / HTTP/1.1\r\nHost: public.example\r\n" + strings.Repeat("X-H: v\r\n", 10000) + "\r\n", want: []int{431}, closed: true},

	// --- Keep-alive and pipelining.
	{name: "pipelining after a blocked request", req: get("/blocked", "public.example", "t14") + get("/after", "public.example", "t15"),
		want: []int{403, 200}, up: []string{fwd("GET", "/after", "public.example", "t15")},
		agent: []string{"GET public.example /blocked", "GET public.example /after"}},
	{name: "HTTP/1.0 keep-alive", req: "GET /k HTTP/1.0\r\nHost: public.example\r\nX-Request-Id: t16\r\nConnection: keep-alive\r\n\r\n",
		want: []int{200}, up: []string{fwd("GET", "/k", "public.example", "t16")}},
	{name: "HTTP/1.0 without keep-alive closes", req: "GET /k HTTP/1.0\r\nHost: public.example\r\nX-Request-Id: t17\r\n\r\n",
		want: []int{200}, closed: true, up: []string{fwd("GET", "/k", "public.example", "t17")}},
	{name: "HEAD", req: "HEAD /h HTTP/1.1\r\nHost: public.example\r\nX-Request-Id: t18\r\n\r\n", method: "HEAD",
		want: []int{200}, up: []string{fwd("HEAD", "/h", "public.example", "t18")}},
	{name: "POST body forwarded", req: "POST /p HTTP/1.1\r\nHost: public.example\r\nX-Request-Id: t19\r\nContent-Length: 5\r\n\r\nhello",
		want: []int{200}, up: []string{"POST /p HTTP/1.1\r\nHost: public.example\r\nX-Request-Id: t19\r\nX-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\nX-Forwarded-Host: public.example\r\nx-agent: seen\r\nContent-Length: 5\r\n\r\nhello"}},

	// --- Upgrade: nothing past an upgrade request bypasses the agents.
	// An h2c tunnel would carry HTTP/2 requests no agent sees: the upgrade
	// is dropped and the pipelined request is one of the sidecar's.
	{name: "h2c upgrade refused, pipelined request goes through the agent",
		req: get("/upgrade", "public.example", "u1", "Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c", "HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA") +
			get("/blocked", "public.example", "u2"),
		want: []int{200, 403}, up: []string{fwd("GET", "/upgrade", "public.example", "u1")},
		agent: []string{"GET public.example /upgrade", "GET public.example /blocked"}},
	{name: "h2c anywhere in the Upgrade list, any case",
		req:  get("/upgrade", "public.example", "u3", "Connection: upgrade", "Upgrade: websocket, H2C/1.0") + get("/blocked", "public.example", "u4"),
		want: []int{200, 403}, up: []string{fwd("GET", "/upgrade", "public.example", "u3")}},
	{name: "Upgrade: HTTP/2.0 refused",
		req:  get("/upgrade", "public.example", "u5", "Connection: upgrade", "Upgrade: HTTP/2.0") + get("/blocked", "public.example", "u6"),
		want: []int{200, 403}, up: []string{fwd("GET", "/upgrade", "public.example", "u5")}},
	{name: "upgrade with Connection: close is no upgrade",
		req:  get("/upgrade", "public.example", "u7", "Connection: Upgrade, close", "Upgrade: websocket") + get("/blocked", "public.example", "u8"),
		want: []int{200}, closed: true, up: []string{fwd("GET", "/upgrade", "public.example", "u7")}},
	{name: "upgrade with a body is no upgrade",
		req: "GET /upgrade HTTP/1.1\r\nHost: public.example\r\nX-Request-Id: u9\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nContent-Length: 5\r\n\r\nhello" +
			get("/blocked", "public.example", "u10"),
		want: []int{200, 403},
		up:   []string{strings.Replace(fwd("GET", "/upgrade", "public.example", "u9"), "\r\n\r\n", "\r\nContent-Length: 5\r\n\r\nhello", 1)}},
	{name: "upgrade with a chunked body is no upgrade",
		req: "GET /upgrade HTTP/1.1\r\nHost: public.example\r\nX-Request-Id: u11\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" +
			get("/blocked", "public.example", "u12"),
		want: []int{200, 403},
		up:   []string{strings.Replace(fwd("GET", "/upgrade", "public.example", "u11"), "\r\n\r\n", "\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 1)}},
	{name: "upgrade over HTTP/1.0 is no upgrade",
		req:  "GET /upgrade HTTP/1.0\r\nHost: public.example\r\nX-Request-Id: u13\r\nConnection: Upgrade, keep-alive\r\nUpgrade: websocket\r\n\r\n",
		want: []int{200}, up: []string{fwd("GET", "/upgrade", "public.example", "u13")}},
	{name: "POST upgrade is no upgrade",
		req:  "POST /upgrade HTTP/1.1\r\nHost: public.example\r\nX-Request-Id: u14\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nContent-Length: 0\r\n\r\n" + get("/blocked", "public.example", "u15"),
		want: []int{200, 403},
		up:   []string{strings.Replace(fwd("POST", "/upgrade", "public.example", "u14"), "\r\n\r\n", "\r\nContent-Length: 0\r\n\r\n", 1)}},
	// HTTP/2 with prior knowledge never reaches the upstream either.
	{name: "HTTP/2 connection preface refused", req: "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + get("/blocked", "public.example", "u18"),
		want: []int{400}, closed: true},
	// The upstream refuses the upgrade: the pipelined bytes are the next
	// request, inspected like any other.
	{name: "pipelined request after an upgrade the upstream refuses",
		req:  get("/", "public.example", "u16", "Connection: Upgrade", "Upgrade: websocket") + get("/blocked", "public.example", "u17"),
		want: []int{200, 403}, agent: []string{"GET public.example /", "GET public.example /blocked"},
		up: []string{strings.Replace(fwd("GET", "/", "public.example", "u16"), "x-agent", "Connection: Upgrade\r\nUpgrade: websocket\r\nx-agent", 1)}},

	// --- Spoofing: a client cannot send what the sidecar sets.
	{name: "client X-Sidecar-* headers never reach the upstream",
		req:  get("/s", "public.example", "s1", "X-Sidecar-Inspection: partial", "x-sidecar-fail-open: policy", "X-SIDECAR-Whatever: 1", "X-Sidecar: kept"),
		want: []int{200}, up: []string{fwd("GET", "/s", "public.example", "s1", "X-Sidecar: kept")}},
	{name: "X-Forwarded-* and Forwarded from the client are replaced",
		req: get("/s", "public.example", "s2", "X-Forwarded-Proto: https", "X-Forwarded-For: 10.0.0.1", "X-Forwarded-Host: admin.example",
			"Forwarded: for=10.0.0.1;proto=https;host=admin.example"),
		want: []int{200}, up: []string{fwd("GET", "/s", "public.example", "s2")}},

	// --- Hostile agent replies.
	{name: "block cannot send a javascript: Location", req: get("/x", "public.example", "t20", "X-Edge: location-js"),
		want: []int{302}, noHeader: "Location"},
	{name: "block cannot send a network-path Location", req: get("/x", "public.example", "t21", "X-Edge: location-net"),
		want: []int{302}, noHeader: "Location"},
	{name: "response operations cannot set a javascript: Location", req: get("/x", "public.example", "t22", "X-Edge: resp-location"),
		want: []int{200}, noHeader: "Location",
		up: []string{fwdNoAgent("/x", "public.example", "t22", "X-Edge: resp-location")}},
	{name: "40,000 set operations: over the limit, fail closed", req: get("/x", "public.example", "t23", "X-Edge: set-many"), want: []int{503}},
	{name: "a 1 MiB header value: over the limit, fail closed", req: get("/x", "public.example", "t24", "X-Edge: big-value"), want: []int{503}},
	{name: "100,000 refused operations: over the limit, fail closed", req: get("/x", "public.example", "t25", "X-Edge: refuse-many"), want: []int{503}},
	{name: "200 refused operations: refused, request passes", req: get("/x", "public.example", "t26", "X-Edge: refuse-some"), want: []int{200},
		up: []string{fwdNoAgent("/x", "public.example", "t26", "X-Edge: refuse-some")}},
}

// TestEdgeTable runs every row against one sidecar process.
func TestEdgeTable(t *testing.T) {
	env := startEdge(t)
	for _, tc := range edgeCases {
		t.Run(tc.name, func(t *testing.T) {
			env.up.take()
			env.agent.take()
			runCase(t, env.sc.addr, tc)
			got := env.up.take()
			if !tc.closed {
				// The probe came last.
				if len(got) == 0 || !strings.HasPrefix(got[len(got)-1], "GET /probe ") {
					t.Fatalf("upstream did not get the probe last: %q", got)
				}
				got = got[:len(got)-1]
			}
			if len(got) != len(tc.up) || (len(got) > 0 && !reflect.DeepEqual(got, tc.up)) {
				t.Errorf("upstream received:\n%s\nwant:\n%s", quoteAll(got), quoteAll(tc.up))
			}
			if tc.agent != nil {
				seen := env.agent.take()
				if !tc.closed && len(seen) > 0 {
					seen = seen[:len(seen)-1] // the probe
				}
				if !reflect.DeepEqual(seen, tc.agent) {
					t.Errorf("agent saw %q, want %q", seen, tc.agent)
				}
			}
		})
	}
	// Agents always see the method, host and target the upstream gets:
	// checked row by row above; here, whole-log properties.
	t.Run("log lines have unique keys", func(t *testing.T) {
		for _, line := range env.sc.log() {
			if dup := testutil.DuplicateKey(line); dup != "" {
				t.Errorf("key %q twice in %s", dup, line)
			}
		}
	})
	t.Run("refusals logged once per reply", func(t *testing.T) {
		n := 0
		for _, line := range env.sc.log() {
			if strings.Contains(line, `"corr":"t26"`) && strings.Contains(line, "refused") {
				n++
				if !strings.Contains(line, `"refused":200`) {
					t.Errorf("refusal line without the count: %s", line)
				}
			}
		}
		if n != 1 {
			t.Errorf("%d refusal lines for one reply, want 1", n)
		}
		for _, id := range []string{"t23", "t25"} {
			c := 0
			for _, line := range env.sc.log() {
				if strings.Contains(line, `"corr":"`+id+`"`) {
					c++
				}
			}
			if c > 3 {
				t.Errorf("request %s wrote %d log lines", id, c)
			}
		}
	})
	t.Run("counters", func(t *testing.T) {
		if v := env.sc.counter(t, "limits_exceeded"); v != 3 {
			t.Errorf("limits_exceeded %v, want 3", v)
		}
		if v := env.sc.counter(t, "absolute_form"); v < 4 {
			t.Errorf("absolute_form %v, want >= 4", v)
		}
		resp, err := http.Get("http://" + env.sc.admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		prom, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, want := range []string{
			`sidecar_requests_rejected_total{reason="framing"} 2`,
			`sidecar_requests_rejected_total{reason="obs_fold"} 1`,
			"sidecar_agent_limits_exceeded_total 3",
		} {
			if !strings.Contains(string(prom), want) {
				t.Errorf("/metrics lacks %q", want)
			}
		}
		rej, _ := env.sc.status(t)["requests"].(map[string]any)["rejected"].(map[string]any)
		for _, k := range []string{"target", "host", "framing", "obs_fold", "parse", "uri_too_long", "headers_too_large", "timeout"} {
			if v, _ := rej[k].(float64); v == 0 {
				t.Errorf("rejected[%s] = 0: %v", k, rej)
			}
		}
	})
}

// edgeEnv is a sidecar with the suite's agent and upstream.
type edgeEnv struct {
	sc    *sidecar
	up    *rawUpstream
	agent *policyAgent
	dir   string
}

// edgeConfig is the table's configuration: one agent on every route,
// fail-closed; admin.example has a route of its own. Extra YAML is
// appended to the listener.
func edgeConfig(dir, upstream, listenerExtra string) string {
	return fmt.Sprintf(`listeners:
  - name: edge
    address: 127.0.0.1:0
    read_timeout: 1s
%s
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
  - name: default
    upstream: app
    agents: [policy]
`, listenerExtra, upstream, filepath.Join(dir, "policy.sock"))
}

func startEdge(t *testing.T) *edgeEnv {
	t.Helper()
	dir := testutil.SocketDir(t)
	env := &edgeEnv{up: startUpstream(t), agent: newPolicyAgent(), dir: dir}
	testagent.Serve(t, filepath.Join(dir, "policy.sock"), env.agent)
	env.sc = startSidecar(t, dir, edgeConfig(dir, env.up.addr, ""), "")
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

// runCase sends tc.req on a fresh connection and checks the responses and
// what happens to the connection afterwards.
func runCase(t *testing.T, addr string, tc edgeCase) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(longWait))
	// Written in the background: a refused request may be answered (and
	// the connection closed) before all of a large one is sent.
	go func() { _, _ = io.WriteString(c, tc.req) }()
	br := bufio.NewReader(c)
	method := tc.method
	if method == "" {
		method = "GET"
	}
	for i, want := range tc.want {
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			t.Fatalf("response %d: %v", i+1, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("response %d body: %v", i+1, err)
		}
		if resp.StatusCode != want {
			t.Fatalf("response %d: status %d (%q), want %d", i+1, resp.StatusCode, body, want)
		}
		if tc.noHeader != "" && resp.Header.Get(tc.noHeader) != "" {
			t.Errorf("response %d carries %s: %q", i+1, tc.noHeader, resp.Header.Get(tc.noHeader))
		}
		if i == 0 && tc.body != "" && string(body) != tc.body {
			t.Errorf("body %q, want %q", body, tc.body)
		}
		if i == 0 && tc.header != "" {
			name, value, _ := strings.Cut(tc.header, ": ")
			if got := resp.Header.Values(name); len(got) != 1 || got[0] != value {
				t.Errorf("header %s = %q, want exactly [%q]", name, got, value)
			}
		}
	}
	if tc.closed {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, err := br.ReadByte()
		switch {
		case err == nil:
			rest, _ := br.Peek(br.Buffered())
			t.Fatalf("connection still open: more bytes %q", append([]byte{b}, rest...))
		case errors.Is(err, os.ErrDeadlineExceeded):
			t.Fatalf("connection kept open, want closed")
		}
		return
	}
	if _, err := io.WriteString(c, probe); err != nil {
		t.Fatalf("probe: connection closed: %v", err)
	}
	resp, err := http.ReadResponse(br, &http.Request{Method: "GET"})
	if err != nil {
		t.Fatalf("probe: %v (connection closed?)", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("probe: status %d", resp.StatusCode)
	}
}

func quoteAll(s []string) string {
	if len(s) == 0 {
		return "  (nothing)"
	}
	var b strings.Builder
	for _, x := range s {
		fmt.Fprintf(&b, "  %q\n", x)
	}
	return b.String()
}
