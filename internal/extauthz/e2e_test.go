package extauthz_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	neturl "net/url"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil/dptest"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/metrics"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/transports"
)

// authServer is an envoy.service.auth.v3.Authorization server on
// go-control-plane's generated types: h answers every Check of a request
// (probes, whose attributes carry no request, are answered OK).
type authServer struct {
	authv3.UnimplementedAuthorizationServer
	h func(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error)

	mu     sync.Mutex
	checks []*authv3.CheckRequest
	probes int
}

func (s *authServer) Check(ctx context.Context, r *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	if r.GetAttributes().GetRequest() == nil {
		s.mu.Lock()
		s.probes++
		s.mu.Unlock()
		return okResponse(nil), nil
	}
	s.mu.Lock()
	s.checks = append(s.checks, r)
	s.mu.Unlock()
	return s.h(ctx, r)
}

func (s *authServer) received() []*authv3.CheckRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*authv3.CheckRequest(nil), s.checks...)
}

// startAuth serves h on a loopback port (TLS with tc) until the test ends.
func startAuth(t *testing.T, h func(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error), tc *tls.Config) (*authServer, string) {
	t.Helper()
	return serveAuth(t, h, tc)
}

func startAuthTB(tb testing.TB, h func(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error)) (*authServer, string) {
	return serveAuth(tb, h, nil)
}

func serveAuth(t testing.TB, h func(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error), tc *tls.Config) (*authServer, string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var opts []grpc.ServerOption
	if tc != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	gs := grpc.NewServer(opts...)
	s := &authServer{h: h}
	authv3.RegisterAuthorizationServer(gs, s)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	return s, ln.Addr().String()
}

func okResponse(ok *authv3.OkHttpResponse) *authv3.CheckResponse {
	r := &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(codes.OK)}}
	if ok != nil {
		r.HttpResponse = &authv3.CheckResponse_OkResponse{OkResponse: ok}
	}
	return r
}

func hvo(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, Value: v}}
}

func hvoAppend(k, v string, app bool) *corev3.HeaderValueOption {
	o := hvo(k, v)
	o.Append = wrapperspb.Bool(app)
	return o
}

func hvoAction(k, v string, a corev3.HeaderValueOption_HeaderAppendAction) *corev3.HeaderValueOption {
	o := hvo(k, v)
	o.AppendAction = a
	return o
}

const baseConfig = `
listeners:
  - name: test
    address: 127.0.0.1:0LISTENER
upstreams:
  - name: app
    address: UPSTREAM
agents:
  - name: authz
    transport: ext_authz
    address: AUTHZ
AGENT
routes:
  - name: main
    upstream: app
    agents: [authz]
`

// seen is what the upstream received.
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
// transports' factory from the YAML configuration (agent: more keys of
// the agent, indented as its keys), and waits for the agent to be ready
// unless noWait.
func proxy(t *testing.T, addr, agent string, noWait bool) (string, *seen, agentmux.Agent) {
	t.Helper()
	return proxyListener(t, addr, "", agent, noWait)
}

// proxyListener is proxy with more keys of the listener (TLS).
func proxyListener(t *testing.T, addr, listener, agent string, noWait bool) (string, *seen, agentmux.Agent) {
	t.Helper()
	up := &seen{}
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		up.mu.Lock()
		up.header = r.Header.Clone()
		up.n++
		up.mu.Unlock()
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "hello from app")
	}))
	t.Cleanup(us.Close)
	y := strings.NewReplacer("UPSTREAM", strings.TrimPrefix(us.URL, "http://"), "AUTHZ", addr, "AGENT", agent, "LISTENER", listener).Replace(baseConfig)
	cfg, err := config.Parse([]byte(y))
	if err != nil {
		t.Fatalf("%v\n%s", err, y)
	}
	if err := transports.Check(cfg); err != nil {
		t.Fatal(err)
	}
	a, err := transports.Dialing()[config.TransportExtAuthz](cfg.Agent("authz"), zerolog.Nop())
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
	url, _ := dptest.Serve(t, cfg, map[string]agentmux.Agent{"authz": a})
	return url, up, a
}

// get sends one request; hdr are name, value pairs (a name repeated adds
// a value).
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

// TestCheckRequest checks the attributes a server is shown.
func TestCheckRequest(t *testing.T) {
	s, addr := startAuth(t, func(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		return okResponse(nil), nil
	}, nil)
	url, _, _ := proxy(t, addr, `
    options:
      context_extensions: "tenant=acme, env=prod"`, false)
	resp, _ := get(t, url+"/api/items?id=7&x=y", "Host", "shop.example", "Authorization", "Bearer abc", "X-Multi", "a", "X-Multi", "b")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	got := s.received()
	if len(got) != 1 {
		t.Fatalf("%d checks", len(got))
	}
	ac := got[0].GetAttributes()
	h := ac.GetRequest().GetHttp()
	for _, c := range []struct{ name, got, want string }{
		{"method", h.GetMethod(), "GET"},
		{"path", h.GetPath(), "/api/items?id=7&x=y"},
		{"query", h.GetQuery(), "id=7&x=y"},
		{"host", h.GetHost(), "shop.example"},
		{"scheme", h.GetScheme(), "http"},
		{"protocol", h.GetProtocol(), "HTTP/1.1"},
		{"authorization", h.GetHeaders()["authorization"], "Bearer abc"},
		{"x-multi", h.GetHeaders()["x-multi"], "a,b"},
		{":authority", h.GetHeaders()[":authority"], "shop.example"},
		{":method", h.GetHeaders()[":method"], "GET"},
		{":path", h.GetHeaders()[":path"], "/api/items?id=7&x=y"},
		{"host (it is :authority)", h.GetHeaders()["host"], ""},
		{"source address", ac.GetSource().GetAddress().GetSocketAddress().GetAddress(), "127.0.0.1"},
		{"destination address", ac.GetDestination().GetAddress().GetSocketAddress().GetAddress(), "127.0.0.1"},
		{"tenant", ac.GetContextExtensions()["tenant"], "acme"},
		{"env", ac.GetContextExtensions()["env"], "prod"},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, c.got, c.want)
		}
	}
	if ac.GetSource().GetAddress().GetSocketAddress().GetPortValue() == 0 {
		t.Error("source port missing")
	}
	if ac.GetRequest().GetTime() == nil {
		t.Error("request time missing")
	}
}

