// Package conformance is the transport-independent test suite of the agent
// conversation of protocol v2. Every transport (UDS, gRPC, reverse
// connections) runs the same table through Run with its own Dial, which
// proves that an agent written against package sdk behaves the same over
// all of them.
package conformance

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// Dial starts an agent serving h over one transport and returns the proxy
// side connected to it, ready (WaitReady done). It registers the cleanup of
// both with t.Cleanup. The proxy side must allow at least 256 requests in
// flight (or queue the rest), must wait 10s or more for a reply and must
// offer the cancellation feature.
type Dial func(t *testing.T, h sdk.Handler) agentmux.Agent

// Case is one conversation of the suite.
type Case struct {
	Name string
	Run  func(t *testing.T, dial Dial)
}

// Cases is the suite, in the order Run runs it.
var Cases = []Case{
	{"Capabilities", testCapabilities},
	{"MaxConcurrentRequests", testMaxConcurrent},
	{"RequestHeadersIntact", testRequestHeadersIntact},
	{"Decisions", testDecisions},
	{"RequestBody", testRequestBody},
	{"ResponsePhase", testResponsePhase},
	{"CancelReachesHandler", testCancelReachesHandler},
	{"HandlerContextContract", testHandlerContext},
	{"LateReplyDiscarded", testLateReply},
	{"ConcurrentInterleaved", testConcurrent},
	{"AgentErrors", testAgentErrors},
	{"InlineBodyNegotiated", testInlineNegotiated},
	{"InlineBodyWhole", testInlineWhole},
	{"InlineBodyConversation", testInlineConversation},
	{"EventTimeout", testEventTimeout},
	{"ClientRequest", testClientRequest},
}

// Run runs every case as a subtest.
func Run(t *testing.T, dial Dial) {
	for _, c := range Cases {
		t.Run(c.Name, func(t *testing.T) { c.Run(t, dial) })
	}
}

// wait bounds every blocking step so that a broken transport fails the
// test instead of hanging it; it is not a performance assertion.
const wait = 10 * time.Second

// handler is an sdk.Handler built from functions; nil ones allow/pass.
type handler struct {
	sdk.Base
	reqHeaders  func(ctx context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error
	reqBody     func(ctx context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error
	respHeaders func(ctx context.Context, m *protocol.ResponseHeaders, d *protocol.Decision) error
	respBody    func(ctx context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error
}

func (h *handler) OnRequestHeaders(ctx context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
	if h.reqHeaders == nil {
		return nil
	}
	return h.reqHeaders(ctx, m, d)
}

func (h *handler) OnRequestBody(ctx context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
	if h.reqBody == nil {
		return h.Base.OnRequestBody(ctx, m, r)
	}
	return h.reqBody(ctx, m, r)
}

func (h *handler) OnResponseHeaders(ctx context.Context, m *protocol.ResponseHeaders, d *protocol.Decision) error {
	if h.respHeaders == nil {
		return nil
	}
	return h.respHeaders(ctx, m, d)
}

func (h *handler) OnResponseBody(ctx context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
	if h.respBody == nil {
		return h.Base.OnResponseBody(ctx, m, r)
	}
	return h.respBody(ctx, m, r)
}

var allCaps = protocol.Capabilities{
	HandlesRequestHeaders:  true,
	HandlesRequestBody:     true,
	HandlesResponseHeaders: true,
	HandlesResponseBody:    true,
	SupportsStreaming:      true,
	SupportsCancellation:   true,
}

func begin(t *testing.T, a agentmux.Agent) *agentmux.Exchange {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	ex, err := a.Begin(agentmux.WaitFor(ctx))
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	return ex
}

func ctxWait() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), wait)
}

func get(t *testing.T, a agentmux.Agent, uri string, hdrs ...string) *protocol.Decision {
	t.Helper()
	ex := begin(t, a)
	defer ex.Finish()
	m := request("GET", uri, hdrs...)
	ctx, cancel := ctxWait()
	defer cancel()
	r, err := ex.RequestHeaders(agentmux.WaitFor(ctx), m)
	if err != nil {
		t.Fatalf("RequestHeaders %s: %v", uri, err)
	}
	if r.Type != protocol.TypeDecision {
		t.Fatalf("RequestHeaders %s: reply type %s", uri, r.Type)
	}
	d := copyDecision(&r.Decision)
	return &d
}

func request(method, uri string, hdrs ...string) *protocol.RequestHeaders {
	m := &protocol.RequestHeaders{Method: []byte(method), URI: []byte(uri)}
	for i := 0; i+1 < len(hdrs); i += 2 {
		m.Headers = m.Headers.Add([]byte(hdrs[i]), []byte(hdrs[i+1]))
	}
	return m
}

