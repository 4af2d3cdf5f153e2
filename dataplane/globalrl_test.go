package dataplane_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// rlServer is an Envoy rate limit service: each descriptor (its entries
// joined) may be hit limit times; it records what it was asked.
type rlServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	limit  int
	limits map[string]int // by descriptor, the default limit's exceptions
	delay  time.Duration
	mu     sync.Mutex
	hits   map[string]int
	seen   []string
	// edit, when set, changes each answer before it is sent.
	edit func(*rlsv3.RateLimitResponse)
}

func (s *rlServer) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if s.delay > 0 {
		select {
		case <-time.After(s.delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	var descs []string
	for _, d := range req.GetDescriptors() {
		var parts []string
		for _, e := range d.GetEntries() {
			parts = append(parts, e.GetKey()+"="+e.GetValue())
		}
		key := strings.Join(parts, ",")
		descs = append(descs, key)
		s.hits[key]++
		limit := s.limit
		if l, ok := s.limits[key]; ok {
			limit = l
		}
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK,
			CurrentLimit:   &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: uint32(limit), Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE},
			LimitRemaining: uint32(max(limit-s.hits[key], 0)), DurationUntilReset: durationpb.New(29*time.Second + 100*time.Millisecond)}
		if s.hits[key] > limit {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			st.DurationUntilReset = durationpb.New(42*time.Second + 300*time.Millisecond)
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		resp.Statuses = append(resp.Statuses, st)
	}
	sort.Strings(descs)
	s.seen = append(s.seen, req.GetDomain()+" "+strings.Join(descs, " | "))
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		resp.ResponseHeadersToAdd = []*corev3.HeaderValue{{Key: "X-Limited-By", Value: "rls"}, {Key: "Content-Length", Value: "1"}}
	} else {
		resp.RequestHeadersToAdd = []*corev3.HeaderValue{{Key: "X-Rls", Value: "ok"}}
		// The second breaks the header rules: dropped.
		resp.ResponseHeadersToAdd = []*corev3.HeaderValue{{Key: "X-Quota-Checked", Value: "yes"}, {Key: "X-Sidecar-Fail-Open", Value: "forged"}}
	}
	if s.edit != nil {
		s.edit(resp)
	}
	return resp, nil
}

func serveRLS(t *testing.T, s *rlServer, opts ...grpc.ServerOption) string {
	t.Helper()
	s.hits = map[string]int{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(g, s)
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	return ln.Addr().String()
}

func globalProxy(t *testing.T, rls, service string) (*proxy, *upstream) {
	t.Helper()
	u := newUpstream(t, nil)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q}]
rate_limit_service: {address: %q, domain: edge%s}
routes:
  - name: api
    upstream: app
    global_rate_limit:
      descriptors:
        - entries: [{remote_address: true}]
        - entries: [{generic_key: api}, {request_header: X-Api-Key, descriptor_key: key}]
        - entries: [{route_name: true}]