// TestOKMutations checks each kind of mutation of an OK answer, applied
// with Envoy's semantics.
func TestOKMutations(t *testing.T) {
	_, addr := startAuth(t, func(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		return okResponse(&authv3.OkHttpResponse{
			Headers: []*corev3.HeaderValueOption{
				hvo("X-Set-Default", "server"), // neither append nor append_action: APPEND_IF_EXISTS_OR_ADD
				hvoAppend("X-User", "alice", false),
				hvoAppend("X-Append", "second", true),
				hvoAction("X-Overwrite", "new", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD),
				hvoAction("X-If-Absent-Present", "no", corev3.HeaderValueOption_ADD_IF_ABSENT),
				hvoAction("X-If-Absent-Missing", "yes", corev3.HeaderValueOption_ADD_IF_ABSENT),
				hvoAction("X-If-Exists-Present", "replaced", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS),
				hvoAction("X-If-Exists-Missing", "no", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS),
			},
			HeadersToRemove:      []string{"X-Remove-Me", "Host", ":path"},
			ResponseHeadersToAdd: []*corev3.HeaderValueOption{hvo("X-Authz", "checked"), hvoAppend("Cache-Control", "no-store", false)},
		}), nil
	}, nil)
	url, up, _ := proxy(t, addr, "", false)
	resp, body := get(t, url+"/", "X-Set-Default", "client", "X-User", "mallory", "X-Append", "first",
		"X-Overwrite", "old", "X-If-Absent-Present", "kept", "X-If-Exists-Present", "old", "X-Remove-Me", "1")
	if resp.StatusCode != 200 || body != "hello from app" {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	h, _ := up.get()
	for _, c := range []struct {
		name string
		want []string
	}{
		{"X-Set-Default", []string{"client", "server"}},
		{"X-User", []string{"alice"}},
		{"X-Append", []string{"first", "second"}},
		{"X-Overwrite", []string{"new"}},
		{"X-If-Absent-Present", []string{"kept"}},
		{"X-If-Absent-Missing", []string{"yes"}},
		{"X-If-Exists-Present", []string{"replaced"}},
		{"X-If-Exists-Missing", nil},
		{"X-Remove-Me", nil},
	} {
		if got := h.Values(c.name); strings.Join(got, "|") != strings.Join(c.want, "|") {
			t.Errorf("upstream %s: got %q, want %q", c.name, got, c.want)
		}
	}
	if got := resp.Header.Get("X-Authz"); got != "checked" {
		t.Errorf("response X-Authz %q", got)
	}
	if got := resp.Header.Values("Cache-Control"); len(got) != 1 || got[0] != "no-store" {
		t.Errorf("response Cache-Control %q", got)
	}
}

// TestDenied checks a denial: its status, headers and body reach the
// client and nothing reaches the upstream; without a status, 403.
func TestDenied(t *testing.T) {
	_, addr := startAuth(t, func(_ context.Context, r *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		if r.GetAttributes().GetRequest().GetHttp().GetPath() == "/plain" {
			return &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(codes.PermissionDenied)}}, nil
		}
		return &authv3.CheckResponse{
			Status: &rpcstatus.Status{Code: int32(codes.Unauthenticated)},
			HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
				Status:  &typev3.HttpStatus{Code: typev3.StatusCode_Unauthorized},
				Headers: []*corev3.HeaderValueOption{hvo("WWW-Authenticate", `Bearer realm="shop"`), hvo("Content-Type", "application/json")},
				Body:    `{"error":"login required"}`,
			}},
		}, nil
	}, nil)
	url, up, _ := proxy(t, addr, "", false)
	resp, body := get(t, url+"/secret")
	if resp.StatusCode != 401 || body != `{"error":"login required"}` {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	if got := resp.Header.Get("WWW-Authenticate"); got != `Bearer realm="shop"` {
		t.Errorf("WWW-Authenticate %q", got)
	}
	if got := resp.Header.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type %q", got)
	}
	resp, _ = get(t, url+"/plain")
	if resp.StatusCode != 403 {
		t.Errorf("denied without a status: %d, want 403", resp.StatusCode)
	}
	if _, n := up.get(); n != 0 {
		t.Errorf("upstream got %d requests", n)
	}
}

