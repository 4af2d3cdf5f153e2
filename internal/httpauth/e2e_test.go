package httpauth_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil/dptest"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/httpauth"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/transports"
	"github.com/zentinelproxy/sidecar/internal/yield"
)

// authService is a forward-auth service: it answers by the original URI
// (X-Forwarded-Uri or X-Original-URI) and records what it was sent.
type authService struct {
	mu   sync.Mutex
	seen []*http.Request
}

func (s *authService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	uri := r.Header.Get("X-Forwarded-Uri")
	if uri == "" {
		uri = r.Header.Get("X-Original-URI")
	}
	if uri == "" {
		w.WriteHeader(401) // a probe: any answer is one
		return
	}
	s.mu.Lock()
	s.seen = append(s.seen, r.Clone(context.Background()))
	s.mu.Unlock()
	switch {
	case strings.HasPrefix(uri, "/ok"):
		w.Header().Set("X-Auth-User", "alice")
		w.Header().Set("X-Auth-Groups", "admins")
		w.Header().Set("X-Not-Copied", "1")
		w.WriteHeader(200)
	case uri == "/anonymous":
		w.WriteHeader(204)
	case uri == "/login":
		w.Header().Set("WWW-Authenticate", `Basic realm="shop"`)
		w.WriteHeader(401)
		_, _ = io.WriteString(w, "login required")
	case uri == "/redirect":
		w.Header().Set("Location", "https://login.example/start?rd=%2Fredirect")
		w.Header().Add("Set-Cookie", "csrf=abc; Path=/; HttpOnly")
		w.Header().Add("Set-Cookie", "state=xyz; Path=/")
		w.WriteHeader(302)
	case uri == "/forbidden":
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(403)
		_, _ = io.WriteString(w, "<h1>no access</h1>")
	case uri == "/big":
		w.WriteHeader(403)
		_, _ = io.WriteString(w, strings.Repeat("x", 100<<10))
	case uri == "/slow":
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	default:
		w.WriteHeader(500)
	}
}

func (s *authService) last() *http.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.seen) == 0 {
		return nil
	}
	return s.seen[len(s.seen)-1]
}

func (s *authService) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}

const baseConfig = `
listeners:
  - name: test
    address: 127.0.0.1:0
upstreams:
  - name: app
    address: UPSTREAM
agents:
  - name: auth
    transport: http_auth
    address: AUTHURL
AGENT
routes:
  - name: main
    upstream: app
    agents: [auth]
`

type seen struct {
	mu     sync.Mutex
	header http.Header
	n      int
}

func (s *seen) get() (http.Header, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.header, s.n
}

// proxy starts an upstream and the dataplane with the agent built by the
// transports' factory from the YAML configuration.
func proxy(t *testing.T, authURL, agent string, noWait bool) (string, *seen, agentmux.Agent) {
	t.Helper()
	up := &seen{}
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		up.mu.Lock()
		up.header = r.Header.Clone()
		up.n++
		up.mu.Unlock()
		_, _ = io.WriteString(w, "hello from app")
	}))
	t.Cleanup(us.Close)
	y := strings.NewReplacer("UPSTREAM", strings.TrimPrefix(us.URL, "http://"), "AUTHURL", authURL, "AGENT", agent).Replace(baseConfig)
	cfg, err := config.Parse([]byte(y))
	if err != nil {
		t.Fatalf("%v\n%s", err, y)
	}
	if err := transports.Check(cfg); err != nil {
		t.Fatal(err)
	}
	a, err := transports.Dialing()[config.TransportHTTPAuth](cfg.Agent("auth"), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	if !noWait {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := a.(interface{ WaitReady(context.Context) error }).WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
	}
	url, _ := dptest.Serve(t, cfg, map[string]agentmux.Agent{"auth": a})
	return url, up, a
}