`, u.addr(), rls, service)))
	if err != nil {
		t.Fatal(err)
	}
	return startProxy(t, cfg, nil, nil), u
}

// TestGlobalRateLimit: the descriptors reach the service as Envoy's
// actions build them (a descriptor whose header is absent left out);
// OVER_LIMIT answers 429 with Retry-After, RateLimit fields and the
// service's headers (those the header rules allow); OK adds the
// service's request headers.
func TestGlobalRateLimit(t *testing.T) {
	s := &rlServer{limit: 2}
	// A timeout no loaded test machine reaches: the default (20ms) is
	// TestGlobalRateLimitFailure's business.
	p, u := globalProxy(t, serveRLS(t, s), ", timeout: 10s")
	var statuses []int
	for i := 0; i < 3; i++ {
		resp, _ := p.do(t, "GET", "/", nil, "X-Api-Key", "k1")
		statuses = append(statuses, resp.StatusCode)
		if resp.StatusCode == 429 {
			if resp.Header.Get("Retry-After") != "43" || resp.Header.Get("RateLimit") != `"global";r=0;t=43` ||
				resp.Header.Get("RateLimit-Policy") != `"global";q=2;w=60` || resp.Header.Get("X-Limited-By") != "rls" {
				t.Errorf("429 headers %v", resp.Header)
			}
		}
	}
	if fmt.Sprint(statuses) != "[200 200 429]" || u.count() != 2 || u.last(t).Header.Get("X-Rls") != "ok" {
		t.Fatalf("statuses %v, upstream saw %d (X-Rls %q)", statuses, u.count(), u.last(t).Header.Get("X-Rls"))
	}
	p.do(t, "GET", "/", nil) // no X-Api-Key: that descriptor is left out
	s.mu.Lock()
	first, last := s.seen[0], s.seen[len(s.seen)-1]
	s.mu.Unlock()
	if first != "edge generic_key=api,key=k1 | remote_address=127.0.0.1 | route_name=api" || last != "edge remote_address=127.0.0.1 | route_name=api" {
		t.Errorf("descriptors %q, then %q", first, last)
	}
	if st := p.srv.Stats(); st.GlobalRateLimited != 2 || st.GlobalRateLimitErrors != 0 {
		t.Errorf("global_rate_limited %d, errors %d", st.GlobalRateLimited, st.GlobalRateLimitErrors)
	}
}

// TestGlobalRateLimitHeaders: an OK answer's response_headers_to_add
// reach the client's response (as Envoy adds them), those the header
// rules allow; with headers: always, RateLimit-Policy and RateLimit of
// the descriptor status with the fewest requests left too.
func TestGlobalRateLimitHeaders(t *testing.T) {
	s := &rlServer{limit: 3, limits: map[string]int{"generic_key=wide": 10}}
	addr := serveRLS(t, s)
	u := newUpstream(t, nil)
	for _, headers := range []string{"always", "on_limit"} {
		cfg, err := config.Parse([]byte(fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q}]
rate_limit_service: {address: %q, domain: edge, timeout: 10s}
routes:
  - name: api
    upstream: app
    global_rate_limit:
      headers: %s
      descriptors:
        - entries: [{generic_key: wide}]
        - entries: [{remote_address: true}]
`, u.addr(), addr, headers)))
		if err != nil {
			t.Fatal(err)
		}
		p := startProxy(t, cfg, nil, nil)
		s.mu.Lock()
		clear(s.hits)
		s.mu.Unlock()
		for i := 1; i <= 2; i++ {
			resp, _ := p.do(t, "GET", "/", nil)
			if resp.StatusCode != 200 || resp.Header.Get("X-Quota-Checked") != "yes" || resp.Header.Get("X-Sidecar-Fail-Open") != "" {
				t.Errorf("%s, request %d: %d, X-Quota-Checked %q, X-Sidecar-Fail-Open %q", headers, i, resp.StatusCode,
					resp.Header.Get("X-Quota-Checked"), resp.Header.Get("X-Sidecar-Fail-Open"))
			}
			pol, rl := resp.Header.Values("RateLimit-Policy"), resp.Header.Values("RateLimit")
			want, wantPol := []string(nil), []string(nil)
			if headers == "always" {
				// remote_address: 3 a minute, the tighter.
				wantPol, want = []string{`"global";q=3;w=60`}, []string{`"global";r=` + strconv.Itoa(3-i) + `;t=30`}
			}
			if fmt.Sprint(pol) != fmt.Sprint(wantPol) || fmt.Sprint(rl) != fmt.Sprint(want) {
				t.Errorf("%s, request %d: RateLimit-Policy %q, RateLimit %q; want %q, %q", headers, i, pol, rl, wantPol, want)
			}
		}
	}
}