// TestFailures checks the answers that are not a verdict: a gRPC error,
// an error_response and an OK with a query parameter to set that is not
// one parameter (an '&' in its name) fail the request closed (status 403, Envoy's status_on_error default, or
// failure_status) or open (failure_mode: open, Envoy's
// failure_mode_allow).
func TestFailures(t *testing.T) {
	_, addr := startAuth(t, func(_ context.Context, r *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		switch r.GetAttributes().GetRequest().GetHttp().GetPath() {
		case "/rpc-error":
			return nil, status.Error(codes.Internal, "policy engine crashed")
		case "/error-response":
			return &authv3.CheckResponse{
				Status:       &rpcstatus.Status{Code: int32(codes.Unavailable)},
				HttpResponse: &authv3.CheckResponse_ErrorResponse{ErrorResponse: &authv3.DeniedHttpResponse{Body: "oops"}},
			}, nil
		case "/query":
			return okResponse(&authv3.OkHttpResponse{QueryParametersToSet: []*corev3.QueryParameter{{Key: "a&admin", Value: "1"}}}), nil
		}
		return okResponse(nil), nil
	}, nil)
	for _, tc := range []struct {
		name, agent string
		want        int
	}{
		{"closed", "", 403},
		{"closed with failure_status", "\n    failure_status: 503", 503},
		{"open", "\n    failure_mode: open", 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, up, a := proxy(t, addr, tc.agent, false)
			for i, path := range []string{"/rpc-error", "/error-response", "/query"} {
				resp, body := get(t, url+path)
				if resp.StatusCode != tc.want {
					t.Errorf("%s: status %d, want %d", path, resp.StatusCode, tc.want)
				}
				if strings.Contains(body, "crashed") || strings.Contains(body, "oops") {
					t.Errorf("%s: the server's error reached the client: %q", path, body)
				}
				h, n := up.get()
				if tc.want == 200 {
					if n != i+1 {
						t.Errorf("%s: upstream got %d requests", path, n)
					}
					if h.Get("X-Sidecar-Fail-Open") != "authz" || resp.Header.Get("X-Sidecar-Fail-Open") != "authz" {
						t.Errorf("%s: the request passed unmarked", path)
					}
				} else if n != 0 {
					t.Errorf("%s: upstream got %d requests", path, n)
				}
			}
			ev := a.Snapshot().Events
			if ev["error_responses"] != 1 || ev["invalid_query_parameters"] != 1 {
				t.Errorf("events %v", ev)
			}
		})
	}
}

// TestTimeout checks a server slower than timeouts.message: 504, and the
// call is abandoned (the server sees its context end).
func TestTimeout(t *testing.T) {
	ended := make(chan struct{}, 1)
	_, addr := startAuth(t, func(ctx context.Context, _ *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		select {
		case <-ctx.Done():
			ended <- struct{}{}
		case <-time.After(10 * time.Second):
		}
		return okResponse(nil), nil
	}, nil)
	url, up, a := proxy(t, addr, `
    timeouts:
      message: 200ms`, false)
	resp, _ := get(t, url+"/")
	if resp.StatusCode != 504 {
		t.Fatalf("status %d, want 504", resp.StatusCode)
	}
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Error("the server's call was not canceled")
	}
	if _, n := up.get(); n != 0 {
		t.Errorf("upstream got %d requests", n)
	}
	if a.Snapshot().Timeouts == 0 {
		t.Error("timeout not counted")
	}
}

// TestDown checks a server that is not there: the agent is not ready,
// says why, and requests fail closed.
func TestDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	url, up, a := proxy(t, addr, "", true)
	resp, _ := get(t, url+"/")
	if resp.StatusCode != 403 {
		t.Errorf("status %d, want 403", resp.StatusCode)
	}
	if _, n := up.get(); n != 0 {
		t.Errorf("upstream got %d requests", n)
	}
	testutil.WaitFor(t, "the agent's last error", func() bool {
		st := a.Snapshot()
		return !st.Ready && st.LastError != ""
	})
}

// TestNotAuthz checks that a gRPC server without the Authorization
// service never gets requests: the probe is refused and counted.
func TestNotAuthz(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	_, _, a := proxy(t, ln.Addr().String(), "", true)
	testutil.WaitFor(t, "the probe refused", func() bool {
		st := a.Snapshot()
		return st.Events["probes_refused"] > 0 && !st.Ready && strings.Contains(st.LastError, "does not implement")
	})
}

// TestTLS checks a server behind TLS and mTLS, and that a client that does
// not trust its CA never reaches it.
func TestTLS(t *testing.T) {
	ca := testutil.NewPKI(t, "test")
	server := ca.Server(t, "authz", "127.0.0.1")
	client := ca.Client(t, "client", "sidecar")
	other := testutil.NewPKI(t, "other")
	allow := func(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		return okResponse(nil), nil
	}
	for _, tc := range []struct {
		name, opts string
		mtls, ok   bool
	}{
		{"tls", "tls_ca_file: " + ca.CAFile, false, true},
		{"mtls", "tls_ca_file: " + ca.CAFile + "\n      tls_cert_file: " + client.CertFile + "\n      tls_key_file: " + client.KeyFile, true, true},
		{"unknown CA", "tls_ca_file: " + other.CAFile, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stc := &tls.Config{Certificates: []tls.Certificate{server.TLS}, MinVersion: tls.VersionTLS12}
			if tc.mtls {
				stc.ClientAuth = tls.RequireAndVerifyClientCert
				stc.ClientCAs = ca.Pool
			}
			s, addr := startAuth(t, allow, stc)
			url, _, _ := proxy(t, addr, "\n    options:\n      "+tc.opts, !tc.ok)
			resp, _ := get(t, url+"/")
			if tc.ok != (resp.StatusCode == 200) {
				t.Errorf("status %d", resp.StatusCode)
			}
			if n := len(s.received()); tc.ok != (n == 1) {
				t.Errorf("server got %d checks", n)
			}
		})
	}
}