func get(t *testing.T, url string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if strings.EqualFold(hdr[i], "host") {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Add(hdr[i], hdr[i+1])
	}
	cl := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func startService(t *testing.T) (*authService, string) {
	s := &authService{}
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	return s, hs.URL + "/oauth2/auth"
}

// TestAllowed checks a 2xx answer: the request goes on with the
// configured headers of the answer, the client's own copies of them
// removed (listed by name or matching the regex), and the service saw
// the Traefik-style headers and the client's headers.
func TestAllowed(t *testing.T) {
	s, u := startService(t)
	url, up, _ := proxy(t, u, `
    options:
      auth_response_headers: "X-Auth-User, X-Missing"
      auth_response_headers_regex: "^X-Auth-G"`, false)
	resp, body := get(t, url+"/ok?page=2", "Host", "shop.example", "Cookie", "session=1",
		"X-Auth-User", "mallory", "X-Auth-Groups", "root", "X-Missing", "spoofed")
	if resp.StatusCode != 200 || body != "hello from app" {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	h, _ := up.get()
	for _, c := range []struct{ name, want string }{
		{"X-Auth-User", "alice"}, {"X-Auth-Groups", "admins"}, {"X-Missing", ""}, {"X-Not-Copied", ""}, {"Cookie", "session=1"},
	} {
		if got := strings.Join(h.Values(c.name), ","); got != c.want {
			t.Errorf("upstream %s: got %q, want %q", c.name, got, c.want)
		}
	}
	r := s.last()
	for _, c := range []struct{ name, want string }{
		{"X-Forwarded-Method", "GET"}, {"X-Forwarded-Proto", "http"}, {"X-Forwarded-Host", "shop.example"},
		{"X-Forwarded-Uri", "/ok?page=2"}, {"X-Forwarded-For", "127.0.0.1"}, {"Cookie", "session=1"},
	} {
		if got := r.Header.Get(c.name); got != c.want {
			t.Errorf("service %s: got %q, want %q", c.name, got, c.want)
		}
	}
	if r.Method != http.MethodGet || r.URL.Path != "/oauth2/auth" {
		t.Errorf("service got %s %s", r.Method, r.URL)
	}
}

// TestNginxStyle checks X-Original-Method and X-Original-URI, and that
// auth_request_headers limits the client headers sent.
func TestNginxStyle(t *testing.T) {
	s, u := startService(t)
	url, _, _ := proxy(t, u, `
    options:
      style: nginx
      auth_request_headers: cookie`, false)
	req, _ := http.NewRequest(http.MethodDelete, url+"/anonymous", nil)
	req.Header.Set("Cookie", "session=1")
	req.Header.Set("Authorization", "Bearer x")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	r := s.last()
	if r.Method != http.MethodDelete {
		t.Errorf("subrequest method %s, want the request's (DELETE), as nginx", r.Method)
	}
	for _, c := range []struct{ name, want string }{
		{"X-Original-Method", "DELETE"}, {"X-Original-URI", "/anonymous"}, {"Cookie", "session=1"},
		{"Authorization", ""}, {"X-Forwarded-Uri", ""},
	} {
		if got := r.Header.Get(c.name); got != c.want {
			t.Errorf("service %s: got %q, want %q", c.name, got, c.want)
		}
	}
}

// TestDenied checks that any other answer is the client's: 401 with
// WWW-Authenticate, a login redirect with its cookies, a 403 page, and a
// body over max_body cut there.
func TestDenied(t *testing.T) {
	_, u := startService(t)
	url, up, a := proxy(t, u, `
    options:
      max_body: "1024"`, false)
	resp, body := get(t, url+"/login")
	if resp.StatusCode != 401 || body != "login required" || resp.Header.Get("WWW-Authenticate") != `Basic realm="shop"` {
		t.Errorf("401: status %d body %q header %v", resp.StatusCode, body, resp.Header)
	}
	resp, _ = get(t, url+"/redirect")
	if resp.StatusCode != 302 || resp.Header.Get("Location") != "https://login.example/start?rd=%2Fredirect" {
		t.Errorf("302: status %d header %v", resp.StatusCode, resp.Header)
	}
	if got := resp.Header.Values("Set-Cookie"); len(got) != 2 || got[0] != "csrf=abc; Path=/; HttpOnly" || got[1] != "state=xyz; Path=/" {
		t.Errorf("302: Set-Cookie %q", got)
	}
	resp, body = get(t, url+"/forbidden")
	if resp.StatusCode != 403 || body != "<h1>no access</h1>" || resp.Header.Get("Content-Type") != "text/html" {
		t.Errorf("403: status %d body %q header %v", resp.StatusCode, body, resp.Header)
	}
	resp, body = get(t, url+"/big")
	if resp.StatusCode != 403 || len(body) != 1024 {
		t.Errorf("big: status %d, %d bytes of body", resp.StatusCode, len(body))
	}
	if _, n := up.get(); n != 0 {
		t.Errorf("upstream got %d requests", n)
	}
	ev := a.Snapshot().Events
	if ev["denied"] != 4 || ev["bodies_truncated"] != 1 {
		t.Errorf("events %v", ev)
	}
}

// TestTimeout checks a service slower than timeouts.message: 504, the
// subrequest abandoned.
func TestTimeout(t *testing.T) {
	_, u := startService(t)
	url, up, a := proxy(t, u, `
    timeouts:
      message: 200ms`, false)
	resp, _ := get(t, url+"/slow")
	if resp.StatusCode != 504 {
		t.Errorf("status %d, want 504", resp.StatusCode)
	}
	if _, n := up.get(); n != 0 {
		t.Errorf("upstream got %d requests", n)
	}
	if a.Snapshot().Timeouts == 0 {
		t.Error("timeout not counted")
	}
}

// TestDown checks a service that is not there: not ready, with why;
// requests fail closed with 500 (nginx's answer), or pass marked with
// failure_mode: open.
func TestDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := "http://" + ln.Addr().String() + "/auth"
	ln.Close()
	url, up, a := proxy(t, u, "", true)
	resp, _ := get(t, url+"/")
	if resp.StatusCode != 500 {
		t.Errorf("status %d, want 500", resp.StatusCode)
	}
	if _, n := up.get(); n != 0 {
		t.Errorf("upstream got %d requests", n)
	}
	testutil.WaitFor(t, "the agent's last error", func() bool {
		st := a.Snapshot()
		return !st.Ready && st.LastError != "" && st.Events["probes_failed"] > 0
	})
	url, up, _ = proxy(t, u, "\n    failure_mode: open", true)
	resp, _ = get(t, url+"/")
	if h, n := up.get(); resp.StatusCode != 200 || n != 1 || h.Get("X-Sidecar-Fail-Open") != "auth" {
		t.Errorf("open: status %d, upstream got %d", resp.StatusCode, n)
	}
}

// TestServiceFailsMidway checks a service that goes away after it was
// ready: the connection refused is a failure of the agent (closed: 500).
func TestServiceFailsMidway(t *testing.T) {
	s := &authService{}
	hs := httptest.NewServer(s)
	url, up, _ := proxy(t, hs.URL+"/auth", "", false)
	hs.Close()
	resp, _ := get(t, url+"/ok")
	if resp.StatusCode != 500 {
		t.Errorf("status %d, want 500", resp.StatusCode)
	}
	if _, n := up.get(); n != 0 {
		t.Errorf("upstream got %d requests", n)
	}
}

// TestTLS checks an https:// service with its CA and a client
// certificate (mTLS), and that a sidecar that does not trust its CA never
// gets an answer from it (not ready; requests fail closed).
func TestTLS(t *testing.T) {
	ca := testutil.NewPKI(t, "auth")
	server := ca.Server(t, "auth", "127.0.0.1")
	client := ca.Client(t, "client", "sidecar")
	other := testutil.NewPKI(t, "other")
	s := &authService{}
	hs := httptest.NewUnstartedServer(s)
	hs.TLS = &tls.Config{Certificates: []tls.Certificate{server.TLS}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool}
	hs.StartTLS()
	t.Cleanup(hs.Close)
	url, up, _ := proxy(t, hs.URL+"/auth", `
    options:
      tls_ca_file: `+ca.CAFile+`
      tls_cert_file: `+client.CertFile+`
      tls_key_file: `+client.KeyFile+`
      auth_response_headers: X-Auth-User`, false)
	if resp, _ := get(t, url+"/ok"); resp.StatusCode != 200 {
		t.Errorf("status %d", resp.StatusCode)
	}
	if h, _ := up.get(); h.Get("X-Auth-User") != "alice" {
		t.Errorf("upstream X-Auth-User %q", h.Get("X-Auth-User"))
	}
	url, _, a := proxy(t, hs.URL+"/auth", `
    options:
      tls_ca_file: `+other.CAFile+`
      tls_cert_file: `+client.CertFile+`
      tls_key_file: `+client.KeyFile, true)
	if resp, _ := get(t, url+"/ok"); resp.StatusCode != 500 {
		t.Errorf("unknown CA: status %d, want 500", resp.StatusCode)
	}
	testutil.WaitFor(t, "the probe to fail", func() bool {
		st := a.Snapshot()
		return !st.Ready && strings.Contains(st.LastError, "certificate")
	})
	if n := s.count(); n != 1 {
		t.Errorf("service got %d subrequests, want 1", n)
	}
}

// TestClientGone checks that a client going away ends its subrequest
// soon, long before the message timeout: the service sees its
// connection closed.
func TestClientGone(t *testing.T) {
	started, ended := make(chan struct{}, 1), make(chan struct{}, 1)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Forwarded-Uri") == "" {
			w.WriteHeader(401) // a probe
			return
		}
		started <- struct{}{}
		select {
		case <-r.Context().Done():
			ended <- struct{}{}
		case <-time.After(30 * time.Second):
		}
	}))
	t.Cleanup(hs.Close)
	url, up, _ := proxy(t, hs.URL+"/auth", `
    timeouts:
      message: 30s
      request: 30s`, false)
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("no subrequest")
	}
	conn.Close()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the subrequest went on after the client left")
	}
	if _, n := up.get(); n != 0 {
		t.Errorf("upstream got %d requests", n)
	}
}