// TestGlobalRateLimitFailure: a service that does not answer within its
// timeout lets requests through by default and answers 500 with
// failure_mode deny; both counted.
func TestGlobalRateLimitFailure(t *testing.T) {
	addr := serveRLS(t, &rlServer{limit: 100, delay: hangGuard})
	p, u := globalProxy(t, addr, ", timeout: 20ms")
	if resp, _ := p.do(t, "GET", "/", nil); resp.StatusCode != 200 || u.count() != 1 {
		t.Errorf("allow: %d, upstream saw %d", resp.StatusCode, u.count())
	}
	if st := p.srv.Stats(); st.GlobalRateLimitErrors != 1 {
		t.Errorf("errors %d", st.GlobalRateLimitErrors)
	}
	p2, u2 := globalProxy(t, addr, ", timeout: 20ms, failure_mode: deny")
	if resp, _ := p2.do(t, "GET", "/", nil); resp.StatusCode != 500 || u2.count() != 0 {
		t.Errorf("deny: %d, upstream saw %d", resp.StatusCode, u2.count())
	}
	// A service nobody listens on: refused at once.
	gone := testutil.RefusedAddr(t)
	p3, _ := globalProxy(t, gone, "")
	if resp, _ := p3.do(t, "GET", "/", nil); resp.StatusCode != 200 {
		t.Errorf("unreachable service, allow: %d", resp.StatusCode)
	}
}

// TestGlobalRateLimitTLS: rate_limit_service.tls reaches a service over
// TLS (its CA and name checked) and over mTLS (the sidecar's client
// certificate); a service whose certificate another CA signed, or one
// that requires a client certificate the sidecar lacks, is a failed call:
// the failure mode applies and the call is counted.
func TestGlobalRateLimitTLS(t *testing.T) {
	pki := testutil.NewPKI(t, "rls")
	rogue := testutil.NewPKI(t, "rogue")
	srvCert := pki.Server(t, "rls", "rls.example")
	client := pki.Client(t, "sidecar", "sidecar")
	serverTLS := func(mtls bool) grpc.ServerOption {
		c := &tls.Config{Certificates: []tls.Certificate{srvCert.TLS}, MinVersion: tls.VersionTLS12}
		if mtls {
			c.ClientCAs, c.ClientAuth = pki.Pool, tls.RequireAndVerifyClientCert
		}
		return grpc.Creds(credentials.NewTLS(c))
	}
	tlsAddr := serveRLS(t, &rlServer{limit: 1}, serverTLS(false))
	mtlsAddr := serveRLS(t, &rlServer{limit: 1}, serverTLS(true))

	for _, tc := range []struct {
		name, addr, tls string
	}{
		{"tls", tlsAddr, fmt.Sprintf("{ca_file: %q, server_name: rls.example}", pki.CAFile)},
		{"mtls", mtlsAddr, fmt.Sprintf("{ca_file: %q, server_name: rls.example, cert_file: %q, key_file: %q}",
			pki.CAFile, client.CertFile, client.KeyFile)},
	} {
		p, u := globalProxy(t, tc.addr, ", timeout: 5s, tls: "+tc.tls)
		// The service answers: OK once (its request header reaches the
		// upstream), then OVER_LIMIT.
		if resp, _ := p.do(t, "GET", "/", nil); resp.StatusCode != 200 || u.last(t).Header.Get("X-Rls") != "ok" {
			t.Errorf("%s: first request %d, X-Rls %q", tc.name, resp.StatusCode, u.last(t).Header.Get("X-Rls"))
		}
		if resp, _ := p.do(t, "GET", "/", nil); resp.StatusCode != 429 {
			t.Errorf("%s: second request %d, want 429", tc.name, resp.StatusCode)
		}
		if st := p.srv.Stats(); st.GlobalRateLimitErrors != 0 || st.GlobalRateLimited != 1 {
			t.Errorf("%s: errors %d, limited %d", tc.name, st.GlobalRateLimitErrors, st.GlobalRateLimited)
		}
	}

	for _, tc := range []struct {
		name, addr, tls string
	}{
		{"wrong CA", tlsAddr, fmt.Sprintf("{ca_file: %q, server_name: rls.example}", rogue.CAFile)},
		{"wrong name", tlsAddr, fmt.Sprintf("{ca_file: %q, server_name: other.example}", pki.CAFile)},
		{"no client certificate", mtlsAddr, fmt.Sprintf("{ca_file: %q, server_name: rls.example}", pki.CAFile)},
	} {
		p, u := globalProxy(t, tc.addr, ", timeout: 5s, tls: "+tc.tls)
		if resp, _ := p.do(t, "GET", "/", nil); resp.StatusCode != 200 || u.count() != 1 {
			t.Errorf("%s, allow: %d, upstream saw %d", tc.name, resp.StatusCode, u.count())
		}
		if st := p.srv.Stats(); st.GlobalRateLimitErrors != 1 {
			t.Errorf("%s, allow: errors %d, want 1", tc.name, st.GlobalRateLimitErrors)
		}
		p2, u2 := globalProxy(t, tc.addr, ", timeout: 5s, failure_mode: deny, tls: "+tc.tls)
		if resp, _ := p2.do(t, "GET", "/", nil); resp.StatusCode != 500 || u2.count() != 0 {
			t.Errorf("%s, deny: %d, upstream saw %d", tc.name, resp.StatusCode, u2.count())
		}
		if st := p2.srv.Stats(); st.GlobalRateLimitErrors != 1 {
			t.Errorf("%s, deny: errors %d, want 1", tc.name, st.GlobalRateLimitErrors)
		}
	}
}

