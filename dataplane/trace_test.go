package dataplane_test

import (
	"context"
	"encoding/hex"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

const (
	inTrace  = "0af7651916cd43dd8448eb211c80319c"
	inParent = "b7ad6b7169203331"
	inTP     = "00-" + inTrace + "-" + inParent + "-01"
)

// traceSetup runs one agent that records the traceparent of its request
// metadata, an upstream, and the proxy with the tracing settings of mod.
func traceSetup(t *testing.T, mod func(*config.Tracing)) (*proxy, *upstream, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var seen []string
	h := &agentFuncs{Base: sdk.Base{Caps: headersOnly()}, reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, _ *protocol.Decision) error {
		mu.Lock()
		seen = append(seen, string(m.Metadata.Traceparent))
		mu.Unlock()
		return nil
	}}
	path := serveAgent(t, h)
	u := newUpstream(t, nil)
	cfg := configText(t, oneAgentConfig, map[string]any{
		"Upstream": u.addr(), "Chain": "a", "Agents": map[string]agentSpec{"a": {Path: path}},
	})
	if mod != nil {
		mod(&cfg.Tracing)
	}
	a := udsAgent(t, "a", path, func(c *udsclient.Config) { c.MessageTimeout = hangGuard })
	p := startProxy(t, cfg, map[string]agentmux.Agent{"a": a}, nil)
	return p, u, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
}

// validTP reports whether v is a version 00 traceparent.
func validTP(v string) bool {
	p := strings.Split(v, "-")
	return len(v) == 55 && len(p) == 4 && p[0] == "00" && len(p[1]) == 32 && len(p[2]) == 16 && len(p[3]) == 2 &&
		p[1] != strings.Repeat("0", 32) && p[2] != strings.Repeat("0", 16) && p[1] == strings.ToLower(p[1]) && p[2] == strings.ToLower(p[2])
}

// TestTraceparentPropagated: a valid traceparent and its tracestate reach
// the upstream unchanged, and the agent sees the traceparent.
func TestTraceparentPropagated(t *testing.T) {
	p, u, seen := traceSetup(t, nil)
	resp, _ := p.do(t, "GET", "/", nil, "traceparent", inTP, "tracestate", "rojo=00f067aa0ba902b7")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	got := u.last(t).Header
	if got.Get("traceparent") != inTP || got.Get("tracestate") != "rojo=00f067aa0ba902b7" {
		t.Fatalf("upstream got %q / %q", got.Get("traceparent"), got.Get("tracestate"))
	}
	if s := seen(); len(s) != 1 || s[0] != inTP {
		t.Fatalf("agent saw %q", s)
	}
	if st := p.srv.Stats(); st.TraceInvalid != 0 || st.TraceGenerated != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestTraceparentMalformedReplaced: with generate on, a malformed
// traceparent is replaced by a fresh one (its tracestate dropped), and a
// request without one gets one; the agent and the upstream see the same.
func TestTraceparentMalformedReplaced(t *testing.T) {
	p, u, seen := traceSetup(t, func(tc *config.Tracing) { tc.Generate = true })
	bad := "00-" + strings.ToUpper(inTrace) + "-" + inParent + "-01"
	p.do(t, "GET", "/", nil, "traceparent", bad, "tracestate", "rojo=1")
	got := u.last(t).Header
	tp := got.Get("traceparent")
	if !validTP(tp) || strings.Contains(tp, strings.ToLower(inTrace)) || got.Get("tracestate") != "" {
		t.Fatalf("upstream got %q / %q", tp, got.Get("tracestate"))
	}
	if s := seen(); len(s) != 1 || s[0] != tp {
		t.Fatalf("agent saw %q, upstream %q", s, tp)
	}
	p.do(t, "GET", "/", nil)
	tp2 := u.last(t).Header.Get("traceparent")
	if !validTP(tp2) || tp2[3:35] == tp[3:35] {
		t.Fatalf("generated %q after %q", tp2, tp)
	}
	// Two traceparent headers are malformed too.
	p.do(t, "GET", "/", nil, "traceparent", inTP, "traceparent", inTP)
	if tp3 := u.last(t).Header.Values("traceparent"); len(tp3) != 1 || tp3[0] == inTP || !validTP(tp3[0]) {
		t.Fatalf("upstream got %q", tp3)
	}
	if st := p.srv.Stats(); st.TraceInvalid != 2 || st.TraceGenerated != 3 {
		t.Fatalf("invalid %d generated %d, want 2 and 3", st.TraceInvalid, st.TraceGenerated)
	}
}

// TestTraceparentMalformedRemoved: with generate off, a malformed
// traceparent is removed and none is made; a bad tracestate next to a
// good traceparent goes alone.
func TestTraceparentMalformedRemoved(t *testing.T) {
	p, u, seen := traceSetup(t, nil)
	p.do(t, "GET", "/", nil, "traceparent", "00-"+inTrace+"-"+inParent+"-01-extra", "tracestate", "rojo=1")
	if got := u.last(t).Header; got.Get("traceparent") != "" || got.Get("tracestate") != "" {
		t.Fatalf("upstream got %q / %q", got.Get("traceparent"), got.Get("tracestate"))
	}
	p.do(t, "GET", "/", nil, "traceparent", inTP, "tracestate", "Bad=1")
	if got := u.last(t).Header; got.Get("traceparent") != inTP || got.Get("tracestate") != "" {
		t.Fatalf("upstream got %q / %q", got.Get("traceparent"), got.Get("tracestate"))
	}
	if s := seen(); len(s) != 2 || s[0] != "" || s[1] != inTP {
		t.Fatalf("agent saw %q", s)
	}
	if st := p.srv.Stats(); st.TraceInvalid != 1 || st.TracestateInvalid != 1 || st.TraceGenerated != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// collector is an in-test OTLP trace collector on a real gRPC socket.
type collector struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []*tracepb.Span
	addr  string
}

func (c *collector) Export(_ context.Context, r *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range r.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			c.spans = append(c.spans, ss.Spans...)
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (c *collector) got() []*tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*tracepb.Span(nil), c.spans...)
}