// copyDecision detaches a reply's decision from transport buffers.
func copyDecision(d *protocol.Decision) protocol.Decision {
	c := protocol.Decision{
		RequestID:   d.RequestID,
		Kind:        d.Kind,
		NeedsMore:   d.NeedsMore,
		Status:      d.Status,
		Body:        bytes.Clone(d.Body),
		RedirectURL: bytes.Clone(d.RedirectURL),
	}
	for _, h := range d.BlockHeaders {
		c.BlockHeaders = append(c.BlockHeaders, protocol.Header{Name: bytes.Clone(h.Name), Value: bytes.Clone(h.Value)})
	}
	for _, op := range d.RequestHeaderOps {
		c.RequestHeaderOps = append(c.RequestHeaderOps, protocol.HeaderOp{Op: op.Op, Name: bytes.Clone(op.Name), Value: bytes.Clone(op.Value)})
	}
	for _, op := range d.ResponseHeaderOps {
		c.ResponseHeaderOps = append(c.ResponseHeaderOps, protocol.HeaderOp{Op: op.Op, Name: bytes.Clone(op.Name), Value: bytes.Clone(op.Value)})
	}
	cl := func(l [][]byte) [][]byte {
		var o [][]byte
		for _, b := range l {
			o = append(o, bytes.Clone(b))
		}
		return o
	}
	c.Audit = protocol.Audit{
		Tags:        cl(d.Audit.Tags),
		RuleIDs:     cl(d.Audit.RuleIDs),
		ReasonCodes: cl(d.Audit.ReasonCodes),
		Confidence:  d.Audit.Confidence,
		HasConf:     d.Audit.HasConf,
		Custom:      bytes.Clone(d.Audit.Custom),
	}
	return c
}

// op returns the value of the first request header op named name.
func op(d *protocol.Decision, name string) (string, bool) {
	for _, o := range d.RequestHeaderOps {
		if string(o.Name) == name {
			return string(o.Value), true
		}
	}
	return "", false
}

func wantOp(t *testing.T, d *protocol.Decision, name, want string) {
	t.Helper()
	got, ok := op(d, name)
	if !ok {
		t.Errorf("no request header op %q in %s", name, fmtOps(d.RequestHeaderOps))
		return
	}
	if got != want {
		t.Errorf("op %s = %q, want %q", name, got, want)
	}
}

func fmtOps(ops []protocol.HeaderOp) string {
	var b strings.Builder
	for _, o := range ops {
		fmt.Fprintf(&b, "[%s %s=%q]", o.Op, o.Name, o.Value)
	}
	return b.String()
}

func setOp(name, value string) protocol.HeaderOp {
	return protocol.HeaderOp{Op: protocol.HeaderSet, Name: []byte(name), Value: []byte(value)}
}

// ---------------------------------------------------------------------------

func testCapabilities(t *testing.T, dial Dial) {
	caps := allCaps
	caps.MaxConcurrentRequests = 7
	caps.SupportsStreaming = false
	a := dial(t, &handler{Base: sdk.Base{Caps: caps}})
	// The SDK adds supports_inline_body to an agent that handles request
	// bodies, and the proxy offers the feature.
	caps.SupportsInlineBody = true
	// It declares supports_client_request to every proxy that offers it.
	caps.SupportsClientRequest = true
	// The SDK declares supports_protobuf_payloads too; whether it is kept
	// depends on the transport (the UDS and reverse tests run the suite
	// both ways), not on the conversation.
	got := a.Capabilities()
	caps.SupportsProtobufPayloads = got.SupportsProtobufPayloads
	if got != caps {
		t.Fatalf("agent capabilities %+v, want %+v", got, caps)
	}
	ex := begin(t, a)
	defer ex.Finish()
	if got := ex.Capabilities(); got != caps {
		t.Fatalf("exchange capabilities %+v, want %+v", got, caps)
	}
	st := a.Snapshot()
	if !st.Ready || st.Connections < 1 || st.Caps != caps {
		t.Fatalf("snapshot %+v", st)
	}
}

func testMaxConcurrent(t *testing.T, dial Dial) {
	caps := allCaps
	caps.MaxConcurrentRequests = 3
	a := dial(t, &handler{Base: sdk.Base{Caps: caps}})
	// One connection per agent in this test is not guaranteed, so fill
	// every connection: the limit is per connection.
	conns := a.Snapshot().Connections
	var open []*agentmux.Exchange
	for i := 0; i < 3*conns; i++ {
		open = append(open, begin(t, a))
	}
	// The caller gives up after a while (its cancel channel closes).
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	ex, err := a.Begin(agentmux.Wait{Cancel: ctx.Done()})
	cancel()
	if err == nil {
		ex.Finish()
		t.Fatalf("Begin beyond max_concurrent_requests=3 x %d connections succeeded", conns)
	}
	if !errors.Is(err, agentmux.ErrAgentCanceled) && !errors.Is(err, agentmux.ErrAgentOverloaded) {
		t.Fatalf("Begin beyond the limit: %v", err)
	}
	open[0].Finish()
	ex = begin(t, a)
	ex.Finish()
	for _, e := range open[1:] {
		e.Finish()
	}
}