// TestDecisionCache checks that the dataplane's decision cache works with
// this transport as with any: the second identical request is not
// checked again.
func TestDecisionCache(t *testing.T) {
	s, addr := startAuth(t, func(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		return okResponse(&authv3.OkHttpResponse{Headers: []*corev3.HeaderValueOption{hvoAppend("X-User", "alice", false)}}), nil
	}, nil)
	url, up, _ := proxy(t, addr, `
    decision_cache:
      key: [method, path]`, false)
	for range 2 {
		resp, _ := get(t, url+"/cached")
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		if h, _ := up.get(); h.Get("X-User") != "alice" {
			t.Errorf("upstream X-User %q", h.Get("X-User"))
		}
	}
	if n := len(s.received()); n != 1 {
		t.Errorf("server got %d checks, want 1", n)
	}
}

// post sends a POST with body.
func post(t *testing.T, url, body string) (*http.Response, string) {
	t.Helper()
	cl := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := cl.Post(url, "text/plain", strings.NewReader(body))
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

// postWith sends a POST of body (chunked unless a strings.Reader) with
// the headers hdr (name, value pairs).
func postWith(t *testing.T, url string, body io.Reader, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	cl := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
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

// TestWithRequestBody checks with_request_body: the server gets the
// whole body (inline when it is one chunk, else after the last chunk),
// can deny on it before the upstream sees any of it, and a body over
// the limit is refused (413) or checked on its first limit bytes
// (over_limit: prefix, Envoy's allow_partial_message).
func TestWithRequestBody(t *testing.T) {
	s, addr := startAuth(t, func(_ context.Context, r *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		h := r.GetAttributes().GetRequest().GetHttp()
		if strings.Contains(h.GetBody(), "evil") || strings.Contains(string(h.GetRawBody()), "evil") {
			return &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(codes.PermissionDenied)}}, nil
		}
		return okResponse(&authv3.OkHttpResponse{Headers: []*corev3.HeaderValueOption{hvoAppend("X-Body-Checked", h.GetPath(), false)}}), nil
	}, nil)
	lastBody := func() (string, []byte) {
		got := s.received()
		h := got[len(got)-1].GetAttributes().GetRequest().GetHttp()
		return h.GetBody(), h.GetRawBody()
	}
	// lastPartial is the last Check's x-envoy-auth-partial-body ("-":
	// none).
	lastPartial := func() string {
		got := s.received()
		v, ok := got[len(got)-1].GetAttributes().GetRequest().GetHttp().GetHeaders()["x-envoy-auth-partial-body"]
		if !ok {
			return "-"
		}
		return v
	}
	big := strings.Repeat("abcdefgh", 640) // 5 KiB: five 1 KiB chunks
	t.Run("reject", func(t *testing.T) {
		url, up, _ := proxy(t, addr, `
    request_body:
      limit: 8KiB
      chunk_size: 1KiB
    options:
      with_request_body: "true"`, false)
		n0 := len(s.received())
		if resp, _ := post(t, url+"/small", "hello"); resp.StatusCode != 200 {
			t.Errorf("small: status %d", resp.StatusCode)
		}
		if b, _ := lastBody(); b != "hello" {
			t.Errorf("small: server got body %q", b)
		}
		if p := lastPartial(); p != "false" {
			t.Errorf("small: x-envoy-auth-partial-body %q, want false", p)
		}
		// A client's own header of that name is not what the server sees.
		if resp, _ := postWith(t, url+"/claim", strings.NewReader("hello"), "X-Envoy-Auth-Partial-Body", "true"); resp.StatusCode != 200 {
			t.Errorf("claim: status %d", resp.StatusCode)
		}
		if p := lastPartial(); p != "false" {
			t.Errorf("a client's x-envoy-auth-partial-body: true reached the server as %q", p)
		}
		if resp, _ := post(t, url+"/big", big); resp.StatusCode != 200 {
			t.Errorf("big: status %d", resp.StatusCode)
		}
		if b, _ := lastBody(); b != big {
			t.Errorf("big: server got %d bytes of body", len(b))
		}
		if p := lastPartial(); p != "false" {
			t.Errorf("big: x-envoy-auth-partial-body %q, want false", p)
		}
		if h, _ := up.get(); h.Get("X-Body-Checked") != "/big" {
			t.Errorf("big: the OK's header did not reach the upstream: %q", h.Get("X-Body-Checked"))
		}
		if resp, _ := post(t, url+"/denied", big+"evil"); resp.StatusCode != 403 {
			t.Errorf("evil: status %d", resp.StatusCode)
		}
		if resp, _ := get(t, url+"/get", "X-Envoy-Auth-Partial-Body", "true"); resp.StatusCode != 200 {
			t.Errorf("get: status %d", resp.StatusCode)
		}
		if p := lastPartial(); p != "-" {
			t.Errorf("get: x-envoy-auth-partial-body %q on a request without a body", p)
		}
		if len(s.received())-n0 != 5 {
			t.Errorf("%d checks, want one per request", len(s.received())-n0)
		}
		if _, n := up.get(); n != 4 {
			t.Errorf("upstream got %d requests, want 4", n)
		}
		if resp, _ := post(t, url+"/huge", strings.Repeat("x", 9<<10)); resp.StatusCode != 413 {
			t.Errorf("over the limit: status %d, want 413", resp.StatusCode)
		}
		if len(s.received())-n0 != 5 {
			t.Error("a body over the limit was checked")
		}
	})
	t.Run("prefix", func(t *testing.T) {
		url, up, _ := proxy(t, addr, `
    request_body:
      limit: 2KiB
      chunk_size: 1KiB
      over_limit: prefix
    options:
      with_request_body: "true"
      pack_as_bytes: "true"`, false)
		if resp, _ := post(t, url+"/partial", big); resp.StatusCode != 200 {
			t.Errorf("status %d", resp.StatusCode)
		}
		if b, raw := lastBody(); b != "" || string(raw) != big[:2048] {
			t.Errorf("server got body %q and %d raw bytes, want the first 2048 raw", b, len(raw))
		}
		if p := lastPartial(); p != "true" {
			t.Errorf("cut at the limit: x-envoy-auth-partial-body %q, want true", p)
		}
		// Chunked, its length unknown until read.
		if resp, _ := postWith(t, url+"/chunked", io.MultiReader(strings.NewReader(big))); resp.StatusCode != 200 {
			t.Errorf("chunked: status %d", resp.StatusCode)
		}
		if _, raw := lastBody(); string(raw) != big[:2048] || lastPartial() != "true" {
			t.Errorf("chunked, cut: %d raw bytes, x-envoy-auth-partial-body %q", len(raw), lastPartial())
		}
		if resp, _ := postWith(t, url+"/chunked-small", io.MultiReader(strings.NewReader(big[:2048]))); resp.StatusCode != 200 {
			t.Errorf("chunked small: status %d", resp.StatusCode)
		}
		if _, raw := lastBody(); string(raw) != big[:2048] || lastPartial() != "false" {
			t.Errorf("chunked, whole at the limit: %d raw bytes, x-envoy-auth-partial-body %q", len(raw), lastPartial())
		}
		if resp, _ := post(t, url+"/whole", "hello"); resp.StatusCode != 200 || lastPartial() != "false" {
			t.Errorf("whole: status %d, x-envoy-auth-partial-body %q", resp.StatusCode, lastPartial())
		}
		if resp, _ := post(t, url+"/late-evil", big+"evil"); resp.StatusCode != 200 {
			t.Errorf("evil past the prefix: status %d (only the prefix is checked)", resp.StatusCode)
		}
		if resp, _ := post(t, url+"/early-evil", "evil"+big); resp.StatusCode != 403 {
			t.Errorf("evil in the prefix: status %d", resp.StatusCode)
		}
		if _, n := up.get(); n != 5 {
			t.Errorf("upstream got %d requests, want 5", n)
		}
	})
}

