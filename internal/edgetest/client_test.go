package edgetest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// The client's view (feature client_request): raw requests of the kind
// the OWASP CRS regression tests send, each through the real sidecar to
// a chain of three agents: "setter" (header operations on x-edge-op),
// "client" (records what it is shown; negotiated client_request) and
// "legacy" (records too; declared NoClientRequest). The client agent must
// see the client's bytes; the legacy agent exactly the request the
// upstream receives, as before the feature.

// seenReq is one RequestHeaders event as an agent was shown it.
type seenReq struct {
	method, uri, target string
	headers             [][2]string
	md                  map[string]string
}

// recorder is an agent that records every request it is shown.
type recorder struct {
	sdk.Base
	mu   sync.Mutex
	seen []seenReq
}

func (a *recorder) OnRequestHeaders(_ context.Context, m *protocol.RequestHeaders, _ *protocol.Decision) error {
	s := seenReq{method: string(m.Method), uri: string(m.URI), target: string(m.RequestTarget), md: map[string]string{}}
	for _, h := range m.Headers {
		s.headers = append(s.headers, [2]string{string(h.Name), string(h.Value)})
	}
	md := &m.Metadata
	for k, v := range map[string][]byte{
		"protocol": md.Protocol, "server_name": md.ServerName, "correlation_id": md.CorrelationID,
		"server_ip": md.ServerIP, "listener_id": md.ListenerID, "upstream_host": md.UpstreamHost,
		"forwarded_for": md.ForwardedFor, "forwarded_proto": md.ForwardedProto, "forwarded_host": md.ForwardedHost,
	} {
		if len(v) > 0 {
			s.md[k] = string(v)
		}
	}
	if md.ServerPort != 0 {
		s.md["server_port"] = strconv.Itoa(md.ServerPort)
	}
	a.mu.Lock()
	a.seen = append(a.seen, s)
	a.mu.Unlock()
	return nil
}

func (a *recorder) take() []seenReq {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.seen
	a.seen = nil
	return s
}

// setter changes the request for the agents after it when the client
// sent x-edge-op: set x-set, remove x-remove, add x-added.
type setter struct{ sdk.Base }

func (setter) OnRequestHeaders(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
	if m.Headers.Get("x-edge-op") == nil {
		return nil
	}
	op := func(k protocol.HeaderOpKind, name, value string) protocol.HeaderOp {
		return protocol.HeaderOp{Op: k, Name: []byte(name), Value: []byte(value)}
	}
	d.RequestHeaderOps = append(d.RequestHeaderOps, op(protocol.HeaderSet, "x-set", "agent"),
		op(protocol.HeaderRemove, "x-remove", ""), op(protocol.HeaderAdd, "x-added", "a"))
	return nil
}

func clientConfig(dir, upstream string) string {
	return fmt.Sprintf(`listeners:
  - name: edge
    address: 127.0.0.1:0
    read_timeout: 2s
admin:
  address: 127.0.0.1:0
upstreams:
  - name: app
    address: %[1]s
agents:
  - name: setter
    transport: uds
    address: %[2]s/setter.sock
    failure_mode: closed
  - name: client
    transport: uds
    address: %[2]s/client.sock
    failure_mode: closed
  - name: legacy
    transport: uds
    address: %[2]s/legacy.sock
    failure_mode: closed
routes:
  - name: up
    hosts: [up.example]
    upstream: app
    host_header: upstream
    agents: [setter, client, legacy]
  - name: default
    upstream: app
    agents: [setter, client, legacy]
`, upstream, dir)
}

// clientCase is one raw request and what the client agent must be shown:
// its header list exactly, request_target, uri, and metadata values ("-"
// for a field that must be absent). What the upstream receives is read
// from the upstream, and the legacy agent must have seen exactly that.
type clientCase struct {
	name    string
	req     string
	headers [][2]string
	target  string
	uri     string
	md      map[string]string
}

func hv(kv ...string) [][2]string {
	var out [][2]string
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, [2]string{kv[i], kv[i+1]})
	}
	return out
}