func startCollector(t *testing.T) *collector { return startCollectorTB(t) }

func startCollectorTB(t testing.TB) *collector {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{addr: ln.Addr().String()}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, c)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return c
}

// TestSpansExported: a sampled request's spans (request, agent phase,
// upstream) reach an OTLP collector in the caller's trace, and the
// upstream's traceparent names the sidecar's upstream span as parent.
func TestSpansExported(t *testing.T) {
	col := startCollector(t)
	p, u, seen := traceSetup(t, func(tc *config.Tracing) {
		tc.OTLP.Endpoint = col.addr
		tc.OTLP.Insecure = true
	})
	resp, _ := p.do(t, "GET", "/x", nil, "traceparent", inTP)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	upTP := u.last(t).Header.Get("traceparent")
	if !validTP(upTP) || upTP[3:35] != inTrace || upTP[36:52] == inParent || upTP[53:] != "01" {
		t.Fatalf("upstream traceparent %q", upTP)
	}
	if s := seen(); len(s) != 1 || s[0] != upTP {
		t.Fatalf("agent saw %q, upstream %q", s, upTP)
	}
	var spans []*tracepb.Span
	testutil.WaitFor(t, "three spans at the collector", func() bool {
		spans = col.got()
		return len(spans) >= 3
	})
	byKind := map[tracepb.Span_SpanKind]*tracepb.Span{}
	for _, s := range spans {
		if hex.EncodeToString(s.TraceId) != inTrace {
			t.Fatalf("span %q in trace %x", s.Name, s.TraceId)
		}
		byKind[s.Kind] = s
	}
	server, client, agent := byKind[tracepb.Span_SPAN_KIND_SERVER], byKind[tracepb.Span_SPAN_KIND_CLIENT], byKind[tracepb.Span_SPAN_KIND_INTERNAL]
	if server == nil || client == nil || agent == nil {
		t.Fatalf("spans %v", spans)
	}
	if hex.EncodeToString(server.ParentSpanId) != inParent {
		t.Errorf("request span's parent %x, want the caller's %s", server.ParentSpanId, inParent)
	}
	if hex.EncodeToString(client.SpanId) != upTP[36:52] || string(client.ParentSpanId) != string(server.SpanId) {
		t.Errorf("upstream span %x (parent %x), upstream saw %s", client.SpanId, client.ParentSpanId, upTP)
	}
	if string(agent.ParentSpanId) != string(server.SpanId) || agent.Name != "agents request_headers" {
		t.Errorf("agent span %q parent %x", agent.Name, agent.ParentSpanId)
	}
	if client.StartTimeUnixNano < server.StartTimeUnixNano || client.EndTimeUnixNano > server.EndTimeUnixNano {
		t.Errorf("upstream span outside the request span")
	}
	// The collector has the spans before the exporter hears back.
	testutil.WaitFor(t, "the export counted", func() bool { return p.srv.TracingStats().Exported >= 3 })
	if st := p.srv.TracingStats(); st.Dropped != 0 || st.Failed != 0 {
		t.Errorf("tracing stats %+v", st)
	}
	// An unsampled caller is followed: no spans, traceparent unchanged.
	before := len(col.got())
	unsampled := "00-" + inTrace + "-" + inParent + "-00"
	p.do(t, "GET", "/", nil, "traceparent", unsampled)
	if got := u.last(t).Header.Get("traceparent"); got != unsampled {
		t.Fatalf("unsampled traceparent became %q", got)
	}
	p.do(t, "GET", "/", nil, "traceparent", inTP) // a sampled one after it
	testutil.WaitFor(t, "the next sampled request's spans", func() bool { return len(col.got()) >= before+3 })
	servers := 0
	for _, s := range col.got()[before:] {
		if s.Kind == tracepb.Span_SPAN_KIND_SERVER {
			servers++
		}
	}
	if servers != 1 {
		t.Fatalf("%d request spans after the unsampled and the sampled request, want 1", servers)
	}
}