func testRequestHeadersIntact(t *testing.T, dial Dial) {
	h := &handler{Base: sdk.Base{Caps: allCaps}}
	h.reqHeaders = func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
		var accept []string
		var names []string
		for _, f := range m.Headers {
			names = append(names, string(f.Name))
			if string(f.Name) == "accept" {
				accept = append(accept, string(f.Value))
			}
		}
		md := &m.Metadata
		d.RequestHeaderOps = append(d.RequestHeaderOps,
			setOp("x-method", string(m.Method)),
			setOp("x-uri", string(m.URI)),
			setOp("x-has-body", strconv.FormatBool(m.HasBody)),
			setOp("x-host", string(m.Headers.Get("host"))),
			setOp("x-accept", strings.Join(accept, "|")),
			setOp("x-quoted", string(m.Headers.Get("x-quoted"))),
			setOp("x-names", strings.Join(names, ",")),
			setOp("x-client", fmt.Sprintf("%s:%d", md.ClientIP, md.ClientPort)),
			setOp("x-meta", strings.Join([]string{string(md.CorrelationID), string(md.Protocol), string(md.ServerName),
				string(md.RouteID), string(md.UpstreamID), string(md.Traceparent), string(md.Timestamp)}, "|")),
		)
		return nil
	}
	a := dial(t, h)
	ex := begin(t, a)
	defer ex.Finish()
	m := request("POST", "/api/users?id=7&q=%C3%A9",
		"host", "example.com",
		"accept", "*/*",
		"x-quoted", `a "quoted" value \ with ünïcode`,
		"accept", "text/html",
	)
	m.HasBody = true
	m.Metadata = protocol.Metadata{
		CorrelationID: []byte("b9e2"), ClientIP: []byte("10.0.0.9"), ClientPort: 51234,
		Protocol: []byte("HTTP/1.1"), ServerName: []byte("example.com"), RouteID: []byte("default"),
		UpstreamID: []byte("app"), Traceparent: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
		Timestamp: []byte("2026-11-21T10:00:00Z"),
	}
	ctx, cancel := ctxWait()
	defer cancel()
	r, err := ex.RequestHeaders(agentmux.WaitFor(ctx), m)
	if err != nil {
		t.Fatal(err)
	}
	d := copyDecision(&r.Decision)
	if d.Kind != protocol.DecisionAllow || !d.Final() {
		t.Fatalf("decision %s final=%v", d.Kind, d.Final())
	}
	if d.RequestID != ex.RequestID() {
		t.Fatalf("reply for request %d, want %d", d.RequestID, ex.RequestID())
	}
	wantOp(t, &d, "x-method", "POST")
	wantOp(t, &d, "x-uri", "/api/users?id=7&q=%C3%A9")
	wantOp(t, &d, "x-has-body", "true")
	wantOp(t, &d, "x-host", "example.com")
	wantOp(t, &d, "x-accept", "*/*|text/html")
	wantOp(t, &d, "x-quoted", `a "quoted" value \ with ünïcode`)
	wantOp(t, &d, "x-client", "10.0.0.9:51234")
	wantOp(t, &d, "x-meta", "b9e2|HTTP/1.1|example.com|default|app|00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01|2026-11-21T10:00:00Z")
	// Every field arrives; the JSON form may group repeated names.
	names, _ := op(&d, "x-names")
	for _, n := range []string{"host", "accept", "x-quoted"} {
		if !strings.Contains(","+names+",", ","+n+",") {
			t.Errorf("header %q missing at the agent: %q", n, names)
		}
	}
}

func testDecisions(t *testing.T, dial Dial) {
	custom := `{"score":7,"labels":["a","b"]}`
	cases := []struct {
		uri  string
		want protocol.Decision
	}{
		{"/allow", protocol.Decision{
			Kind: protocol.DecisionAllow,
			RequestHeaderOps: []protocol.HeaderOp{
				setOp("x-user", "42"),
				{Op: protocol.HeaderAdd, Name: []byte("x-trace"), Value: []byte("t1")},
				{Op: protocol.HeaderRemove, Name: []byte("cookie")},
			},
			ResponseHeaderOps: []protocol.HeaderOp{
				{Op: protocol.HeaderAdd, Name: []byte("x-frame-options"), Value: []byte("DENY")},
			},
			Audit: protocol.Audit{
				Tags: [][]byte{[]byte("sqli")}, RuleIDs: [][]byte{[]byte("942100"), []byte("942200")},
				Confidence: 0.9, HasConf: true, ReasonCodes: [][]byte{[]byte("R1")}, Custom: []byte(custom),
			},
		}},
		{"/block", protocol.Decision{
			Kind: protocol.DecisionBlock, Status: 451, Body: []byte("denied\n"),
			BlockHeaders: protocol.Headers{{Name: []byte("x-reason"), Value: []byte("policy")}},
		}},
		{"/block-403", protocol.Decision{Kind: protocol.DecisionBlock, Status: 403, Body: []byte("forbidden")}},
		{"/redirect", protocol.Decision{Kind: protocol.DecisionRedirect, Status: 307, RedirectURL: []byte("https://login.example.com/?next=%2Fa")}},
		{"/redirect-path", protocol.Decision{Kind: protocol.DecisionRedirect, Status: 302, RedirectURL: []byte("/login")}},
		{"/allow-ops-only", protocol.Decision{
			Kind:              protocol.DecisionAllow,
			ResponseHeaderOps: []protocol.HeaderOp{setOp("cache-control", "no-store")},
		}},
	}
	byURI := map[string]*protocol.Decision{}
	for i := range cases {
		byURI[cases[i].uri] = &cases[i].want
	}
	h := &handler{Base: sdk.Base{Caps: allCaps}}
	h.reqHeaders = func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
		want := byURI[string(m.URI)]
		if want == nil {
			return errors.New("unknown uri")
		}
		id := d.RequestID
		*d = copyDecision(want)
		d.RequestID = id
		return nil
	}
	a := dial(t, h)
	for _, c := range cases {
		t.Run(strings.TrimPrefix(c.uri, "/"), func(t *testing.T) {
			got := get(t, a, c.uri)
			compareDecision(t, got, &c.want)
		})
	}
}

