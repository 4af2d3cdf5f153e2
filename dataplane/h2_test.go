package dataplane_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/http2"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// h2cClient speaks cleartext HTTP/2 with prior knowledge.
func h2cClient() *http.Client {
	return &http.Client{Timeout: hangGuard, Transport: &http2.Transport{
		AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}}
}

// seenH2 is what a guard agent saw of a request.
type seenH2 struct {
	proto, uri, host, serverName, tls string
}

// h2Guard is an agent that records every request and blocks those of
// paths under /admin with 403 "no"; its body hook (buffered) records the
// request body.
type h2Guard struct {
	mu     sync.Mutex
	seen   []seenH2
	bodies []string
}

func (g *h2Guard) handler() *agentFuncs {
	caps := headersOnly()
	caps.HandlesRequestBody = true
	return &agentFuncs{Base: sdk.Base{Caps: caps},
		reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
			s := seenH2{proto: string(m.Metadata.Protocol), uri: string(m.URI), serverName: string(m.Metadata.ServerName), tls: string(m.Metadata.TLSVersion)}
			for _, h := range m.Headers {
				if string(h.Name) == "host" {
					s.host = string(h.Value)
				}
			}
			g.mu.Lock()
			g.seen = append(g.seen, s)
			g.mu.Unlock()
			if strings.HasPrefix(string(m.URI), "/admin") {
				d.Kind, d.Status, d.Body = protocol.DecisionBlock, 403, []byte("no")
			}
			return nil
		},
		reqBody: func(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
			g.mu.Lock()
			g.bodies = append(g.bodies, string(m.Data))
			g.mu.Unlock()
			r.Pass()
			return nil
		},
	}
}

func (g *h2Guard) last(t *testing.T) seenH2 {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.seen) == 0 {
		t.Fatal("the agent saw no request")
	}
	return g.seen[len(g.seen)-1]
}