// TestClientGone checks that a client going away ends its Check at once,
// long before the message timeout.
func TestClientGone(t *testing.T) {
	started, ended := make(chan struct{}, 1), make(chan struct{}, 1)
	_, addr := startAuth(t, func(ctx context.Context, _ *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		started <- struct{}{}
		select {
		case <-ctx.Done():
			ended <- struct{}{}
		case <-time.After(30 * time.Second):
		}
		return okResponse(nil), nil
	}, nil)
	url, _, _ := proxy(t, addr, `
    timeouts:
      message: 30s
      request: 30s`, false)
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("no Check")
	}
	conn.Close()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the Check went on after the client left")
	}
}

// TestCollector: the transport's counters are exported per agent as
// sidecar_authz_events_total, from the client's report of itself.
func TestCollector(t *testing.T) {
	_, addr := startAuth(t, func(_ context.Context, r *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		if r.GetAttributes().GetRequest().GetHttp().GetPath() == "/deny" {
			return &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(codes.PermissionDenied)}}, nil
		}
		return okResponse(nil), nil
	}, nil)
	url, _, a := proxy(t, addr, "", false)
	get(t, url+"/ok")
	get(t, url+"/deny")
	get(t, url+"/deny")
	m, err := metrics.New(metrics.Config{Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	m.SetAgents(func() []agentmux.AgentStatus { return []agentmux.AgentStatus{a.Snapshot()} })
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "sidecar_authz_events_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["agent"] == "authz" && labels["transport"] == "ext_authz" {
				got[labels["event"]] = m.GetCounter().GetValue()
			}
		}
	}
	if got["checks"] != 3 || got["ok"] != 1 || got["denied"] != 2 || got["probes_refused"] != 0 {
		t.Errorf("counters %v", got)
	}
}

// TestFailover checks members (addresses) and failover as for any
// agent: a Check that fails on a member's broken connection
// (Unavailable) is retried once on the other member.
func TestFailover(t *testing.T) {
	broken, brokenAddr := startAuth(t, func(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		return nil, status.Error(codes.Unavailable, "going away")
	}, nil)
	good, addr := startAuth(t, func(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		return okResponse(&authv3.OkHttpResponse{Headers: []*corev3.HeaderValueOption{hvoAppend("X-Member", "good", false)}}), nil
	}, nil)
	url, up, a := proxy(t, brokenAddr, "\n    addresses: ["+addr+"]", false)
	testutil.WaitFor(t, "two members up", func() bool { return a.Snapshot().Connections == 2 })
	for range 6 {
		resp, _ := get(t, url+"/")
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		if h, _ := up.get(); h.Get("X-Member") != "good" {
			t.Errorf("upstream X-Member %q", h.Get("X-Member"))
		}
	}
	if n := len(good.received()); n != 6 {
		t.Errorf("the good member got %d checks, want 6", n)
	}
	if n := len(broken.received()); n == 0 {
		t.Error("the broken member was never tried: nothing failed over")
	}
}