func compareDecision(t *testing.T, got, want *protocol.Decision) {
	t.Helper()
	if got.Kind != want.Kind || got.Final() != want.Final() || got.Status != want.Status {
		t.Errorf("kind/final/status = %s/%v/%d, want %s/%v/%d", got.Kind, got.Final(), got.Status, want.Kind, want.Final(), want.Status)
	}
	if !bytes.Equal(got.Body, want.Body) || !bytes.Equal(got.RedirectURL, want.RedirectURL) {
		t.Errorf("body/url = %q/%q, want %q/%q", got.Body, got.RedirectURL, want.Body, want.RedirectURL)
	}
	if !sameHeaders(got.BlockHeaders, want.BlockHeaders) {
		t.Errorf("block headers %v, want %v", got.BlockHeaders, want.BlockHeaders)
	}
	if fmtOps(got.RequestHeaderOps) != fmtOps(want.RequestHeaderOps) {
		t.Errorf("request ops %s, want %s", fmtOps(got.RequestHeaderOps), fmtOps(want.RequestHeaderOps))
	}
	if fmtOps(got.ResponseHeaderOps) != fmtOps(want.ResponseHeaderOps) {
		t.Errorf("response ops %s, want %s", fmtOps(got.ResponseHeaderOps), fmtOps(want.ResponseHeaderOps))
	}
	ga, wa := got.Audit, want.Audit
	af := func(a protocol.Audit) string {
		return fmt.Sprintf("tags=%q rules=%q codes=%q conf=%v/%v", a.Tags, a.RuleIDs, a.ReasonCodes, a.HasConf, a.Confidence)
	}
	if af(ga) != af(wa) {
		t.Errorf("audit %s, want %s", af(ga), af(wa))
	}
	if !sameJSON(ga.Custom, wa.Custom) {
		t.Errorf("audit custom %s, want %s", ga.Custom, wa.Custom)
	}
}

// sameHeaders compares as multimaps: the JSON form groups by name.
func sameHeaders(a, b protocol.Headers) bool {
	key := func(h protocol.Headers) map[string][]string {
		m := map[string][]string{}
		for _, f := range h {
			m[string(f.Name)] = append(m[string(f.Name)], string(f.Value))
		}
		return m
	}
	return reflect.DeepEqual(key(a), key(b))
}

func sameJSON(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// chunkData is the deterministic content of body chunk i of a test body:
// every byte value, so that no transport can get away with text-only data.
func chunkData(i int) []byte {
	b := make([]byte, 300+i)
	for j := range b {
		b[j] = byte(j*7 + i)
	}
	return b
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:8])
}