// TestTraceparentLaterVersionNormalised: a traceparent of a later version
// is valid, but what follows its flags is the client's: the agents and
// the upstream get it as version 00 (same trace, parent and sampled
// flag), never the client's tail; a 1,500-member tracestate (with 2,000
// empty ones) is dropped.
func TestTraceparentLaterVersionNormalised(t *testing.T) {
	p, u, seen := traceSetup(t, nil)
	tail := "-" + strings.Repeat("x", 4000)
	p.do(t, "GET", "/", nil, "traceparent", "cc-"+inTrace+"-"+inParent+"-03"+tail,
		"tracestate", strings.Repeat("a=1,", 1500)+strings.Repeat(",", 2000))
	got := u.last(t).Header
	if tp := got.Values("traceparent"); len(tp) != 1 || tp[0] != inTP {
		t.Fatalf("upstream got traceparent %.80q, want %q", tp, inTP)
	}
	if ts := got.Get("tracestate"); ts != "" {
		t.Fatalf("upstream got a %d-byte tracestate", len(ts))
	}
	if s := seen(); len(s) != 1 || s[0] != inTP {
		t.Fatalf("agent saw %.80q", s)
	}
}

// TestSpanExportSurvivesHostileStrings: a sampled request whose decoded
// path and request id are not UTF-8 (and far longer than a span needs)
// still has its spans exported, cut and made valid, and so do the
// requests batched with it.
func TestSpanExportSurvivesHostileStrings(t *testing.T) {
	col := startCollector(t)
	p, _, _ := traceSetup(t, func(tc *config.Tracing) {
		tc.OTLP.Endpoint = col.addr
		tc.OTLP.Insecure = true
	})
	long := "/%FF%FE" + strings.Repeat("a", 4000)
	p.do(t, "GET", long, nil, "traceparent", inTP, "X-Request-Id", "id-\xff")
	p.do(t, "GET", "/ok", nil, "traceparent", inTP)
	paths := map[string]bool{}
	testutil.WaitFor(t, "both request spans at the collector", func() bool {
		for _, s := range col.got() {
			if s.Kind != tracepb.Span_SPAN_KIND_SERVER {
				continue
			}
			for _, a := range s.Attributes {
				if a.Key == "url.path" {
					paths[a.Value.GetStringValue()] = true
				}
			}
		}
		return len(paths) >= 2
	})
	for path := range paths {
		if len(path) > 1024 || !utf8.ValidString(path) {
			t.Errorf("exported path of %d bytes (valid UTF-8: %v)", len(path), utf8.ValidString(path))
		}
	}
	if !paths["/ok"] {
		t.Errorf("paths %v", paths)
	}
}