// TestUnixSocket checks a server on a Unix socket (address unix:/path).
func TestUnixSocket(t *testing.T) {
	path := testutil.SocketPath(t)
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	s := &authServer{h: func(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		return okResponse(nil), nil
	}}
	authv3.RegisterAuthorizationServer(gs, s)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	url, _, _ := proxy(t, "unix:"+path, "", false)
	if resp, _ := get(t, url+"/"); resp.StatusCode != 200 {
		t.Errorf("status %d", resp.StatusCode)
	}
	if n := len(s.received()); n != 1 {
		t.Errorf("server got %d checks", n)
	}
}

// TestTLSFacts checks what a server is told about a client's TLS: the
// scheme, the client certificate's subject as the source principal, the
// SNI with include_tls_session.
func TestTLSFacts(t *testing.T) {
	pki := testutil.NewPKI(t, "edge")
	srvCert := pki.Server(t, "shop", "shop.example")
	client := pki.Client(t, "client", "alice")
	s, addr := startAuth(t, func(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		return okResponse(nil), nil
	}, nil)
	url, _, _ := proxyListener(t, addr, `
    tls:
      certificates:
        - cert_file: `+srvCert.CertFile+`
          key_file: `+srvCert.KeyFile+`
      client_ca_file: `+pki.CAFile, `
    options:
      include_tls_session: "true"`, false)
	cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		ServerName: "shop.example", RootCAs: pki.Pool, Certificates: []tls.Certificate{client.TLS}}}}
	resp, err := cl.Get(strings.Replace(url, "http://", "https://", 1) + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	got := s.received()
	if len(got) != 1 {
		t.Fatalf("%d checks", len(got))
	}
	ac := got[0].GetAttributes()
	if h := ac.GetRequest().GetHttp(); h.GetScheme() != "https" || h.GetHeaders()[":scheme"] != "https" {
		t.Errorf("scheme %q, :scheme %q", h.GetScheme(), h.GetHeaders()[":scheme"])
	}
	if p := ac.GetSource().GetPrincipal(); !strings.Contains(p, "CN=alice") {
		t.Errorf("source principal %q", p)
	}
	if sni := ac.GetTlsSession().GetSni(); sni != "shop.example" {
		t.Errorf("tls_session.sni %q", sni)
	}
}

// TestNonUTF8 checks a request whose header value and path carry bytes
// that are not UTF-8 (obs-text, which HTTP allows): the Check is made,
// with each bad byte as '!' as Envoy sanitizes them
// (MessageUtil::sanitizeUtf8String), instead of failing to encode.
func TestNonUTF8(t *testing.T) {
	s, addr := startAuth(t, func(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		return okResponse(nil), nil
	}, nil)
	url, _, _ := proxy(t, addr, "", false)
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, "GET /caf\xe9 HTTP/1.1\r\nHost: x\r\nX-Name: Ren\xe9e\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := io.ReadAll(conn)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(resp), "HTTP/1.1 200") {
		t.Fatalf("response %q", resp)
	}
	got := s.received()
	if len(got) != 1 {
		t.Fatalf("%d checks", len(got))
	}
	h := got[0].GetAttributes().GetRequest().GetHttp()
	if v := h.GetHeaders()["x-name"]; v != "Ren!e" {
		t.Errorf("x-name %q", v)
	}
	if p := h.GetPath(); !strings.HasPrefix(p, "/caf") || strings.ContainsRune(p, 0xe9) {
		t.Errorf("path %q", p)
	}
}

// TestQueryParameters checks query_parameters_to_set and _remove with
// Envoy's semantics: a new parameter set, an existing one replaced (all
// its values), one removed, a missing one removed; the query rebuilt
// sorted by name, values in order, undecoded; the upstream and the
// agents after see the exact new target; a target over the agent's
// limits.header_value fails the request.
func TestQueryParameters(t *testing.T) {
	_, addr := startAuth(t, func(_ context.Context, r *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		switch path := r.GetAttributes().GetRequest().GetHttp().GetPath(); {
		case strings.HasPrefix(path, "/rewrite"):
			return okResponse(&authv3.OkHttpResponse{
				QueryParametersToSet: []*corev3.QueryParameter{
					{Key: "user", Value: "alice"}, // new
					{Key: "page", Value: "2"},     // replaces both values
					{Key: "q", Value: "a%20b+c"},  // kept as sent
					{Key: "page", Value: "3"},     // later wins
				},
				QueryParametersToRemove: []string{"token", "missing"},
			}), nil
		case strings.HasPrefix(path, "/strip"):
			return okResponse(&authv3.OkHttpResponse{QueryParametersToRemove: []string{"token"}}), nil
		case strings.HasPrefix(path, "/long"):
			return okResponse(&authv3.OkHttpResponse{QueryParametersToSet: []*corev3.QueryParameter{{Key: "pad", Value: strings.Repeat("x", 2048)}}}), nil
		}
		return okResponse(nil), nil
	}, nil)
	var mu sync.Mutex
	var targets []string
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		targets = append(targets, r.RequestURI)
		mu.Unlock()
	}))
	t.Cleanup(us.Close)
	// A second agent after the ext_authz one: it sees the new target.
	second, addr2 := startAuth(t, func(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		return okResponse(nil), nil
	}, nil)
	y := `
listeners:
  - name: test
    address: 127.0.0.1:0
upstreams:
  - name: app
    address: ` + strings.TrimPrefix(us.URL, "http://") + `
agents:
  - name: authz
    transport: ext_authz
    address: ` + addr + `
    limits:
      header_value: 1KiB
  - name: after
    transport: ext_authz
    address: ` + addr2 + `
routes:
  - name: main
    upstream: app
    agents: [authz, after]
`
	url, agents, logs := serveAgents(t, y, "authz", "after")
	last := func() string {
		mu.Lock()
		defer mu.Unlock()
		if len(targets) == 0 {
			return ""
		}
		return targets[len(targets)-1]
	}
	for _, tc := range []struct{ in, want string }{
		{"/rewrite?z=9&page=1&token=s3cret&page=5&flag&a=1", "/rewrite?a=1&flag=&page=3&q=a%20b+c&user=alice&z=9"},
		{"/rewrite", "/rewrite?page=3&q=a%20b+c&user=alice"},
		{"/strip?token=s3cret", "/strip"},
		{"/strip?b=2&token=1&token=2&a=1", "/strip?a=1&b=2"},
		{"/strip?keep=1", "/strip?keep=1"},
		{"/other?token=x&b=1", "/other?token=x&b=1"}, // no lists: untouched
	} {
		resp, _ := get(t, url+tc.in)
		if resp.StatusCode != 200 {
			t.Errorf("%s: status %d", tc.in, resp.StatusCode)
			continue
		}
		if got := last(); got != tc.want {
			t.Errorf("%s: upstream got %q, want %q", tc.in, got, tc.want)
		}
		got := second.received()
		if p := got[len(got)-1].GetAttributes().GetRequest().GetHttp().GetPath(); p != tc.want {
			t.Errorf("%s: the next agent was shown %q, want %q", tc.in, p, tc.want)
		}
	}
	n := len(targets)
	if resp, _ := get(t, url+"/long"); resp.StatusCode != 403 {
		t.Errorf("a target over limits.header_value: status %d, want 403 (failure_status)", resp.StatusCode)
	}
	if len(targets) != n {
		t.Error("a target over the limits reached the upstream")
	}
	logs.WaitLog(t, "header limits exceeded: query rewrite makes a 2058-byte target (limit 1024)")
	// Every answer with a list counts, the one the dataplane refused too.
	if ev := agents["authz"].Snapshot().Events; ev["query_rewrites"] != 6 {
		t.Errorf("events %v: want 6 query_rewrites", ev)
	}
}