// TestGlobalRateLimitHeadersBounded: the headers one answer of the rate
// limit service adds are bounded as an agent reply's are by default
// (256 fields, 64KiB of names and values, request and response lists
// together): an answer over the bound is a failed call (failure mode
// applied, counted), nothing of it applied, on OK as on OVER_LIMIT.
func TestGlobalRateLimitHeadersBounded(t *testing.T) {
	many := func(n, size int) []*corev3.HeaderValue {
		var hs []*corev3.HeaderValue
		for i := range n {
			hs = append(hs, &corev3.HeaderValue{Key: fmt.Sprintf("X-Flood-%d", i), Value: strings.Repeat("v", size)})
		}
		return hs
	}
	for _, tc := range []struct {
		name  string
		limit int
		edit  func(*rlsv3.RateLimitResponse)
	}{
		{"OK, 300 response headers", 100, func(r *rlsv3.RateLimitResponse) { r.ResponseHeadersToAdd = many(300, 8) }},
		{"OK, 80KiB of response headers", 100, func(r *rlsv3.RateLimitResponse) { r.ResponseHeadersToAdd = many(5, 16<<10) }},
		{"OK, 300 request headers", 100, func(r *rlsv3.RateLimitResponse) { r.RequestHeadersToAdd = many(300, 8) }},
		{"OVER_LIMIT, 300 response headers", 0, func(r *rlsv3.RateLimitResponse) { r.ResponseHeadersToAdd = many(300, 8) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &rlServer{limit: tc.limit, edit: tc.edit}
			p, u := globalProxy(t, serveRLS(t, s), ", timeout: 10s")
			resp, _ := p.do(t, "GET", "/", nil)
			if resp.StatusCode != 200 || u.count() != 1 {
				t.Errorf("status %d, upstream saw %d; want the failure mode's allow", resp.StatusCode, u.count())
			}
			if resp.Header.Get("X-Flood-0") != "" || (u.count() == 1 && u.last(t).Header.Get("X-Flood-0") != "") {
				t.Error("headers of an answer over the bound were applied")
			}
			if st := p.srv.Stats(); st.GlobalRateLimitErrors != 1 || st.GlobalRateLimited != 0 {
				t.Errorf("errors %d, limited %d; want 1, 0", st.GlobalRateLimitErrors, st.GlobalRateLimited)
			}
		})
	}
	// Within the bound: applied.
	s := &rlServer{limit: 100, edit: func(r *rlsv3.RateLimitResponse) { r.ResponseHeadersToAdd = many(200, 8) }}
	p, _ := globalProxy(t, serveRLS(t, s), ", timeout: 10s")
	if resp, _ := p.do(t, "GET", "/", nil); resp.StatusCode != 200 || resp.Header.Get("X-Flood-199") != "vvvvvvvv" {
		t.Errorf("200 headers within the bound: %d, X-Flood-199 %q", resp.StatusCode, resp.Header.Get("X-Flood-199"))
	}
}
