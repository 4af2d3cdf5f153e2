package corazawaf

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

func newHandler(t testing.TB, cfg Config) *Handler {
	t.Helper()
	h, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func reqHeaders(id uint64, method, uri string, body bool, hdr ...string) *protocol.RequestHeaders {
	m := &protocol.RequestHeaders{RequestID: id, Method: []byte(method), URI: []byte(uri), HasBody: body}
	m.Headers = append(m.Headers,
		protocol.Header{Name: []byte("host"), Value: []byte("app.example")},
		protocol.Header{Name: []byte("user-agent"), Value: []byte("curl/8.5.0")},
		protocol.Header{Name: []byte("accept"), Value: []byte("*/*")})
	for i := 0; i+1 < len(hdr); i += 2 {
		m.Headers = append(m.Headers, protocol.Header{Name: []byte(hdr[i]), Value: []byte(hdr[i+1])})
	}
	m.Metadata.ClientIP, m.Metadata.ClientPort, m.Metadata.Protocol = []byte("10.0.0.7"), 40000, []byte("HTTP/1.1")
	return m
}

func respHeaders(id uint64, status int) *protocol.ResponseHeaders {
	return &protocol.ResponseHeaders{RequestID: id, StatusCode: status, HasBody: true,
		Headers: protocol.Headers{{Name: []byte("content-type"), Value: []byte("application/json")}}}
}

// exchange runs one request through h as the SDK would: headers, the
// body in chunks, response headers. It returns the final request-phase
// decision and the response decision (nil when the request was blocked).
func exchange(t testing.TB, h *Handler, id uint64, uri string, body []byte, chunk int) (req, resp *protocol.Decision) {
	ctx := context.Background()
	d := new(protocol.Decision)
	m := reqHeaders(id, "POST", uri, len(body) > 0, "content-type", "application/x-www-form-urlencoded")
	if len(body) == 0 {
		m.Method = []byte("GET")
		m.Headers = m.Headers[:3]
	}
	if err := h.OnRequestHeaders(ctx, m, d); err != nil {
		t.Fatal(err)
	}
	for i := 0; d.Kind == protocol.DecisionAllow && len(body) > 0; i++ {
		n := min(chunk, len(body))
		var r sdk.BodyReply
		if err := h.OnRequestBody(ctx, &protocol.BodyChunk{RequestID: id, ChunkIndex: uint32(i), Data: body[:n], IsLast: n == len(body)}, &r); err != nil {
			t.Fatal(err)
		}
		body = body[n:]
		d = &r.Decision
		if !d.NeedsMore {
			break
		}
	}
	if d.Kind != protocol.DecisionAllow || !h.cfg.InspectResponse {
		return d, nil
	}
	rd := new(protocol.Decision)
	if err := h.OnResponseHeaders(ctx, respHeaders(id, 200), rd); err != nil {
		t.Fatal(err)
	}
	return d, rd
}

func TestLifecycleEveryPathCloses(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxPending = 8
	var logs bytes.Buffer
	zl := zerolog.New(&logs)
	h, err := New(cfg, &zl)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	// Blocked at the request: closed at once.
	d, _ := exchange(t, h, 1, "/?id=1%27%20OR%20%271%27%3D%271", nil, 0)
	if d.Kind != protocol.DecisionBlock || d.Status != 403 {
		t.Fatalf("sqli: %+v", d)
	}
	if got := string(d.BlockHeaders.Get("x-waf-rule-id")); got != "942100" {
		t.Errorf("x-waf-rule-id %q", got)
	}
	if !bytes.Contains(d.Audit.Custom, []byte(`"anomaly_score":`)) || len(d.Audit.RuleIDs) == 0 {
		t.Errorf("audit %s %q", d.Audit.Custom, d.Audit.RuleIDs)
	}
	if h.Stats().Open != 0 {
		t.Fatalf("open after block: %+v", h.Stats())
	}
	if !d.Cache.NoStore {
		t.Error("a header decision does not forbid the proxy's decision cache")
	}

	// Allowed, in three chunks, then its response: closed after the response.
	d, rd := exchange(t, h, 2, "/form", []byte("name=Ada+Lovelace&email=ada%40example.com&x="+strings.Repeat("a", 300)), 100)
	if d.Kind != protocol.DecisionAllow || d.NeedsMore || rd == nil || rd.Kind != protocol.DecisionAllow {
		t.Fatalf("benign: %+v %+v", d, rd)
	}
	if s := h.Stats(); s.Open != 0 || h.Pending() != 0 {
		t.Fatalf("open after response: %+v", s)
	}

	// Blocked in the body's second chunk, the attack split across chunks.
	d, _ = exchange(t, h, 3, "/form", []byte("q=hello&text=%3Cscript%3Ealert(document.cookie)%3C/script%3E"), 20)
	if d.Kind != protocol.DecisionBlock {
		t.Fatalf("xss body: %+v", d)
	}

	// Canceled while handled: closed, no answer needed.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := h.OnRequestHeaders(cctx, reqHeaders(4, "GET", "/", false), new(protocol.Decision)); err != nil {
		t.Fatal(err)
	}
	if err := h.OnRequestHeaders(ctx, reqHeaders(5, "POST", "/", true, "content-type", "text/plain"), new(protocol.Decision)); err != nil {
		t.Fatal(err)
	}
	var r sdk.BodyReply
	if err := h.OnRequestBody(cctx, &protocol.BodyChunk{RequestID: 5, Data: []byte("abc")}, &r); err != nil {
		t.Fatal(err)
	}
	if s := h.Stats(); s.Canceled != 2 || s.Open != 0 {
		t.Fatalf("after cancels: %+v", s)
	}
	// The canceled body's transaction is gone: a late chunk is an error
	// for the proxy's failure policy.
	if err := h.OnRequestBody(ctx, &protocol.BodyChunk{RequestID: 5, Data: []byte("d"), IsLast: true}, &r); !errors.Is(err, ErrNoTransaction) {
		t.Fatalf("chunk after cancel: %v", err)
	}

	// Canceled between events (the client went away while the upstream
	// worked): the proxy's CancelRequest closes it.
	if err := h.OnRequestHeaders(ctx, reqHeaders(6, "GET", "/", false), new(protocol.Decision)); err != nil {
		t.Fatal(err)
	}
	if h.Pending() != 1 {
		t.Fatalf("pending %d, want 1", h.Pending())
	}
	h.OnCancel(6)
	h.OnCancel(6) // a second one, or one for an unknown id, is ignored
	if s := h.Stats(); s.Canceled != 3 || s.Open != 0 || h.Pending() != 0 {
		t.Fatalf("after OnCancel: %+v", s)
	}

	// Abandoned after the request (no response headers ever): evicted
	// past MaxPending, oldest first.
	for i := range 20 {
		if err := h.OnRequestHeaders(ctx, reqHeaders(uint64(100+i), "GET", "/", false), new(protocol.Decision)); err != nil {
			t.Fatal(err)
		}
	}
	if s := h.Stats(); s.Open != 8 || s.Evicted != 12 || h.Pending() != 8 {
		t.Fatalf("after 20 abandoned: %+v pending %d", s, h.Pending())
	}
	// An evicted request's response passes uninspected; a kept one is inspected.
	if err := h.OnResponseHeaders(ctx, respHeaders(100, 200), new(protocol.Decision)); err != nil {
		t.Fatal(err)
	}
	if err := h.OnResponseHeaders(ctx, respHeaders(119, 200), new(protocol.Decision)); err != nil {
		t.Fatal(err)
	}
	if s := h.Stats(); s.Unmatched != 1 || s.Open != 7 {
		t.Fatalf("after responses: %+v", s)
	}

	// Shutdown closes what is left, and refuses new requests.
	_ = h.Close()
	if s := h.Stats(); s.Open != 0 {
		t.Fatalf("after Close: %+v", s)
	}
	if err := h.OnRequestHeaders(ctx, reqHeaders(200, "GET", "/", false), new(protocol.Decision)); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
	if !strings.Contains(logs.String(), `"rule_ids":[942100`) {
		t.Errorf("log: %s", logs.String())
	}
}