func testRequestBody(t *testing.T, dial Dial) {
	const n = 6
	total := 0
	for i := 0; i < n; i++ {
		total += len(chunkData(i))
	}
	h := &handler{Base: sdk.Base{Caps: allCaps}}
	h.reqHeaders = func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
		d.NeedsMore = true // allow + needs_more: send the body
		return nil
	}
	h.reqBody = func(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
		i := int(m.ChunkIndex)
		if !bytes.Equal(m.Data, chunkData(i)) {
			return fmt.Errorf("chunk %d corrupted", i)
		}
		if m.IsLast != (i == n-1) {
			return fmt.Errorf("chunk %d: is_last=%v", i, m.IsLast)
		}
		if m.TotalSize != int64(total) {
			return fmt.Errorf("chunk %d: total_size=%d", i, m.TotalSize)
		}
		switch i {
		case 0:
			r.NeedMore()
			r.Decision.RequestHeaderOps = append(r.Decision.RequestHeaderOps, setOp("x-sum", sum(m.Data)))
		case 1:
			r.Decision.Kind = protocol.DecisionNeedsMore
			r.Decision.NeedsMore = true
		case 2:
			r.Replace([]byte("redacted\x00\xff"))
		case 3:
			r.Drop()
		case 4:
			r.Pass()
		default:
			if bytes.Contains(m.Data, []byte("evil")) {
				r.Decision.Kind = protocol.DecisionBlock
				r.Decision.Status = 403
			}
			r.Decision.RequestHeaderOps = append(r.Decision.RequestHeaderOps, setOp("x-body", "clean"))
		}
		return nil
	}
	a := dial(t, h)
	ex := begin(t, a)
	defer ex.Finish()
	ctx, cancel := ctxWait()
	defer cancel()
	m := request("POST", "/upload", "content-length", strconv.Itoa(total))
	m.HasBody = true
	r, err := ex.RequestHeaders(agentmux.WaitFor(ctx), m)
	if err != nil {
		t.Fatal(err)
	}
	if r.Decision.Final() {
		t.Fatal("headers decision is final; want needs_more")
	}
	sent := 0
	for i := 0; i < n; i++ {
		data := chunkData(i)
		sent += len(data)
		c := &protocol.BodyChunk{ChunkIndex: uint32(i), Data: data, IsLast: i == n-1, TotalSize: int64(total), Progress: int64(sent)}
		r, err := ex.BodyChunk(agentmux.WaitFor(ctx), protocol.PhaseRequest, c)
		if err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
		switch i {
		case 0:
			if r.Type != protocol.TypeDecision || r.Decision.Final() {
				t.Fatalf("chunk 0: %s final=%v, want needs_more decision", r.Type, r.Decision.Final())
			}
			d := copyDecision(&r.Decision)
			wantOp(t, &d, "x-sum", sum(data))
		case 1:
			if r.Type != protocol.TypeDecision || r.Decision.Final() || r.Decision.Kind != protocol.DecisionNeedsMore {
				t.Fatalf("chunk 1: %s %s final=%v, want needs_more verdict", r.Type, r.Decision.Kind, r.Decision.Final())
			}
		case 2, 3, 4:
			want := map[int]protocol.MutationAction{2: protocol.MutationReplace, 3: protocol.MutationDrop, 4: protocol.MutationPass}[i]
			if r.Type != protocol.TypeBodyMutation {
				t.Fatalf("chunk %d: reply %s, want BodyMutation", i, r.Type)
			}
			mu := &r.Mutation
			if mu.Action != want || mu.ChunkIndex != uint32(i) || mu.Phase != protocol.PhaseRequest {
				t.Fatalf("chunk %d: mutation action=%d index=%d phase=%s, want action=%d", i, mu.Action, mu.ChunkIndex, mu.Phase, want)
			}
			if i == 2 && string(mu.Data) != "redacted\x00\xff" {
				t.Fatalf("chunk 2: replacement %q", mu.Data)
			}
		default:
			if r.Type != protocol.TypeDecision || !r.Decision.Final() || r.Decision.Kind != protocol.DecisionAllow {
				t.Fatalf("last chunk: %s %s final=%v, want final allow", r.Type, r.Decision.Kind, r.Decision.Final())
			}
			d := copyDecision(&r.Decision)
			wantOp(t, &d, "x-body", "clean")
		}
	}
}

func testResponsePhase(t *testing.T, dial Dial) {
	h := &handler{Base: sdk.Base{Caps: allCaps}}
	h.respHeaders = func(_ context.Context, m *protocol.ResponseHeaders, d *protocol.Decision) error {
		if m.StatusCode == 500 {
			d.Kind = protocol.DecisionBlock
			d.Status = 502
			d.Body = []byte("upstream failed")
			return nil
		}
		d.ResponseHeaderOps = append(d.ResponseHeaderOps,
			setOp("x-upstream-status", strconv.Itoa(m.StatusCode)),
			setOp("x-upstream-type", string(m.Headers.Get("content-type"))),
			protocol.HeaderOp{Op: protocol.HeaderRemove, Name: []byte("server")})
		d.NeedsMore = m.HasBody
		return nil
	}
	h.respBody = func(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
		if !m.IsLast {
			r.Replace(bytes.ToUpper(m.Data))
			return nil
		}
		r.Decision.ResponseHeaderOps = append(r.Decision.ResponseHeaderOps, setOp("x-body-seen", string(m.Data)))
		return nil
	}
	a := dial(t, h)
	ctx, cancel := ctxWait()
	defer cancel()

	ex := begin(t, a)
	defer ex.Finish()
	if _, err := ex.RequestHeaders(agentmux.WaitFor(ctx), request("GET", "/page")); err != nil {
		t.Fatal(err)
	}
	rh := &protocol.ResponseHeaders{StatusCode: 200, HasBody: true}
	rh.Headers = rh.Headers.Add([]byte("content-type"), []byte("text/html"))
	rh.Headers = rh.Headers.Add([]byte("server"), []byte("app"))
	r, err := ex.ResponseHeaders(agentmux.WaitFor(ctx), rh)
	if err != nil {
		t.Fatal(err)
	}
	d := copyDecision(&r.Decision)
	want := []protocol.HeaderOp{setOp("x-upstream-status", "200"), setOp("x-upstream-type", "text/html"), {Op: protocol.HeaderRemove, Name: []byte("server")}}
	if fmtOps(d.ResponseHeaderOps) != fmtOps(want) || d.Final() {
		t.Fatalf("response decision ops %s final=%v", fmtOps(d.ResponseHeaderOps), d.Final())
	}
	r, err = ex.BodyChunk(agentmux.WaitFor(ctx), protocol.PhaseResponse, &protocol.BodyChunk{ChunkIndex: 0, Data: []byte("hello"), TotalSize: -1, Progress: -1})
	if err != nil {
		t.Fatal(err)
	}
	if r.Type != protocol.TypeBodyMutation || r.Mutation.Phase != protocol.PhaseResponse || string(r.Mutation.Data) != "HELLO" {
		t.Fatalf("response chunk 0: %s phase=%s data=%q", r.Type, r.Mutation.Phase, r.Mutation.Data)
	}
	r, err = ex.BodyChunk(agentmux.WaitFor(ctx), protocol.PhaseResponse, &protocol.BodyChunk{ChunkIndex: 1, Data: []byte("end"), IsLast: true, TotalSize: -1, Progress: -1})
	if err != nil {
		t.Fatal(err)
	}
	d = copyDecision(&r.Decision)
	if r.Type != protocol.TypeDecision || !d.Final() || fmtOps(d.ResponseHeaderOps) != fmtOps([]protocol.HeaderOp{setOp("x-body-seen", "end")}) {
		t.Fatalf("response last chunk: %s final=%v ops=%s", r.Type, d.Final(), fmtOps(d.ResponseHeaderOps))
	}

	// A block in the response phase.
	ex2 := begin(t, a)
	defer ex2.Finish()
	if _, err := ex2.RequestHeaders(agentmux.WaitFor(ctx), request("GET", "/broken")); err != nil {
		t.Fatal(err)
	}
	r, err = ex2.ResponseHeaders(agentmux.WaitFor(ctx), &protocol.ResponseHeaders{StatusCode: 500})
	if err != nil {
		t.Fatal(err)
	}
	compareDecision(t, &r.Decision, &protocol.Decision{Kind: protocol.DecisionBlock, Status: 502, Body: []byte("upstream failed")})
}