// TestOwnHeadersNotSpoofed checks that a client's own X-Forwarded-*
// headers never reach the service in place of the proxy's.
func TestOwnHeadersNotSpoofed(t *testing.T) {
	s, u := startService(t)
	url, up, _ := proxy(t, u, "", false)
	resp, _ := get(t, url+"/forbidden", "X-Forwarded-Uri", "/ok", "X-Forwarded-Method", "PUT",
		"X-Forwarded-Host", "evil.example", "X-Forwarded-Proto", "https", "X-Forwarded-For", "10.0.0.1")
	if resp.StatusCode != 403 {
		t.Errorf("status %d, want the service's 403", resp.StatusCode)
	}
	if _, n := up.get(); n != 0 {
		t.Errorf("upstream got %d requests", n)
	}
	r := s.last()
	for _, c := range []struct{ name, want string }{
		{"X-Forwarded-Uri", "/forbidden"}, {"X-Forwarded-Method", "GET"}, {"X-Forwarded-Proto", "http"},
		{"X-Forwarded-For", "127.0.0.1"},
	} {
		if got := strings.Join(r.Header.Values(c.name), ","); got != c.want {
			t.Errorf("service %s: got %q, want %q", c.name, got, c.want)
		}
	}
}

// rawService serves each connection with answer (for every request on
// it, until the client closes or once, by once) from a raw socket.
func rawService(t *testing.T, answer func(n int) string, once bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var mu sync.Mutex
	n := 0
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				got := ""
				for {
					_ = c.SetDeadline(time.Now().Add(10 * time.Second))
					k, err := c.Read(buf)
					if err != nil {
						return
					}
					got += string(buf[:k])
					for strings.Contains(got, "\r\n\r\n") {
						got = got[strings.Index(got, "\r\n\r\n")+4:]
						mu.Lock()
						n++
						i := n
						mu.Unlock()
						if _, err := io.WriteString(c, answer(i)); err != nil || once {
							return
						}
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String() + "/auth"
}

// TestServiceClosesIdle checks a service that closes each connection
// after its answer without saying so: the subrequest on the connection
// it closed goes again on a new one.
func TestServiceClosesIdle(t *testing.T) {
	u := rawService(t, func(int) string {
		return "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Auth-User: alice\r\n\r\n"
	}, true)
	url, up, _ := proxy(t, u, `
    options:
      auth_response_headers: X-Auth-User`, false)
	for i := range 3 {
		resp, _ := get(t, url+"/ok")
		if h, _ := up.get(); resp.StatusCode != 200 || h.Get("X-Auth-User") != "alice" {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
		time.Sleep(20 * time.Millisecond) // the service's close arrives
	}
}

// TestBadAnswers checks answers that cannot be read: a head over the
// limit, a broken status line, a chunked body cut short. Each fails the
// request closed (500) and nothing reaches the upstream; a chunked
// denial, and one whose body ends with the connection, are read and
// passed on.
func TestBadAnswers(t *testing.T) {
	for _, c := range []struct {
		name, answer string
		status       int
		body         string
	}{
		{"huge head", "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", 70<<10) + "\r\n\r\n", 500, ""},
		{"not http", "SSH-2.0-OpenSSH\r\n\r\n", 500, ""},
		{"chunked denial", "HTTP/1.1 401 Unauthorized\r\nTransfer-Encoding: chunked\r\nWWW-Authenticate: Basic\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", 401, "hello world"},
		{"cut denial", "HTTP/1.1 401 Unauthorized\r\nContent-Length: 100\r\n\r\nshort", 500, ""},
		{"denial to the end", "HTTP/1.1 403 Forbidden\r\n\r\nnope", 403, "nope"},
	} {
		t.Run(c.name, func(t *testing.T) {
			u := rawService(t, func(n int) string {
				if n == 1 { // the probe
					return "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n"
				}
				return c.answer
			}, true)
			url, up, _ := proxy(t, u, "", false)
			resp, body := get(t, url+"/x")
			if resp.StatusCode != c.status || (c.body != "" && body != c.body) {
				t.Errorf("status %d body %q, want %d %q", resp.StatusCode, body, c.status, c.body)
			}
			if _, n := up.get(); n != 0 {
				t.Errorf("upstream got %d requests", n)
			}
		})
	}
}

// TestUnixSocket checks a service on a Unix socket (option
// unix_socket): the URL still gives the Host header and the path.
func TestUnixSocket(t *testing.T) {
	sock := t.TempDir() + "/auth.sock"
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := &authService{}
	hs := httptest.NewUnstartedServer(s)
	hs.Listener.Close()
	hs.Listener = ln
	hs.Start()
	t.Cleanup(hs.Close)
	url, up, _ := proxy(t, "http://auth.internal/oauth2/auth", `
    options:
      unix_socket: `+sock+`
      auth_response_headers: X-Auth-User`, false)
	if resp, _ := get(t, url+"/ok"); resp.StatusCode != 200 {
		t.Errorf("status %d", resp.StatusCode)
	}
	if h, _ := up.get(); h.Get("X-Auth-User") != "alice" {
		t.Errorf("upstream X-Auth-User %q", h.Get("X-Auth-User"))
	}
	if r := s.last(); r == nil || r.Host != "auth.internal" || r.URL.Path != "/oauth2/auth" {
		t.Errorf("service got %+v", r)
	}
	for _, bad := range []string{"auth.sock", "/" + strings.Repeat("x", 107)} {
		c := httpauth.DefaultConfig("auth", "http://auth.internal/")
		if err := c.ApplyOptions(map[string]string{"unix_socket": bad}); err == nil {
			t.Errorf("unix_socket %q accepted", bad)
		}
	}
}

// TestKeepAlive checks that answers without a body (204, and 200 with
// Content-Length: 0) keep their connection: the subrequests of
// sequential requests share one.
func TestKeepAlive(t *testing.T) {
	s := &authService{}
	var mu sync.Mutex
	conns := 0
	hs := httptest.NewUnstartedServer(s)
	hs.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			mu.Lock()
			conns++
			mu.Unlock()
		}
	}
	hs.Start()
	t.Cleanup(hs.Close)
	url, _, _ := proxy(t, hs.URL+"/auth", "", false)
	for i := range 6 {
		path := "/anonymous" // 204
		if i%2 == 1 {
			path = "/ok" // 200, Content-Length: 0
		}
		if resp, _ := get(t, url+path); resp.StatusCode != 200 {
			t.Fatalf("%s: status %d", path, resp.StatusCode)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if conns != 1 {
		t.Errorf("the service saw %d connections, want 1", conns)
	}
}

// TestAddresses: an agent with addresses is one service per URL. A
// first member that is down from the start is never chosen (its probe
// fails); one that goes away after it was ready costs its requests
// nothing: a refused connection fails over to the other member.
func TestAddresses(t *testing.T) {
	down := "http://" + testutil.RefusedAddr(t) + "/auth"
	s2, u2 := startService(t)
	url, up, a := proxy(t, down, "\n    addresses: ["+u2+"]", false)
	for i := range 4 {
		resp, _ := get(t, url+"/ok")
		if _, n := up.get(); resp.StatusCode != 200 || n != i+1 {
			t.Fatalf("request %d with the first member down: status %d, upstream got %d", i, resp.StatusCode, n)
		}
	}
	if n := s2.count(); n != 4 {
		t.Errorf("the second member answered %d subrequests, want 4", n)
	}
	if m, ok := a.(*agentmux.Multi); !ok || len(m.Members()) != 2 {
		t.Fatalf("agent %T, want an agentmux.Multi of 2 members", a)
	}

	// Both up, then the first goes away: every request still passes.
	s1 := &authService{}
	hs1 := httptest.NewServer(s1)
	s3, u3 := startService(t)
	url, _, a = proxy(t, hs1.URL+"/auth", "\n    addresses: ["+u3+"]", false)
	testutil.WaitFor(t, "both members ready", func() bool {
		ms := a.(*agentmux.Multi).Members()
		return ms[0].Snapshot().Ready && ms[1].Snapshot().Ready
	})
	for range 4 {
		if resp, _ := get(t, url+"/ok"); resp.StatusCode != 200 {
			t.Fatalf("status %d with both members up", resp.StatusCode)
		}
	}
	if s1.count() == 0 || s3.count() == 0 {
		t.Fatalf("members answered %d and %d: requests do not go to both in turn", s1.count(), s3.count())
	}
	hs1.Close()
	before := s3.count()
	for i := range 6 {
		if resp, body := get(t, url+"/ok"); resp.StatusCode != 200 {
			t.Fatalf("request %d after the first member went away: status %d %q", i, resp.StatusCode, body)
		}
	}
	if got := s3.count() - before; got != 6 {
		t.Errorf("the second member answered %d of the 6 requests", got)
	}
}

// TestPipelinedThroughProxy checks the option pipeline end to end: the
// transport's factory reads it from the configuration, concurrent
// requests through the proxy go pipelined (counted as pipelined), and
// each gets its own verdict: the denials' bodies name their request.
func TestPipelinedThroughProxy(t *testing.T) {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		uri := r.Header.Get("X-Forwarded-Uri")
		switch {
		case strings.HasPrefix(uri, "/deny"):
			w.WriteHeader(403)
			_, _ = io.WriteString(w, uri)
		case uri == "":
			w.WriteHeader(401) // the probe
		default:
			w.Header().Set("X-Auth-User", uri)
		}
	}))
	t.Cleanup(hs.Close)
	// The first batch's leader waits in its yield until another request
	// has joined it (at most 5s), so that the concurrent requests
	// pipeline whatever the scheduling: a fixed pause could end before a
	// loaded machine ran any of them.
	var first atomic.Bool
	first.Store(true)
	yield.SetHook(func(owner any) bool {
		size, ok := httpauth.LeaderBatch(owner)
		if !ok {
			return false
		}
		if first.Swap(false) {
			for end := time.Now().Add(5 * time.Second); size() < 2 && time.Now().Before(end); time.Sleep(time.Millisecond) {
			}
		}
		return true
	})
	t.Cleanup(func() { yield.SetHook(nil) })
	url, _, a := proxy(t, hs.URL+"/auth", `
    options:
      pipeline: "8"
      auth_response_headers: X-Auth-User`, false)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			path := fmt.Sprintf("/ok/%d", i)
			if i%3 == 0 {
				path = fmt.Sprintf("/deny/%d", i)
			}
			resp, body := get(t, url+path)
			switch {
			case strings.HasPrefix(path, "/deny") && (resp.StatusCode != 403 || body != path):
				t.Errorf("%s: %d %q, want 403 %q", path, resp.StatusCode, body, path)
			case strings.HasPrefix(path, "/ok") && resp.StatusCode != 200:
				t.Errorf("%s: %d %q", path, resp.StatusCode, body)
			}
		})
	}
	wg.Wait()
	if n := a.(agentmux.Reporter).Snapshot().Events["pipelined"]; n == 0 {
		t.Error("no subrequest was pipelined")
	}
}