func TestPendingExpire(t *testing.T) {
	st := &counters{}
	tb := newTable(100, time.Minute, st, func(e *entry, _ string) { closeEntry(e, st) })
	h := newHandler(t, DefaultConfig())
	now := time.Now()
	for i := range 5 {
		st.open.Add(1)
		tb.put(&entry{id: uint64(i + 1), tx: h.waf.NewTransaction()}, now)
	}
	// A put a TTL later sweeps the five.
	st.open.Add(1)
	tb.put(&entry{id: 99, tx: h.waf.NewTransaction()}, now.Add(time.Minute+time.Second))
	if tb.len() != 1 || st.expired.Load() != 5 || st.open.Load() != 1 {
		t.Fatalf("len %d expired %d open %d", tb.len(), st.expired.Load(), st.open.Load())
	}
	tb.close()
	if st.open.Load() != 0 {
		t.Fatalf("open %d after close", st.open.Load())
	}
}

func TestRateLog(t *testing.T) {
	var buf bytes.Buffer
	l := newRateLog(zerolog.New(&buf), 3)
	now := time.Now()
	n := 0
	for range 10 {
		if ok, _ := l.allow(now); ok {
			n++
		}
	}
	if n != 3 || l.suppressedTotal.Load() != 7 {
		t.Fatalf("allowed %d, suppressed %d; want 3 and 7", n, l.suppressedTotal.Load())
	}
	ok, dropped := l.allow(now.Add(time.Second))
	if !ok || dropped != 7 {
		t.Fatalf("after a second: %v %d", ok, dropped)
	}
}