// testHandlerContext holds the handler's context to the context.Context
// contract across many requests: Done returns the same channel on every
// call, a context once done stays done (also while later requests run),
// and what was derived from it in one request (context.WithTimeout,
// context.AfterFunc) ends when that request's context does, exactly once,
// and never because of a later request.
func testHandlerContext(t *testing.T, dial Dial) {
	const n = 200
	type seen struct {
		ctx   context.Context
		done  <-chan struct{}
		child context.Context
		stop  context.CancelFunc
		fired chan struct{} // closed by the AfterFunc
		fires atomic.Int32
	}
	var (
		mu       sync.Mutex
		reqs     []*seen
		problems []string
	)
	report := func(format string, args ...any) {
		mu.Lock()
		if len(problems) < 10 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
		mu.Unlock()
	}
	// check verifies request j's context and what derived from it, once
	// that request's handler has returned (its context ends then, maybe a
	// moment after the reply left); cur is the running handler's context.
	check := func(j int, p *seen, cur context.Context, during string) {
		if p.ctx == cur {
			report("request %d's context is reused %s", j, during)
			return
		}
		select {
		case <-p.done:
		case <-time.After(wait):
			report("request %d's context never ended %s", j, during)
			return
		}
		if p.ctx.Err() == nil || context.Cause(p.ctx) == nil {
			report("request %d's context is live again (err %v, cause %v) %s", j, p.ctx.Err(), context.Cause(p.ctx), during)
			return
		}
		if d := p.ctx.Done(); d != p.done {
			report("request %d's Done channel changed %s", j, during)
		}
		select {
		case <-p.child.Done():
			if !errors.Is(p.child.Err(), context.Canceled) {
				report("request %d's derived context ended with %v %s", j, p.child.Err(), during)
			}
		case <-time.After(wait):
			report("request %d's derived context never ended %s", j, during)
		}
		select {
		case <-p.fired:
		case <-time.After(wait):
			report("request %d's AfterFunc never ran %s", j, during)
		}
	}
	h := &handler{Base: sdk.Base{Caps: allCaps}}
	h.reqHeaders = func(ctx context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
		mu.Lock()
		k := len(reqs)
		prev := append([]*seen(nil), reqs...)
		mu.Unlock()
		during := fmt.Sprintf("during request %d", k)
		if d1, d2 := ctx.Done(), ctx.Done(); d1 != d2 {
			report("request %d: Done returns different channels", k)
		}
		if ctx.Err() != nil {
			report("request %d: context done while its handler starts: %v", k, ctx.Err())
		}
		for j, p := range prev {
			check(j, p, ctx, during)
		}
		s := &seen{ctx: ctx, done: ctx.Done(), fired: make(chan struct{})}
		s.child, s.stop = context.WithTimeout(ctx, time.Hour)
		context.AfterFunc(ctx, func() {
			if s.ctx.Err() == nil {
				report("request %d's AfterFunc ran while its context is live", k)
			}
			if s.fires.Add(1) == 1 {
				close(s.fired)
			} else {
				report("request %d's AfterFunc ran twice", k)
			}
		})
		mu.Lock()
		reqs = append(reqs, s)
		mu.Unlock()
		select {
		case <-s.fired:
			report("request %d's AfterFunc ran while its handler runs", k)
		case <-s.child.Done():
			report("request %d's derived context ended while its handler runs", k)
		default:
		}
		if ctx.Done() != s.done || ctx.Err() != nil {
			report("request %d: context changed while its handler runs", k)
		}
		return nil
	}
	a := dial(t, h)
	for i := 0; i < n; i++ {
		get(t, a, "/ctx")
	}
	mu.Lock()
	all := append([]*seen(nil), reqs...)
	mu.Unlock()
	if len(all) != n {
		t.Fatalf("handler ran %d times, want %d", len(all), n)
	}
	// The last request's context ends once its handler has returned.
	last := all[n-1]
	select {
	case <-last.done:
	case <-time.After(wait):
		t.Fatal("the last request's context never ended")
	}
	for j, p := range all {
		check(j, p, nil, "after all requests")
		if f := p.fires.Load(); f != 1 {
			report("request %d's AfterFunc ran %d times", j, f)
		}
		p.stop()
	}
	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Fatalf("handler context broke the context.Context contract:\n%s", strings.Join(problems, "\n"))
	}
}