// h2Proxy starts a proxy whose listener is listenerYAML (one flow-style
// mapping), an upstream at upAddr and a guarded route for admin.example
// besides the catch-all.
func h2Proxy(t *testing.T, listenerYAML, upAddr string, g *h2Guard) *proxy {
	t.Helper()
	path := serveAgent(t, g.handler())
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
listeners: [%s]
upstreams: [{name: app, address: %q}]
agents:
  - {name: guard, transport: uds, address: %q, request_body: {mode: buffered}}
routes:
  - {name: admin, hosts: [Admin.Example.], upstream: app, agents: [guard]}
  - {name: default, upstream: app, agents: [guard]}
`, listenerYAML, upAddr, path)))
	if err != nil {
		t.Fatal(err)
	}
	return startProxy(t, cfg, map[string]agentmux.Agent{"guard": udsAgent(t, "guard", path, nil)}, nil)
}

func doH2(t *testing.T, c *http.Client, method, url, host, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body == "" {
		req.Body = nil
	}
	if host != "" {
		req.Host = host
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, url, err)
	}
	return resp, string(b)
}

// TestHTTP2ClearTextPriorKnowledge: a cleartext listener with h2c serves
// HTTP/2 with prior knowledge and HTTP/1.1 on the same port; the agents
// see HTTP/2 requests as HTTP/1 ones (method, path, the canonical host
// from :authority, the route it picks) with the client's protocol in the
// metadata; bodies go both ways, a large response streamed.
func TestHTTP2ClearTextPriorKnowledge(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			w.Header().Set("Content-Type", "application/octet-stream")
			_, _ = w.Write(big)
			return
		}
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %s:%s", r.Method, r.RequestURI, r.Host, body)
	})
	g := &h2Guard{}
	p := h2Proxy(t, `{address: "127.0.0.1:0", disconnect_check: 20ms, protocols: [http1, h2c]}`, up.addr(), g)
	c := h2cClient()
	base := "http://" + p.addr

	resp, body := doH2(t, c, "GET", base+"/admin/x", "Admin.Example.", "")
	if resp.ProtoMajor != 2 || resp.StatusCode != 403 || body != "no" {
		t.Errorf("blocked: %s %d %q, want HTTP/2 403 \"no\"", resp.Proto, resp.StatusCode, body)
	}
	if ct := resp.Header.Values("Content-Type"); len(ct) != 1 || ct[0] != "text/plain; charset=utf-8" {
		t.Errorf("blocked: Content-Type %q, want the block's one", ct)
	}
	if s := g.last(t); s.proto != "HTTP/2.0" || s.host != "admin.example" || s.serverName != "admin.example" || s.uri != "/admin/x" {
		t.Errorf("the agent saw %+v", s)
	}
	if up.count() != 0 {
		t.Errorf("a blocked request reached the upstream")
	}
	// Dot segments and escapes are resolved as for HTTP/1: the same
	// route, and the agent sees the same request.
	resp, body = doH2(t, c, "GET", base+"/x/../%61dmin/y", "admin.example", "")
	seen2 := g.last(t)
	resp1, body1 := p.do(t, "GET", "/x/../%61dmin/y", nil, "Host", "admin.example")
	seen1 := g.last(t)
	seen2.proto, seen1.proto = "", ""
	if resp.StatusCode != resp1.StatusCode || body != body1 || seen1 != seen2 || !strings.Contains(p.logs.String(), `"route":"admin","method":"GET","path":"/admin/y"`) {
		t.Errorf("dot segments: h2 %d %q %+v, HTTP/1.1 %d %q %+v", resp.StatusCode, body, seen2, resp1.StatusCode, body1, seen1)
	}
	resp, body = doH2(t, c, "POST", base+"/form?q=1", "public.example", "a=1&b=2")
	if resp.StatusCode != 200 || body != "POST /form?q=1 public.example:a=1&b=2" {
		t.Errorf("POST: %d %q", resp.StatusCode, body)
	}
	g.mu.Lock()
	bodies := append([]string(nil), g.bodies...)
	g.mu.Unlock()
	if len(bodies) == 0 || bodies[len(bodies)-1] != "a=1&b=2" {
		t.Errorf("the agent saw the bodies %q", bodies)
	}
	if got := up.last(t); got.Header.Get("X-Forwarded-Proto") != "http" || got.Header.Get("X-Forwarded-Host") != "public.example" {
		t.Errorf("upstream got X-Forwarded-Proto %q X-Forwarded-Host %q", got.Header.Get("X-Forwarded-Proto"), got.Header.Get("X-Forwarded-Host"))
	}
	// An upstream response without a type gets none (no sniffing).
	up2 := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header()["Content-Type"] = nil
		_, _ = io.WriteString(w, "<html>untyped</html>")
	})
	p2 := h2Proxy(t, `{address: "127.0.0.1:0", protocols: [h2c]}`, up2.addr(), &h2Guard{})
	if resp, body := doH2(t, c, "GET", "http://"+p2.addr+"/untyped", "", ""); body != "<html>untyped</html>" || len(resp.Header.Values("Content-Type")) != 0 {
		t.Errorf("untyped: %q Content-Type %q", body, resp.Header.Values("Content-Type"))
	}
	resp, body = doH2(t, c, "GET", base+"/big", "", "")
	if resp.StatusCode != 200 || body != string(big) || resp.Header.Get("Content-Type") != "application/octet-stream" {
		t.Errorf("streamed body: %d, %d bytes (want %d), type %q", resp.StatusCode, len(body), len(big), resp.Header.Get("Content-Type"))
	}
	// HTTP/1.1 on the same listener.
	resp, body = p.do(t, "GET", "/admin/z", nil, "Host", "admin.example")
	if resp.ProtoMajor != 1 || resp.StatusCode != 403 || body != "no" {
		t.Errorf("HTTP/1.1 on the h2c listener: %s %d %q", resp.Proto, resp.StatusCode, body)
	}
	if s := g.last(t); s.proto != "HTTP/1.1" {
		t.Errorf("HTTP/1.1 request seen as %q", s.proto)
	}
	st := p.srv.Stats()
	if st.HTTP2.Streams != 4 || st.HTTP2.Connections != 1 || st.RequestsByProtocol["h2c"] != 4 || st.RequestsByProtocol["http1"] != 2 {
		t.Errorf("stats: %+v by protocol %v", st.HTTP2, st.RequestsByProtocol)
	}
}

// TestHTTP2RefusedWhereNotServed: a listener without h2c answers the
// preface as HTTP/1 (a 400 fasthttp cannot parse it as), and
// "Upgrade: h2c" stays refused.
func TestHTTP2RefusedWhereNotServed(t *testing.T) {
	up := newUpstream(t, nil)
	g := &h2Guard{}
	p := h2Proxy(t, `{address: "127.0.0.1:0"}`, up.addr(), g)
	req, _ := http.NewRequest("GET", "http://"+p.addr+"/x", nil)
	if _, err := h2cClient().Do(req); err == nil {
		t.Errorf("HTTP/2 with prior knowledge succeeded on an HTTP/1-only listener")
	}
	p2 := h2Proxy(t, `{address: "127.0.0.1:0", protocols: [http1, h2c]}`, up.addr(), g)
	resp, _ := p2.do(t, "GET", "/x", nil, "Connection", "Upgrade, HTTP2-Settings", "Upgrade", "h2c", "HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA")
	if resp.StatusCode == http.StatusSwitchingProtocols {
		t.Errorf("Upgrade: h2c switched protocols")
	}
	if got := up.last(t); got.Header.Get("Upgrade") != "" || got.Header.Get("HTTP2-Settings") != "" {
		t.Errorf("the upstream got the h2c upgrade: %v", got.Header)
	}
}

// TestHTTP2OverTLS: a TLS listener offers h2 and http/1.1 by ALPN by
// default; Go's client picks h2, an HTTP/1.1-only client gets HTTP/1.1;
// the agent sees the TLS facts and the protocol of each.
func TestHTTP2OverTLS(t *testing.T) {
	pki := testutil.NewPKI(t, "edge")
	a := pki.Server(t, "a", "a.example", "admin.example")
	up := newUpstream(t, nil)
	g := &h2Guard{}
	p := h2Proxy(t, fmt.Sprintf(`{address: "127.0.0.1:0", tls: {certificates: [{cert_file: %q, key_file: %q}]}}`, a.CertFile, a.KeyFile), up.addr(), g)
	h2c := &http.Client{Timeout: hangGuard, Transport: &http2.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.Pool, ServerName: "admin.example"}}}
	base := "https://" + p.addr
	resp, body := doH2(t, h2c, "GET", base+"/admin/x", "admin.example", "")
	if resp.ProtoMajor != 2 || resp.StatusCode != 403 || body != "no" {
		t.Errorf("h2: %s %d %q", resp.Proto, resp.StatusCode, body)
	}
	if s := g.last(t); s.proto != "HTTP/2.0" || s.tls != "TLS1.3" || s.host != "admin.example" {
		t.Errorf("the agent saw %+v", s)
	}
	if resp, _ := doH2(t, h2c, "GET", base+"/ok", "a.example", ""); resp.StatusCode != 200 {
		t.Errorf("h2 pass: %d", resp.StatusCode)
	}
	if got := up.last(t); got.Header.Get("X-Forwarded-Proto") != "https" {
		t.Errorf("X-Forwarded-Proto %q", got.Header.Get("X-Forwarded-Proto"))
	}
	h1 := &http.Client{Timeout: hangGuard, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.Pool, ServerName: "a.example", NextProtos: []string{"http/1.1"}}}}
	resp, _ = doH2(t, h1, "GET", base+"/ok", "a.example", "")
	if resp.ProtoMajor != 1 || resp.StatusCode != 200 {
		t.Errorf("http/1.1 over TLS: %s %d", resp.Proto, resp.StatusCode)
	}
	if st := p.srv.Stats(); st.RequestsByProtocol["h2"] != 2 || st.TLS.Handshakes < 2 {
		t.Errorf("by protocol %v, handshakes %d", st.RequestsByProtocol, st.TLS.Handshakes)
	}

	// A listener of h2 only: an HTTP/1.1-only client finds no protocol in
	// common; h2 is served.
	p2 := h2Proxy(t, fmt.Sprintf(`{address: "127.0.0.1:0", protocols: [h2], tls: {certificates: [{cert_file: %q, key_file: %q}]}}`, a.CertFile, a.KeyFile), up.addr(), g)
	req, _ := http.NewRequest("GET", "https://"+p2.addr+"/ok", nil)
	if resp, err := h1.Do(req); err == nil {
		resp.Body.Close()
		t.Errorf("HTTP/1.1 on an h2-only listener: %s %d", resp.Proto, resp.StatusCode)
	}
	if resp, _ := doH2(t, h2c, "GET", "https://"+p2.addr+"/ok", "a.example", ""); resp.ProtoMajor != 2 || resp.StatusCode != 200 {
		t.Errorf("h2 on an h2-only listener: %s %d", resp.Proto, resp.StatusCode)
	}
}