func TestParanoiaAndThreshold(t *testing.T) {
	// A request with one notice-level anomaly at PL1 passes; raising the
	// paranoia level adds rules; lowering the threshold blocks on less.
	uri := "/?a=" + strconv.Quote("x")
	base := DefaultConfig()
	d, _ := exchange(t, newHandler(t, base), 1, uri, nil, 0)
	if d.Kind != protocol.DecisionAllow {
		t.Fatalf("PL1: %+v", d)
	}
	// "1 AND 1" style probes only PL2 rules see.
	probe := "/?id=" + "1%20AND%20sleep"
	d, _ = exchange(t, newHandler(t, base), 1, probe, nil, 0)
	pl1 := d.Kind
	pl4 := base
	pl4.ParanoiaLevel, pl4.InboundThreshold = 4, 1
	d, _ = exchange(t, newHandler(t, pl4), 1, probe, nil, 0)
	if pl1 != protocol.DecisionAllow || d.Kind != protocol.DecisionBlock {
		t.Fatalf("probe %s: PL1 %v, PL4/threshold 1 %v", probe, pl1, d.Kind)
	}
}

// BenchmarkDecision is the agent's CPU per request: a benign GET with a
// query string, a benign form POST with its body inline, a blocked SQL
// injection, and a 4 KiB form body of one long argument, each through the
// request and response phases; with the @rx pre-filter off (Coraza's
// default) and on (DefaultConfig). cpu-ns/op is the process's
// CPU time (user+system, GC included) per request, less sensitive than
// ns/op to other processes sharing the machine.
func BenchmarkDecision(b *testing.B) {
	long := make([]byte, 4096)
	copy(long, "comment=")
	for i := 8; i < len(long); i++ {
		long[i] = 'a' + byte(i%26)
	}
	cases := []struct {
		name string
		uri  string
		body []byte
	}{
		{"get", "/search?q=blue+running+shoes&page=2", nil},
		{"form-post", "/signup", []byte("name=Ada+Lovelace&email=ada%40example.com&country=UK&agree=on")},
		{"sqli-blocked", "/products?id=1%27%20OR%20%271%27%3D%271", nil},
		{"form-4k-one-arg", "/comment", long},
	}
	for _, prefilter := range []bool{false, true} {
		cfg := DefaultConfig()
		cfg.RxPreFilter = prefilter
		h := newHandler(b, cfg)
		for _, c := range cases {
			b.Run("prefilter="+strconv.FormatBool(prefilter)+"/"+c.name, func(b *testing.B) {
				b.ReportAllocs()
				var id uint64
				cpu := cpuTime()
				for b.Loop() {
					id++
					exchange(b, h, id, c.uri, c.body, 64<<10)
				}
				reportCPU(b, cpu)
				if h.Stats().Open != 0 {
					b.Fatalf("open transactions: %+v", h.Stats())
				}
			})
		}
	}
}

func TestAllowedContentTypes(t *testing.T) {
	body := func(h *Handler) protocol.DecisionKind {
		m := reqHeaders(1, "POST", "/upload", true, "content-type", "application/octet-stream", "content-length", "11")
		d := new(protocol.Decision)
		if err := h.OnRequestHeaders(context.Background(), m, d); err != nil {
			t.Fatal(err)
		}
		var r sdk.BodyReply
		if err := h.OnRequestBody(context.Background(), &protocol.BodyChunk{RequestID: 1, Data: []byte("\x7f\x01binary.."), IsLast: true}, &r); err != nil {
			t.Fatal(err)
		}
		if r.Decision.Kind != protocol.DecisionAllow {
			t.Logf("rules %q", r.Decision.Audit.RuleIDs)
		}
		return r.Decision.Kind
	}
	cfg := DefaultConfig()
	if k := body(newHandler(t, cfg)); k != protocol.DecisionBlock {
		t.Fatalf("octet-stream with CRS's list: %v, want block (920420)", k)
	}
	cfg.AllowedContentTypes = []string{"application/json", "application/octet-stream"}
	if k := body(newHandler(t, cfg)); k != protocol.DecisionAllow {
		t.Fatalf("octet-stream allowed: %v", k)
	}
}