func testCancelReachesHandler(t *testing.T, dial Dial) {
	started := make(chan uint64, 1)
	canceled := make(chan error, 1)
	h := &handler{Base: sdk.Base{Caps: allCaps}}
	h.reqHeaders = func(ctx context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
		if string(m.URI) != "/slow" {
			return nil
		}
		started <- m.RequestID
		select {
		case <-ctx.Done():
			canceled <- ctx.Err()
		case <-time.After(wait):
			canceled <- errors.New("handler context never canceled")
		}
		return ctx.Err()
	}
	a := dial(t, h)
	ex := begin(t, a)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := ex.RequestHeaders(agentmux.WaitFor(ctx), request("GET", "/slow"))
		errc <- err
	}()
	select {
	case id := <-started:
		if id != ex.RequestID() {
			t.Errorf("handler saw request %d, want %d", id, ex.RequestID())
		}
	case <-time.After(wait):
		t.Fatal("handler never started")
	}
	cancel() // the client went away
	if err := <-errc; !errors.Is(err, agentmux.ErrAgentCanceled) {
		t.Fatalf("RequestHeaders after cancel: %v, want ErrAgentCanceled", err)
	}
	ex.Finish()
	if err := <-canceled; !errors.Is(err, context.Canceled) {
		t.Fatalf("handler context: %v", err)
	}
	// The connection carries on.
	if d := get(t, a, "/next"); d.Kind != protocol.DecisionAllow {
		t.Fatalf("after cancel: %s", d.Kind)
	}
}

func testLateReply(t *testing.T, dial Dial) {
	caps := allCaps
	caps.SupportsCancellation = false // no CancelRequest: the reply comes anyway
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	h := &handler{Base: sdk.Base{Caps: caps}}
	h.reqHeaders = func(ctx context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
		d.RequestHeaderOps = append(d.RequestHeaderOps, setOp("x-uri", string(m.URI)))
		if string(m.URI) == "/late" {
			started <- struct{}{}
			<-release
			d.Kind = protocol.DecisionBlock
			d.Status = 403
		}
		return nil
	}
	a := dial(t, h)
	late0 := a.Snapshot().Late
	ex := begin(t, a)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := ex.RequestHeaders(agentmux.WaitFor(ctx), request("GET", "/late"))
		errc <- err
	}()
	select {
	case <-started:
	case <-time.After(wait):
		t.Fatal("handler never started")
	}
	cancel()
	if err := <-errc; !errors.Is(err, agentmux.ErrAgentCanceled) {
		t.Fatalf("RequestHeaders: %v, want ErrAgentCanceled", err)
	}
	ex.Finish()
	close(release)
	deadline := time.Now().Add(wait)
	for a.Snapshot().Late == late0 {
		if time.Now().After(deadline) {
			t.Fatal("late reply never counted")
		}
		time.Sleep(2 * time.Millisecond)
	}
	// The late block reached nobody: the next request gets its own answer.
	d := get(t, a, "/after")
	if d.Kind != protocol.DecisionAllow {
		t.Fatalf("next request got %s", d.Kind)
	}
	wantOp(t, d, "x-uri", "/after")
}

func testConcurrent(t *testing.T, dial Dial) {
	const n = 200
	h := &handler{Base: sdk.Base{Caps: allCaps}}
	h.reqHeaders = func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
		if rand.IntN(4) == 0 {
			time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
		}
		d.NeedsMore = true
		d.RequestHeaderOps = append(d.RequestHeaderOps, setOp("x-uri", string(m.URI)), setOp("x-id", string(m.Headers.Get("x-id"))))
		return nil
	}
	h.reqBody = func(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
		if rand.IntN(4) == 0 {
			time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
		}
		if !m.IsLast {
			r.Replace(append([]byte("seen:"), m.Data...))
			return nil
		}
		r.Decision.RequestHeaderOps = append(r.Decision.RequestHeaderOps, setOp("x-last", string(m.Data)))
		if bytes.HasSuffix(m.Data, []byte("7")) {
			r.Decision.Kind = protocol.DecisionBlock
			r.Decision.Status = 403
		}
		return nil
	}
	a := dial(t, h)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- oneConcurrent(a, i)
		}()
	}
	wg.Wait()
	close(errs)
	failed := 0
	for err := range errs {
		if err != nil {
			if failed++; failed <= 5 {
				t.Error(err)
			}
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d requests failed", failed, n)
	}
}

