package dataplane_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// limitProxy serves one route with rate_limit (a YAML flow mapping) to a
// plain upstream.
func limitProxy(t testing.TB, limit string, trust bool, agents map[string]string) (*proxy, *upstream) {
	t.Helper()
	u := newUpstream(t, nil)
	agentsYAML, chain := "agents: []\n", ""
	inst := map[string]agentmux.Agent{}
	for name, path := range agents {
		agentsYAML = fmt.Sprintf("agents: [{name: %s, transport: uds, address: %q}]\n", name, path)
		chain = name
		inst[name] = udsAgent(t, name, path, nil)
	}
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0", trust_forwarded: %v}]
upstreams: [{name: app, address: %q}]
%sroutes:
  - {name: limited, upstream: app, agents: [%s], rate_limit: %s}
`, trust, u.addr(), agentsYAML, chain, limit)))
	if err != nil {
		t.Fatal(err)
	}
	return startProxy(t, cfg, inst, nil), u
}

// countdown reports whether got, a count of seconds that was want at
// start, is want less at most the whole seconds gone since: exact on a
// quick machine, and a loaded one may take seconds between requests.
func countdown(got, want int, start time.Time) bool {
	late := int(time.Since(start) / time.Second)
	return got <= want && got >= want-late
}

// TestRateLimitExact: a bucket of 5 per minute lets exactly 5 requests
// through; the rest get 429 with Retry-After (the 12 s until a token is
// back), RateLimit-Policy and RateLimit, and never reach the upstream.
func TestRateLimitExact(t *testing.T) {
	p, u := limitProxy(t, `{requests: 5, period: 1m}`, false, nil)
	start := time.Now()
	allowed, limited := 0, 0
	for i := 0; i < 12; i++ {
		resp, body := p.do(t, "GET", "/x", nil)
		switch resp.StatusCode {
		case 200:
			allowed++
		case 429:
			limited++
			ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
			// Exact unless the machine took over a second between the
			// first request and this one.
			if err != nil || !countdown(ra, 12, start) {
				t.Errorf("Retry-After %q, want 12", resp.Header.Get("Retry-After"))
			}
			if got := resp.Header.Get("RateLimit-Policy"); got != `"limited";q=5;w=60` {
				t.Errorf("RateLimit-Policy %q", got)
			}
			if got := resp.Header.Get("RateLimit"); got != `"limited";r=0;t=`+resp.Header.Get("Retry-After") {
				t.Errorf("RateLimit %q", got)
			}
			if body != "too many requests" {
				t.Errorf("body %q", body)
			}
		default:
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if allowed != 5 || limited != 7 || u.count() != 5 {
		t.Fatalf("%d allowed, %d limited, upstream saw %d; want 5, 7, 5", allowed, limited, u.count())
	}
	if st := p.srv.Stats(); st.RateLimited != 7 {
		t.Errorf("rate_limited %d", st.RateLimited)
	}
}

// TestRateLimitKeys: per-header and per-client buckets; with
// trust_forwarded the client is the last X-Forwarded-For entry, without
// it the connection's address whatever the header says.
func TestRateLimitKeys(t *testing.T) {
	count := func(p *proxy, hdr ...string) int {
		ok := 0
		for i := 0; i < 4; i++ {
			if resp, _ := p.do(t, "GET", "/", nil, hdr...); resp.StatusCode == 200 {
				ok++
			}
		}
		return ok
	}
	p, _ := limitProxy(t, `{requests: 2, period: 1h, key: header, header: X-Api-Key}`, false, nil)
	if a, b, none := count(p, "X-Api-Key", "a"), count(p, "X-Api-Key", "b"), count(p); a != 2 || b != 2 || none != 2 {
		t.Errorf("per header: a %d, b %d, none %d; want 2 each", a, b, none)
	}
	p, _ = limitProxy(t, `{requests: 2, period: 1h, key: client_ip}`, true, nil)
	if a, b := count(p, "X-Forwarded-For", "10.0.0.9, 192.0.2.1"), count(p, "X-Forwarded-For", "10.0.0.9, 192.0.2.2"); a != 2 || b != 2 {
		t.Errorf("trusted X-Forwarded-For: %d and %d, want 2 each", a, b)
	}
	p, _ = limitProxy(t, `{requests: 2, period: 1h, key: client_ip}`, false, nil)
	if a, b := count(p, "X-Forwarded-For", "192.0.2.1"), count(p, "X-Forwarded-For", "192.0.2.2"); a+b != 2 {
		t.Errorf("untrusted X-Forwarded-For: %d + %d allowed, want 2 (one client)", a, b)
	}
	p, _ = limitProxy(t, `{requests: 1, period: 1h, key: method_path}`, false, nil)
	if a, b := count(p), count(p, "X-Other", "1"); a != 1 || b != 0 {
		t.Errorf("method_path: %d then %d allowed, want 1 then 0 (one method and path)", a, b)
	}
}

// TestRateLimitStage: before_agents refuses before the agent is asked;
// after_agents lets the agent see (and block) the request first.
func TestRateLimitStage(t *testing.T) {
	for _, stage := range []string{"before_agents", "after_agents"} {
		seen := make(chan struct{}, 16)
		agent := serveAgent(t, &agentFuncs{Base: sdk.Base{Caps: headersOnly()}, reqHeaders: func(context.Context, *protocol.RequestHeaders, *protocol.Decision) error {
			seen <- struct{}{}
			return nil
		}})
		p, _ := limitProxy(t, `{requests: 1, period: 1h, stage: `+stage+`}`, false, map[string]string{"a": agent})
		for i := 0; i < 3; i++ {
			p.do(t, "GET", "/", nil)
		}
		want := 1
		if stage == "after_agents" {
			want = 3
		}
		if len(seen) != want {
			t.Errorf("%s: the agent saw %d requests, want %d", stage, len(seen), want)
		}
	}
}

// limitBenchConfig is one route with a local limit (or none) for the
// allocation gate and the benchmark.
const limitBenchConfig = `
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: {{.Upstream}}}]
routes:
  - name: main
    upstream: app
{{- with .Limit}}
    rate_limit: {{.}}
{{- end}}
`

// TestAllocsRateLimited: a proxied request through a route with a local
// limit, keyed by client address, allocates nothing.
func TestAllocsRateLimited(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, limit := range []string{`{requests: 1000000000, key: client_ip}`, `{requests: 1000000000}`, `{requests: 1000000000, key: method_path}`,
		`{requests: 1000000000, key: client_ip, headers: always}`} {
		up := fastUpstream(t)
		p := startProxy(t, configText(t, limitBenchConfig, map[string]any{"Upstream": up, "Limit": limit}), nil, nil)
		req := fasthttp.AcquireRequest()
		req.SetRequestURI("http://x/alloc")
		do := steadyRequest(t, p.addr, req)
		if n := testing.AllocsPerRun(500, do); n > 0 {
			t.Errorf("%s: %.2f allocations per request, want 0", limit, n)
		}
	}
}

// BenchmarkProxyRateLimit measures the CPU time per proxied request
// (client, proxy and upstream in this process: getrusage) without a
// limit and with a local limit keyed by client address, in one run.
func BenchmarkProxyRateLimit(b *testing.B) {
	for _, tc := range []struct{ name, limit string }{
		{"none", ""},
		{"client_ip", `{requests: 1000000000, key: client_ip}`},
		{"none_again", ""},
		{"client_ip_again", `{requests: 1000000000, key: client_ip}`},
	} {
		b.Run(tc.name, func(b *testing.B) {
			up := fastUpstream(b)
			p := startProxy(b, configText(b, limitBenchConfig, map[string]any{"Upstream": up, "Limit": tc.limit}), nil, nil)
			hc := &fasthttp.HostClient{Addr: p.addr, MaxConns: 64, ReadTimeout: 5 * time.Second}
			var ru0, ru1 syscall.Rusage
			b.ReportAllocs()
			b.SetParallelism(4)
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				req := fasthttp.AcquireRequest()
				resp := fasthttp.AcquireResponse()
				req.SetRequestURI("http://x/bench")
				for pb.Next() {
					if err := hc.Do(req, resp); err != nil || resp.StatusCode() != http.StatusOK {
						b.Errorf("%v %d", err, resp.StatusCode())
						return
					}
				}
			})
			b.StopTimer()
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
			cpu := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) / time.Duration(b.N)
			b.ReportMetric(float64(cpu.Nanoseconds()), "cpu-ns/op")
		})
	}
}

// TestRateLimitHeadersAlways: with headers: always the responses to
// allowed requests carry RateLimit-Policy and RateLimit with the
// bucket's remaining requests and the seconds until it is full again (a
// listener's limit and a route's, one field each); with the default
// on_limit only the 429 does.
func TestRateLimitHeadersAlways(t *testing.T) {
	u := newUpstream(t, nil)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
listeners: [{name: pub, address: "127.0.0.1:0", rate_limit: {requests: 100, period: 1h, key: client_ip, headers: always}}]
upstreams: [{name: app, address: %q}]
routes:
  - {name: a, upstream: app, path_prefix: /a, rate_limit: {requests: 3, period: 1m, headers: always}}
  - {name: b, upstream: app, path_prefix: /b, rate_limit: {requests: 3, period: 1m}}
`, u.addr())))
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, cfg, nil, nil)
	start := time.Now()
	// t: the bucket is full again i·20 s after the first request (one
	// token per 20 s), less a second if the machine took that long.
	within := func(got string, prefix string, want int) bool {
		rest, ok := strings.CutPrefix(got, prefix)
		n, err := strconv.Atoi(rest)
		return ok && err == nil && countdown(n, want, start)
	}
	for i := 1; i <= 3; i++ {
		resp, _ := p.do(t, "GET", "/a", nil)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
		pol, rl := resp.Header.Values("RateLimit-Policy"), resp.Header.Values("RateLimit")
		if len(pol) != 2 || pol[0] != `"pub";q=100;w=3600` || pol[1] != `"a";q=3;w=60` || len(rl) != 2 ||
			!within(rl[0], `"pub";r=`+strconv.Itoa(100-i)+`;t=`, i*36) || !within(rl[1], `"a";r=`+strconv.Itoa(3-i)+`;t=`, i*20) {
			t.Errorf("request %d: RateLimit-Policy %q, RateLimit %q", i, pol, rl)
		}
	}
	resp, _ := p.do(t, "GET", "/a", nil)
	if rl := resp.Header.Values("RateLimit"); resp.StatusCode != 429 || len(rl) != 2 || rl[0] != `"pub";r=96;t=144` && rl[0] != `"pub";r=96;t=143` ||
		!strings.HasPrefix(rl[1], `"a";r=0;t=`) {
		t.Errorf("4th: %d, RateLimit %q (the listener's allowed it, the route's refused it)", resp.StatusCode, rl)
	}
	// Route b: on_limit (the default); only the listener's fields.
	resp, _ = p.do(t, "GET", "/b", nil)
	if pol := resp.Header.Values("RateLimit-Policy"); resp.StatusCode != 200 || len(pol) != 1 || pol[0] != `"pub";q=100;w=3600` {
		t.Errorf("route without headers: always: %d, RateLimit-Policy %q", resp.StatusCode, pol)
	}
}