func TestBodyLimit(t *testing.T) {
	cfg := DefaultConfig()
	cfg.BodyLimit = 100
	d, _ := exchange(t, newHandler(t, cfg), 1, "/form", []byte("a="+strings.Repeat("b", 300)), 64)
	if d.Kind != protocol.DecisionBlock || d.Status != 413 {
		t.Fatalf("over the body limit: %+v", d)
	}
}

func TestCollector(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxPending, cfg.LogRate = 2, 1
	h := newHandler(t, cfg)
	for i := range 3 { // the third evicts the first
		if err := h.OnRequestHeaders(context.Background(), reqHeaders(uint64(i+1), "GET", "/?q=%3Cscript%3Ealert(1)%3C/script%3E", false), new(protocol.Decision)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		if err := h.OnRequestHeaders(context.Background(), reqHeaders(uint64(i+10), "GET", "/", false), new(protocol.Decision)); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(h.Collector()); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP corazawaf_flagged_total Requests or responses the rules flagged, by action: blocked, or detected (let through).
# TYPE corazawaf_flagged_total counter
corazawaf_flagged_total{action="blocked"} 3
corazawaf_flagged_total{action="detected"} 0
# HELP corazawaf_log_lines_dropped_total Request log lines dropped by the log rate limit.
# TYPE corazawaf_log_lines_dropped_total counter
corazawaf_log_lines_dropped_total 2
# HELP corazawaf_transactions_closed_early_total Transactions closed before their last event, by reason: canceled (the proxy canceled the request), timeout (the event's deadline passed while the rules ran), expired (pending_ttl), evicted (max_pending).
# TYPE corazawaf_transactions_closed_early_total counter
corazawaf_transactions_closed_early_total{reason="canceled"} 0
corazawaf_transactions_closed_early_total{reason="evicted"} 1
corazawaf_transactions_closed_early_total{reason="expired"} 0
corazawaf_transactions_closed_early_total{reason="timeout"} 0
# HELP corazawaf_transactions_open Transactions open now.
# TYPE corazawaf_transactions_open gauge
corazawaf_transactions_open 2
# HELP corazawaf_transactions_pending Transactions waiting for their request's next event (bounded by max_pending).
# TYPE corazawaf_transactions_pending gauge
corazawaf_transactions_pending 2
`
	if err := promtest.GatherAndCompare(reg, strings.NewReader(want),
		"corazawaf_flagged_total", "corazawaf_log_lines_dropped_total", "corazawaf_transactions_closed_early_total",
		"corazawaf_transactions_open", "corazawaf_transactions_pending"); err != nil {
		t.Fatal(err)
	}
}

// TestSkippedBodyCheckedAtResponse: a request whose body never came (the
// sidecar skipped it) still has its query string checked, at the
// response, and the response is replaced.
func TestSkippedBodyCheckedAtResponse(t *testing.T) {
	h := newHandler(t, DefaultConfig())
	ctx := context.Background()
	m := reqHeaders(1, "POST", "/?id=1%27%20OR%20%271%27%3D%271", true, "content-type", "application/x-www-form-urlencoded", "content-length", "5000000")
	d := new(protocol.Decision)
	if err := h.OnRequestHeaders(ctx, m, d); err != nil || d.Kind != protocol.DecisionAllow {
		t.Fatalf("headers: %v %+v", err, d)
	}
	rd := new(protocol.Decision)
	if err := h.OnResponseHeaders(ctx, respHeaders(1, 200), rd); err != nil {
		t.Fatal(err)
	}
	if rd.Kind != protocol.DecisionBlock || string(rd.BlockHeaders.Get("x-waf-rule-id")) != "942100" ||
		!bytes.Contains(rd.Audit.Custom, []byte(`"phase":"request"`)) {
		t.Fatalf("response decision %+v %s", rd, rd.Audit.Custom)
	}
	if h.Stats().Open != 0 {
		t.Fatalf("open %+v", h.Stats())
	}
}