func oneConcurrent(a agentmux.Agent, i int) error {
	ctx, cancel := ctxWait()
	defer cancel()
	ex, err := a.Begin(agentmux.WaitFor(ctx))
	if err != nil {
		return err
	}
	defer ex.Finish()
	uri := "/c/" + strconv.Itoa(i)
	id := strconv.Itoa(i * 31)
	r, err := ex.RequestHeaders(agentmux.WaitFor(ctx), request("POST", uri, "x-id", id))
	if err != nil {
		return fmt.Errorf("%s headers: %w", uri, err)
	}
	d := copyDecision(&r.Decision)
	if v, _ := op(&d, "x-uri"); v != uri {
		return fmt.Errorf("%s: got the decision of %q", uri, v)
	}
	if v, _ := op(&d, "x-id"); v != id {
		return fmt.Errorf("%s: got x-id %q, want %q", uri, v, id)
	}
	data := []byte(fmt.Sprintf("req-%d-chunk-0", i))
	r, err = ex.BodyChunk(agentmux.WaitFor(ctx), protocol.PhaseRequest, &protocol.BodyChunk{ChunkIndex: 0, Data: data, TotalSize: -1, Progress: -1})
	if err != nil {
		return fmt.Errorf("%s chunk 0: %w", uri, err)
	}
	if r.Type != protocol.TypeBodyMutation || string(r.Mutation.Data) != "seen:"+string(data) {
		return fmt.Errorf("%s chunk 0: %s %q", uri, r.Type, r.Mutation.Data)
	}
	last := strconv.Itoa(i)
	r, err = ex.BodyChunk(agentmux.WaitFor(ctx), protocol.PhaseRequest, &protocol.BodyChunk{ChunkIndex: 1, Data: []byte(last), IsLast: true, TotalSize: -1, Progress: -1})
	if err != nil {
		return fmt.Errorf("%s chunk 1: %w", uri, err)
	}
	d = copyDecision(&r.Decision)
	if v, _ := op(&d, "x-last"); v != last {
		return fmt.Errorf("%s chunk 1: got the decision for %q", uri, v)
	}
	wantKind := protocol.DecisionAllow
	if strings.HasSuffix(last, "7") {
		wantKind = protocol.DecisionBlock
	}
	if d.Kind != wantKind {
		return fmt.Errorf("%s: %s, want %s", uri, d.Kind, wantKind)
	}
	return nil
}

func testAgentErrors(t *testing.T, dial Dial) {
	h := &handler{Base: sdk.Base{Caps: allCaps}}
	h.reqHeaders = func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
		switch string(m.URI) {
		case "/fail":
			return errors.New("database down: secret details")
		case "/body":
			d.NeedsMore = true
		}
		return nil
	}
	h.reqBody = func(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
		if m.ChunkIndex == 1 {
			return errors.New("parser failed")
		}
		r.NeedMore()
		return nil
	}
	h.respHeaders = func(_ context.Context, m *protocol.ResponseHeaders, d *protocol.Decision) error {
		return errors.New("response failure")
	}
	a := dial(t, h)
	ctx, cancel := ctxWait()
	defer cancel()
	proto0 := a.Snapshot().Protocol

	ex := begin(t, a)
	_, err := ex.RequestHeaders(agentmux.WaitFor(ctx), request("GET", "/fail"))
	ex.Finish()
	if !errors.Is(err, agentmux.ErrAgentProtocol) {
		t.Fatalf("headers handler error: %v, want ErrAgentProtocol", err)
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("handler's error text reached the proxy: %v", err)
	}

	ex = begin(t, a)
	if _, err := ex.RequestHeaders(agentmux.WaitFor(ctx), request("POST", "/body")); err != nil {
		t.Fatal(err)
	}
	if _, err := ex.BodyChunk(agentmux.WaitFor(ctx), protocol.PhaseRequest, &protocol.BodyChunk{ChunkIndex: 0, Data: []byte("a"), TotalSize: -1, Progress: -1}); err != nil {
		t.Fatal(err)
	}
	_, err = ex.BodyChunk(agentmux.WaitFor(ctx), protocol.PhaseRequest, &protocol.BodyChunk{ChunkIndex: 1, Data: []byte("b"), TotalSize: -1, Progress: -1})
	ex.Finish()
	if !errors.Is(err, agentmux.ErrAgentProtocol) {
		t.Fatalf("body handler error: %v, want ErrAgentProtocol", err)
	}

	ex = begin(t, a)
	if _, err := ex.RequestHeaders(agentmux.WaitFor(ctx), request("GET", "/ok")); err != nil {
		t.Fatal(err)
	}
	_, err = ex.ResponseHeaders(agentmux.WaitFor(ctx), &protocol.ResponseHeaders{StatusCode: 200})
	ex.Finish()
	if !errors.Is(err, agentmux.ErrAgentProtocol) {
		t.Fatalf("response handler error: %v, want ErrAgentProtocol", err)
	}
	if got := a.Snapshot().Protocol - proto0; got != 3 {
		t.Errorf("protocol errors counted: %d, want 3", got)
	}
	// An agent error fails its request only: the connection carries on.
	if d := get(t, a, "/fine"); d.Kind != protocol.DecisionAllow {
		t.Fatalf("after agent errors: %s", d.Kind)
	}
}