// TestRateLimitListenerAndReload: a listener's limit counts the requests
// of every route (and of none); a reload that keeps a limit keeps its
// buckets, one that changes it starts afresh.
func TestRateLimitListenerAndReload(t *testing.T) {
	u := newUpstream(t, nil)
	doc := func(requests int) *config.Config {
		cfg, err := config.Parse([]byte(fmt.Sprintf(`
listeners: [{name: pub, address: "127.0.0.1:0", rate_limit: {requests: %d, period: 1h}}]
upstreams: [{name: app, address: %q}]
routes:
  - {name: a, upstream: app, path_prefix: /a, rate_limit: {requests: 2, period: 1h}}
  - {name: b, upstream: app, path_prefix: /b}
`, requests, u.addr())))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	p := startProxy(t, doc(4), nil, nil)
	status := func(path string) int {
		resp, _ := p.do(t, "GET", path, nil)
		return resp.StatusCode
	}
	got := []int{status("/a"), status("/a"), status("/a"), status("/b"), status("/b"), status("/b")}
	// /a: 2 by the route (the third refused by the route, still one of
	// the listener's 4); /b: the listener's 4th, then refused.
	if fmt.Sprint(got) != "[200 200 429 200 429 429]" {
		t.Fatalf("statuses %v", got)
	}
	resp, _ := p.do(t, "GET", "/b", nil)
	if resp.Header.Get("RateLimit-Policy") != `"pub";q=4;w=3600` {
		t.Errorf("listener policy %q", resp.Header.Get("RateLimit-Policy"))
	}
	if by := p.srv.Stats().RateLimitedBy; by["route/a"] != 1 || by["listener/pub"] != 3 || len(by) != 2 {
		t.Errorf("rate_limited_by %v, want route/a 1, listener/pub 3", by)
	}
	if err := p.srv.Swap(doc(4), nil); err != nil {
		t.Fatal(err)
	}
	if s := status("/b"); s != 429 {
		t.Errorf("after a reload that kept the limit: %d, want 429", s)
	}
	if err := p.srv.Swap(doc(5), nil); err != nil {
		t.Fatal(err)
	}
	if s := status("/b"); s != 200 {
		t.Errorf("after a reload that changed the limit: %d, want 200", s)
	}
}

// TestRateLimitKeysEvictedCounted: a key flood past max_keys makes the
// limit drop keys, and the drops are counted per limit (Stats and the
// sidecar_rate_limit_keys_evicted_total metric read them).
func TestRateLimitKeysEvictedCounted(t *testing.T) {
	p, _ := limitProxy(t, `{requests: 5, period: 1h, key: header, header: X-Api-Key, max_keys: 64}`, false, nil)
	const keys = 400
	for i := range keys {
		if resp, _ := p.do(t, "GET", "/", nil, "X-Api-Key", strconv.Itoa(i)); resp.StatusCode != 200 {
			t.Fatalf("key %d: status %d, want 200 (each key's first request)", i, resp.StatusCode)
		}
	}
	// At most max_keys keys are held, so at least keys-max_keys were dropped.
	if n := p.srv.Stats().RateLimitKeysEvictedBy["route/limited"]; n < keys-64 || n > keys {
		t.Errorf("keys evicted %d after %d distinct keys at max_keys 64, want %d..%d", n, keys, keys-64, keys)
	}
}