var clientCases = []clientCase{
	{name: "chunked POST keeps transfer-encoding",
		req:     "POST /post HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n7\r\n{\"a\":1}\r\n0\r\n\r\n",
		headers: hv("host", "127.0.0.1", "content-type", "application/json", "transfer-encoding", "chunked"),
		target:  "/post", uri: "/post", md: map[string]string{"protocol": "HTTP/1.1", "server_name": "127.0.0.1"}},
	{name: "POST with Content-Length 0 and an IP Host",
		req:     "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: OWASP CRS test agent\r\nAccept: text/xml,application/xml,application/xhtml+xml,text/html;q=0.9,text/plain;q=0.8,image/png,*/*;q=0.5\r\nContent-Length: 0\r\n\r\n",
		headers: hv("host", "127.0.0.1", "user-agent", "OWASP CRS test agent", "accept", "text/xml,application/xml,application/xhtml+xml,text/html;q=0.9,text/plain;q=0.8,image/png,*/*;q=0.5", "content-length", "0"),
		target:  "/", uri: "/"},
	{name: "GET with Transfer-Encoding chunked",
		req:     "GET /te HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		headers: hv("host", "localhost", "transfer-encoding", "chunked"), target: "/te", uri: "/te"},
	{name: "Connection keep-alive,keep-alive",
		req:     "GET /conn HTTP/1.1\r\nHost: localhost\r\nConnection: keep-alive,keep-alive\r\n\r\n",
		headers: hv("host", "localhost", "connection", "keep-alive,keep-alive"), target: "/conn", uri: "/conn"},
	{name: "hop-by-hop and Connection-named headers",
		req: "GET /named HTTP/1.1\r\nHost: localhost\r\nConnection: keep-alive, X-Hop, TE\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nProxy-Authorization: Basic eDp5\r\nExpect: 100-continue\r\n\r\n",
		headers: hv("host", "localhost", "connection", "keep-alive, X-Hop, TE", "x-hop", "1", "keep-alive", "timeout=5",
			"te", "trailers", "proxy-authorization", "Basic eDp5", "expect", "100-continue"),
		target: "/named", uri: "/named"},
	{name: "absolute-form target",
		req:     "GET http://localhost HTTP/1.1\r\nHost: localhost\r\n\r\n",
		headers: hv("host", "localhost"), target: "http://localhost", uri: "/", md: map[string]string{"server_name": "localhost"}},
	{name: "absolute-form authority replaces Host at its place, canonical",
		req:     "GET http://Example.COM./x?y=1 HTTP/1.1\r\nUser-Agent: u\r\nHost: other.example\r\nAccept: */*\r\n\r\n",
		headers: hv("user-agent", "u", "host", "example.com", "accept", "*/*"), target: "http://Example.COM./x?y=1", uri: "/x?y=1",
		md: map[string]string{"server_name": "example.com", "forwarded_host": "example.com"}},
	// (fasthttp refuses an HTTP/1.1 request without Host, so HTTP/1.0.)
	{name: "absolute-form without Host: host first",
		req:     "GET http://Example.COM:8080/z HTTP/1.0\r\nAccept: */*\r\n\r\n",
		headers: hv("host", "example.com:8080", "accept", "*/*"), target: "http://Example.COM:8080/z", uri: "/z",
		md: map[string]string{"protocol": "HTTP/1.0", "server_name": "example.com"}},
	{name: "HTTP/1.0 without Host",
		req:     "GET /ten HTTP/1.0\r\nAccept: */*\r\n\r\n",
		headers: hv("accept", "*/*"), target: "/ten", uri: "/ten",
		md: map[string]string{"protocol": "HTTP/1.0", "server_name": "-", "forwarded_host": "-"}},
	{name: "HTTP/1.0 with Host",
		req:     "GET /ten-host HTTP/1.0\r\nHost: Localhost\r\n\r\n",
		headers: hv("host", "localhost"), target: "/ten-host", uri: "/ten-host", md: map[string]string{"protocol": "HTTP/1.0"}},
	{name: "the client's forwarding claims beside what the upstream gets",
		req:     "GET /xff HTTP/1.1\r\nHost: localhost\r\nX-Forwarded-For: 198.51.100.7\r\nX-Forwarded-Proto: https\r\nForwarded: for=198.51.100.7\r\n\r\n",
		headers: hv("host", "localhost", "x-forwarded-for", "198.51.100.7", "x-forwarded-proto", "https", "forwarded", "for=198.51.100.7"),
		target:  "/xff", uri: "/xff", md: map[string]string{"forwarded_for": "127.0.0.1", "forwarded_proto": "http", "forwarded_host": "localhost"}},
	{name: "a client's X-Sidecar-* is not shown",
		req:     "GET /marker HTTP/1.1\r\nHost: localhost\r\nX-Sidecar-Inspection: skipped\r\nx-sidecar-fail-open: waf\r\nAccept: */*\r\n\r\n",
		headers: hv("host", "localhost", "accept", "*/*"), target: "/marker", uri: "/marker"},
	{name: "host_header upstream: the client's host, the upstream's in metadata",
		req:     "GET /u HTTP/1.1\r\nHost: UP.example\r\n\r\n",
		headers: hv("host", "up.example"), target: "/u", uri: "/u", md: map[string]string{"server_name": "up.example"}},
	{name: "earlier agents' operations apply to the client's view",
		req:     "GET /chain HTTP/1.1\r\nHost: localhost\r\nX-Remove: gone\r\nX-Set: client\r\nX-Edge-Op: 1\r\n\r\n",
		headers: hv("host", "localhost", "x-set", "agent", "x-edge-op", "1", "x-added", "a"), target: "/chain", uri: "/chain"},
}

// TestClientRequestView runs clientCases against one sidecar.
func TestClientRequestView(t *testing.T) {
	dir := testutil.SocketDir(t)
	up := startUpstream(t)
	caps := sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true}}
	client, legacy := &recorder{Base: caps}, &recorder{Base: caps}
	testagent.Serve(t, filepath.Join(dir, "setter.sock"), setter{caps})
	testagent.Serve(t, filepath.Join(dir, "client.sock"), client)
	testagent.ServeWith(t, filepath.Join(dir, "legacy.sock"), legacy, &sdk.Options{NoClientRequest: true})
	sc := startSidecar(t, dir, clientConfig(dir, up.addr), "")
	testutil.WaitFor(t, "agents connected", func() bool {
		resp, err := http.Get("http://" + sc.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	_, port, _ := net.SplitHostPort(sc.addr)
	for _, tc := range clientCases {
		t.Run(tc.name, func(t *testing.T) {
			up.take()
			client.take()
			legacy.take()
			clientRoundTrip(t, sc.addr, tc.req)
			ups, cs, ls := up.take(), client.take(), legacy.take()
			if len(ups) != 1 || len(cs) != 1 || len(ls) != 1 {
				t.Fatalf("upstream got %d requests, client agent saw %d, legacy agent %d; want 1 each", len(ups), len(cs), len(ls))
			}
			got, old, raw := cs[0], ls[0], ups[0]
			// The client agent: the client's bytes.
			if !reflect.DeepEqual(got.headers, tc.headers) {
				t.Errorf("client view headers\n got %q\nwant %q", got.headers, tc.headers)
			}
			if got.target != tc.target || got.uri != tc.uri {
				t.Errorf("client view request_target %q uri %q, want %q %q", got.target, got.uri, tc.target, tc.uri)
			}
			want := map[string]string{
				"server_ip": "127.0.0.1", "server_port": port, "listener_id": "edge", "protocol": "HTTP/1.1",
				// What the upstream received instead.
				"upstream_host": headerValue(raw, "host"), "forwarded_for": headerValue(raw, "x-forwarded-for"),
				"forwarded_proto": headerValue(raw, "x-forwarded-proto"), "forwarded_host": headerValue(raw, "x-forwarded-host"),
				"correlation_id": headerValue(raw, "x-request-id"),
			}
			for k, v := range tc.md {
				want[k] = v
			}
			for k, v := range want {
				if v == "-" {
					if g, ok := got.md[k]; ok {
						t.Errorf("client view metadata %s = %q, want none", k, g)
					}
				} else if got.md[k] != v {
					t.Errorf("client view metadata %s = %q, want %q", k, got.md[k], v)
				}
			}
			// The legacy agent: today's view, the upstream's header list.
			if old.target != "" {
				t.Errorf("legacy agent was sent request_target %q", old.target)
			}
			for _, k := range []string{"upstream_host", "forwarded_for", "forwarded_proto", "forwarded_host"} {
				if v, ok := old.md[k]; ok {
					t.Errorf("legacy agent was sent metadata %s = %q", k, v)
				}
			}
			for _, k := range []string{"server_ip", "server_port", "listener_id", "protocol", "correlation_id"} {
				if old.md[k] != got.md[k] {
					t.Errorf("legacy metadata %s = %q, client view %q: both views carry it alike", k, old.md[k], got.md[k])
				}
			}
			target, upHdrs := upstreamHead(raw)
			if old.uri != target || got.uri != target {
				t.Errorf("upstream target %q; legacy agent saw uri %q, client agent %q", target, old.uri, got.uri)
			}
			if oh := withoutFraming(old.headers); !reflect.DeepEqual(oh, upHdrs) {
				t.Errorf("legacy view is not the upstream's header list\n got %q\nwant %q", oh, upHdrs)
			}
		})
	}
}

// clientRoundTrip sends req on a fresh connection and reads one 200 response.
func clientRoundTrip(t *testing.T, addr, req string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(longWait))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: "GET"})
	for err == nil && resp.StatusCode == 100 {
		// The listener answers Expect: 100-continue; the final answer follows.
		resp, err = http.ReadResponse(br, &http.Request{Method: "GET"})
	}
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d (%q), want 200", resp.StatusCode, body)
	}
}

// upstreamHead splits a request the upstream received into its target
// and header list (names lower-cased), without the framing headers the
// sidecar's body writer adds.
func upstreamHead(raw string) (target string, hdrs [][2]string) {
	head, _, _ := strings.Cut(raw, "\r\n\r\n")
	lines := strings.Split(head, "\r\n")
	parts := strings.SplitN(lines[0], " ", 3)
	if len(parts) == 3 {
		target = parts[1]
	}
	for _, l := range lines[1:] {
		k, v, _ := strings.Cut(l, ":")
		hdrs = append(hdrs, [2]string{strings.ToLower(k), strings.TrimSpace(v)})
	}
	return target, withoutFraming(hdrs)
}

func withoutFraming(h [][2]string) [][2]string {
	var out [][2]string
	for _, kv := range h {
		if kv[0] != "content-length" && kv[0] != "transfer-encoding" {
			out = append(out, kv)
		}
	}
	return out
}