// serveAgents builds the named ext_authz agents of the YAML configuration y,
// waits for them and serves the dataplane.
func serveAgents(t *testing.T, y string, names ...string) (string, map[string]agentmux.Agent, *testutil.LogBuffer) {
	t.Helper()
	cfg, err := config.Parse([]byte(y))
	if err != nil {
		t.Fatalf("%v\n%s", err, y)
	}
	if err := transports.Check(cfg); err != nil {
		t.Fatal(err)
	}
	agents := map[string]agentmux.Agent{}
	for _, name := range names {
		a, err := transports.Dialing()[config.TransportExtAuthz](cfg.Agent(name), zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = a.(interface{ WaitReady(context.Context) error }).WaitReady(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		agents[name] = a
	}
	url, logs := dptest.Serve(t, cfg, agents)
	return url, agents, logs
}

// TestPerRoute checks routes[].agents[].ext_authz, Envoy's
// ExtAuthzPerRoute: each route's context_extensions are merged over the
// agent's (the route's winning), a route without them sends the agent's,
// and a disabled route's requests are not checked.
func TestPerRoute(t *testing.T) {
	s, addr := startAuth(t, func(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		return okResponse(nil), nil
	}, nil)
	var mu sync.Mutex
	upstream := 0
	us := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		mu.Lock()
		upstream++
		mu.Unlock()
	}))
	t.Cleanup(us.Close)
	y := `
listeners:
  - name: test
    address: 127.0.0.1:0
upstreams:
  - name: app
    address: ` + strings.TrimPrefix(us.URL, "http://") + `
agents:
  - name: authz
    transport: ext_authz
    address: ` + addr + `
    options:
      context_extensions: "env=prod,tier=agent"
routes:
  - name: shop
    path_prefix: /shop
    upstream: app
    agents:
      - name: authz
        ext_authz:
          context_extensions: {service: shop, env: staging}
  - name: admin
    path_prefix: /admin
    upstream: app
    agents:
      - name: authz
        ext_authz:
          context_extensions: {service: admin}
  - name: health
    path_prefix: /healthz
    upstream: app
    agents:
      - name: authz
        ext_authz:
          disabled: true
  - name: rest
    upstream: app
    agents: [authz]
`
	cfg, err := config.Parse([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	if err := transports.Check(cfg); err != nil {
		t.Fatal(err)
	}
	a, err := transports.ForConfig(cfg)[config.TransportExtAuthz](cfg.Agent("authz"), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.(interface{ WaitReady(context.Context) error }).WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	url, _ := dptest.Serve(t, cfg, map[string]agentmux.Agent{"authz": a})
	for _, tc := range []struct {
		path string
		want map[string]string // nil: not checked
	}{
		{"/shop/cart", map[string]string{"env": "staging", "tier": "agent", "service": "shop"}},
		{"/admin/users", map[string]string{"env": "prod", "tier": "agent", "service": "admin"}},
		{"/other", map[string]string{"env": "prod", "tier": "agent"}},
		{"/healthz", nil},
		{"/shop/again", map[string]string{"env": "staging", "tier": "agent", "service": "shop"}},
	} {
		n0 := len(s.received())
		if resp, _ := get(t, url+tc.path); resp.StatusCode != 200 {
			t.Errorf("%s: status %d", tc.path, resp.StatusCode)
			continue
		}
		got := s.received()
		if tc.want == nil {
			if len(got) != n0 {
				t.Errorf("%s: a disabled route's request was checked", tc.path)
			}
			continue
		}
		if len(got) != n0+1 {
			t.Errorf("%s: %d checks, want 1", tc.path, len(got)-n0)
			continue
		}
		if ext := got[len(got)-1].GetAttributes().GetContextExtensions(); !maps.Equal(ext, tc.want) {
			t.Errorf("%s: context_extensions %v, want %v", tc.path, ext, tc.want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if upstream != 5 {
		t.Errorf("upstream got %d requests, want 5", upstream)
	}
}

// TestPerRouteDecisionCache checks that a decision cached for one route
// is never another route's when the routes send the server different
// context_extensions: the server's answer depends on them, so the key
// holds the route whatever its configured parts (here the method and
// path, which both routes' requests share).
func TestPerRouteDecisionCache(t *testing.T) {
	s, addr := startAuth(t, func(_ context.Context, r *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		if r.GetAttributes().GetContextExtensions()["tier"] == "admin" {
			return &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(codes.PermissionDenied)}}, nil
		}
		return okResponse(nil), nil
	}, nil)
	us := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(us.Close)
	cfg, err := config.Parse([]byte(`
listeners:
  - name: test
    address: 127.0.0.1:0
upstreams:
  - name: app
    address: ` + strings.TrimPrefix(us.URL, "http://") + `
agents:
  - name: authz
    transport: ext_authz
    address: ` + addr + `
    decision_cache:
      key: [method, path]
routes:
  - name: admin
    hosts: [admin.example]
    upstream: app
    agents:
      - name: authz
        ext_authz:
          context_extensions: {tier: admin}
  - name: www
    upstream: app
    agents:
      - name: authz
        ext_authz:
          context_extensions: {tier: public}
`))
	if err != nil {
		t.Fatal(err)
	}
	a, err := transports.ForConfig(cfg)[config.TransportExtAuthz](cfg.Agent("authz"), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.(interface{ WaitReady(context.Context) error }).WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	url, _ := dptest.Serve(t, cfg, map[string]agentmux.Agent{"authz": a})
	for i, tc := range []struct {
		host string
		want int
	}{{"www.example", 200}, {"admin.example", 403}, {"www.example", 200}, {"admin.example", 403}} {
		req, _ := http.NewRequest("GET", url+"/report", nil)
		req.Host = tc.host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("request %d to %s: status %d, want %d", i, tc.host, resp.StatusCode, tc.want)
		}
	}
	if n := len(s.received()); n != 2 {
		t.Errorf("the server got %d checks, want 2 (one a route, the rest cached)", n)
	}
}

// TestPerRouteDisabledPaths probes a route with the check disabled
// (health checks) beside a checked catch-all: no spelling of a path
// (dot segments, encoded slashes and dots, case, repeated slashes) takes
// a request past the check to anything but the disabled route's paths as
// the upstream reads them (Go's net/http: decoded, cleaned, '\' a
// byte of the path).
func TestPerRouteDisabledPaths(t *testing.T) {
	_, addr := startAuth(t, func(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		return &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(codes.PermissionDenied)}}, nil
	}, nil)
	var mu sync.Mutex
	var paths []string
	us := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.RequestURI)
		mu.Unlock()
	}))
	t.Cleanup(us.Close)
	cfg, err := config.Parse([]byte(`
listeners:
  - name: test
    address: 127.0.0.1:0
upstreams:
  - name: app
    address: ` + strings.TrimPrefix(us.URL, "http://") + `
agents:
  - name: authz
    transport: ext_authz
    address: ` + addr + `
routes:
  - name: health
    path_prefix: /healthz
    upstream: app
    agents:
      - name: authz
        ext_authz:
          disabled: true
  - name: rest
    upstream: app
    agents: [authz]
`))
	if err != nil {
		t.Fatal(err)
	}
	a, err := transports.ForConfig(cfg)[config.TransportExtAuthz](cfg.Agent("authz"), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.(interface{ WaitReady(context.Context) error }).WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	url, _ := dptest.Serve(t, cfg, map[string]agentmux.Agent{"authz": a})
	host := strings.TrimPrefix(url, "http://")
	for _, target := range []string{
		"/healthz", "/healthz/live", "/healthz/../admin", "/healthz/%2e%2e/admin", "/healthz/%2E%2E/admin",
		"/healthz%2f..%2fadmin", "/healthz%2F..%2Fadmin", "/healthz/..%2fadmin", "/healthz/..;/admin",
		"//healthz/../admin", "/HEALTHZ/../admin", "/./healthz/../admin", "/healthz/.%2e/admin",
		"/healthz\\..\\admin", "/healthz/%252e%252e/admin", "/healthz?/../admin", "/healthzadmin",
	} {
		c, err := net.DialTimeout("tcp", host, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		mu.Lock()
		n0 := len(paths)
		mu.Unlock()
		_, _ = io.WriteString(c, "GET "+target+" HTTP/1.1\r\nHost: app.example\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		c.Close()
		if err != nil {
			t.Errorf("%s: %v", target, err)
			continue
		}
		resp.Body.Close()
		mu.Lock()
		got := paths[n0:]
		mu.Unlock()
		for _, p := range got {
			// The upstream's reading: decoded, cleaned (Go's net/http).
			u, err := neturl.ParseRequestURI(p)
			if err != nil {
				t.Errorf("%s: the upstream got %q, unparsable", target, p)
				continue
			}
			// path_prefix is byte-wise (/healthzadmin is the route's).
			if clean := path.Clean(u.Path); !strings.HasPrefix(clean, "/healthz") {
				t.Errorf("%s: unchecked, the upstream got %q (%s)", target, p, clean)
			}
		}
	}
}
