package sdk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
)

// wireSender keeps what the dispatcher sends, as the proxy would read it.
type wireSender struct {
	out chan sent
}

type sent struct {
	t       protocol.MsgType
	payload []byte
	errText string
}

func (s *wireSender) Send(_ context.Context, m protocol.Message) error {
	b, err := m.AppendJSON(nil)
	if err != nil {
		return err
	}
	s.out <- sent{t: m.MsgType(), payload: b}
	return nil
}

func (s *wireSender) SendError(_ uint64, reason string) error {
	s.out <- sent{errText: reason}
	return nil
}

func (s *wireSender) next(t *testing.T) sent {
	t.Helper()
	select {
	case x := <-s.out:
		return x
	case <-time.After(10 * time.Second):
		t.Fatal("no reply")
	}
	return sent{}
}

// inlineHandler records the calls it gets and answers with the given
// functions.
type inlineHandler struct {
	Base
	calls   []string
	headers func(*protocol.RequestHeaders, *protocol.Decision)
	body    func(*protocol.BodyChunk, *BodyReply) error
}

func (h *inlineHandler) OnRequestHeaders(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
	h.calls = append(h.calls, "headers")
	if h.headers != nil {
		h.headers(m, d)
	}
	return nil
}

func (h *inlineHandler) OnRequestBody(_ context.Context, m *protocol.BodyChunk, r *BodyReply) error {
	h.calls = append(h.calls, fmt.Sprintf("body:%d:%d:%s:%v:%d", m.RequestID, m.ChunkIndex, m.Data, m.IsLast, m.TotalSize))
	if h.body != nil {
		return h.body(m, r)
	}
	r.Pass()
	return nil
}

func inlineEvent(t testing.TB, id uint64, data string, last bool) *Event {
	t.Helper()
	m := &protocol.RequestHeaders{RequestID: id, Method: []byte("POST"), URI: []byte("/u"), HasBody: true,
		HasInlineBody: true, InlineBody: protocol.BodyChunk{Data: []byte(data), IsLast: last, TotalSize: 7, Progress: 7}}
	ev := AcquireEvent()
	if err := ev.Decode(protocol.TypeRequestHeaders, protocol.AppendRequestHeaders(nil, m)); err != nil {
		t.Fatal(err)
	}
	return ev
}

func setOp(name, value string) protocol.HeaderOp {
	return protocol.HeaderOp{Op: protocol.HeaderSet, Name: []byte(name), Value: []byte(value)}
}

func opsString(ops []protocol.HeaderOp) string {
	var b strings.Builder
	for _, o := range ops {
		fmt.Fprintf(&b, "%s:%s=%s;", o.Op, o.Name, o.Value)
	}
	return b.String()
}

func TestDeclaredCapabilities(t *testing.T) {
	for _, c := range []struct {
		caps protocol.Capabilities
		want bool
	}{
		{protocol.Capabilities{HandlesRequestHeaders: true}, false},
		{protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true}, true},
		{protocol.Capabilities{HandlesRequestBody: true}, true},
		{protocol.Capabilities{HandlesResponseBody: true}, false},
	} {
		got := DeclaredCapabilities(Base{Caps: c.caps})
		want := c.caps
		want.SupportsInlineBody = c.want
		want.SupportsClientRequest = true // declared to every proxy that offers it
		if got != want {
			t.Errorf("DeclaredCapabilities(%+v) = %+v, want %+v", c.caps, got, want)
		}
	}
	body := protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true}
	if got := DeclaredCapabilities(chooser{Base{Caps: body}, false}); got.SupportsInlineBody {
		t.Error("a handler that says no to inline bodies declares them")
	}
	if got := DeclaredCapabilities(chooser{Base{Caps: body}, true}); !got.SupportsInlineBody {
		t.Error("a handler that says yes to inline bodies does not declare them")
	}
}

type chooser struct {
	Base
	inline bool
}

func (c chooser) InlineBody() bool { return c.inline }

// TestInlineMerge: the Decision sent for an event with an inline body is
// the merge of OnRequestHeaders' and OnRequestBody's answers.
func TestInlineMerge(t *testing.T) {
	allowOps := func(_ *protocol.RequestHeaders, d *protocol.Decision) {
		d.RequestHeaderOps = append(d.RequestHeaderOps, setOp("x-h", "1"))
		d.ResponseHeaderOps = append(d.ResponseHeaderOps, setOp("x-hr", "1"))
		d.Audit.Tags = append(d.Audit.Tags, []byte("h"))
		d.Audit.Confidence, d.Audit.HasConf = 0.5, true
		d.Audit.Custom = []byte(`{"h":1}`)
	}
	tests := []struct {
		name     string
		data     string
		last     bool
		headers  func(*protocol.RequestHeaders, *protocol.Decision)
		body     func(*protocol.BodyChunk, *BodyReply) error
		calls    int // handler calls
		kind     protocol.DecisionKind
		final    bool
		status   int
		mutation string // "" none, "drop", or the replacement
		reqOps   string
		respOps  string
		audit    string
	}{
		{name: "pass, not last: needs the next chunk", data: "abc", headers: allowOps, calls: 2,
			kind: protocol.DecisionAllow, final: false, reqOps: "set:x-h=1;", respOps: "set:x-hr=1;", audit: `[h] 0.5 {"h":1}`},
		{name: "pass, last: allow", data: "abc", last: true, calls: 2, kind: protocol.DecisionAllow, final: true},
		{name: "replace", data: "abc", last: true, calls: 2, headers: allowOps,
			body: func(_ *protocol.BodyChunk, r *BodyReply) error { r.Replace([]byte("XYZ")); return nil },
			kind: protocol.DecisionAllow, final: true, mutation: "XYZ", reqOps: "set:x-h=1;", respOps: "set:x-hr=1;", audit: `[h] 0.5 {"h":1}`},
		{name: "drop, not last", data: "abc", calls: 2,
			body: func(_ *protocol.BodyChunk, r *BodyReply) error { r.Drop(); return nil },
			kind: protocol.DecisionAllow, final: false, mutation: "drop"},
		{name: "body decision: ops follow the header's, audit merged", data: "abc", calls: 2, headers: allowOps,
			body: func(_ *protocol.BodyChunk, r *BodyReply) error {
				r.NeedMore()
				r.Decision.RequestHeaderOps = append(r.Decision.RequestHeaderOps, setOp("x-b", "2"))
				r.Decision.ResponseHeaderOps = append(r.Decision.ResponseHeaderOps, setOp("x-br", "2"))
				r.Decision.Audit.Tags = append(r.Decision.Audit.Tags, []byte("b"))
				r.Decision.Audit.Custom = []byte(`{"b":2}`)
				return nil
			},
			kind: protocol.DecisionAllow, final: false, reqOps: "set:x-h=1;set:x-b=2;", respOps: "set:x-hr=1;set:x-br=2;", audit: `[h b] 0.5 {"b":2}`},
		{name: "body decision with an embedded mutation", data: "abc", last: true, calls: 2,
			body: func(_ *protocol.BodyChunk, r *BodyReply) error {
				r.Decision.HasRequestBodyMutation = true
				r.Decision.RequestBodyMutation = protocol.BodyMutation{ChunkIndex: 9, Action: protocol.MutationReplace, Data: []byte("new")}
				return nil
			},
			kind: protocol.DecisionAllow, final: true, mutation: "new"},
		{name: "body blocks: the header's operations stay", data: "abc", calls: 2, headers: allowOps,
			body: func(_ *protocol.BodyChunk, r *BodyReply) error {
				r.Decision.Kind, r.Decision.Status, r.Decision.Body = protocol.DecisionBlock, 422, []byte("bad body")
				return nil
			},
			kind: protocol.DecisionBlock, final: true, status: 422, reqOps: "set:x-h=1;", respOps: "set:x-hr=1;", audit: `[h] 0.5 {"h":1}`},
		{name: "needs_more at the headers: the body's verdict counts", data: "abc", last: true, calls: 2,
			headers: func(_ *protocol.RequestHeaders, d *protocol.Decision) {
				d.Kind = protocol.DecisionNeedsMore
				d.NeedsMore = true
			},
			body: func(_ *protocol.BodyChunk, r *BodyReply) error {
				r.Decision.Kind, r.Decision.RedirectURL, r.Decision.Status = protocol.DecisionRedirect, []byte("/login"), 303
				return nil
			},
			kind: protocol.DecisionRedirect, final: true, status: 303},
		{name: "header block: no body handler call", data: "abc", calls: 1,
			headers: func(_ *protocol.RequestHeaders, d *protocol.Decision) {
				d.Kind, d.Status = protocol.DecisionBlock, 403
				d.RequestHeaderOps = append(d.RequestHeaderOps, setOp("x-h", "1"))
			},
			kind: protocol.DecisionBlock, final: true, status: 403, reqOps: "set:x-h=1;"},
		{name: "header redirect: no body handler call", data: "abc", calls: 1,
			headers: func(_ *protocol.RequestHeaders, d *protocol.Decision) {
				d.Kind, d.Status, d.RedirectURL = protocol.DecisionRedirect, 302, []byte("https://x.example/")
			},
			kind: protocol.DecisionRedirect, final: true, status: 302},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := &inlineHandler{Base: Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true}},
				headers: tc.headers, body: tc.body}
			out := &wireSender{out: make(chan sent, 1)}
			d := NewDispatcher(context.Background(), h, out)
			defer d.Close()
			d.Dispatch(inlineEvent(t, 41, tc.data, tc.last))
			s := out.next(t)
			if s.t != protocol.TypeDecision {
				t.Fatalf("reply type %s (%q %s)", s.t, s.errText, s.payload)
			}
			var dec protocol.Decision
			if err := dec.Decode(s.payload); err != nil {
				t.Fatal(err)
			}
			if err := dec.Normalize(); err != nil {
				t.Fatalf("%s: %v", s.payload, err)
			}
			if len(h.calls) != tc.calls {
				t.Fatalf("handler calls %v, want %d", h.calls, tc.calls)
			}
			if tc.calls == 2 {
				if want := fmt.Sprintf("body:41:0:%s:%v:7", tc.data, tc.last); h.calls[1] != want {
					t.Fatalf("body handler got %s, want %s", h.calls[1], want)
				}
			}
			if dec.RequestID != 41 || dec.Kind != tc.kind || dec.Final() != tc.final || dec.Status != tc.status {
				t.Fatalf("decision %s: id %d kind %s final %v status %d", s.payload, dec.RequestID, dec.Kind, dec.Final(), dec.Status)
			}
			mut := ""
			if dec.HasRequestBodyMutation {
				bm := dec.RequestBodyMutation
				if bm.ChunkIndex != 0 || bm.Phase != protocol.PhaseRequest {
					t.Fatalf("mutation for chunk %d phase %s", bm.ChunkIndex, bm.Phase)
				}
				mut = "drop"
				if bm.Action == protocol.MutationReplace {
					mut = string(bm.Data)
				}
			}
			if mut != tc.mutation {
				t.Fatalf("mutation %q, want %q (%s)", mut, tc.mutation, s.payload)
			}
			if got := opsString(dec.RequestHeaderOps); got != tc.reqOps {
				t.Errorf("request ops %s, want %s", got, tc.reqOps)
			}
			if got := opsString(dec.ResponseHeaderOps); got != tc.respOps {
				t.Errorf("response ops %s, want %s", got, tc.respOps)
			}
			audit := ""
			if !dec.Audit.Empty() {
				audit = fmt.Sprintf("%s %v %s", dec.Audit.Tags, dec.Audit.Confidence, dec.Audit.Custom)
			}
			if audit != tc.audit {
				t.Errorf("audit %q, want %q", audit, tc.audit)
			}
		})
	}
}

// An event without an inline body is handled as before: OnRequestHeaders
// only.
func TestNoInlineBodyNoBodyCall(t *testing.T) {
	h := &inlineHandler{Base: Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true}}}
	out := &wireSender{out: make(chan sent, 1)}
	d := NewDispatcher(context.Background(), h, out)
	defer d.Close()
	ev := AcquireEvent()
	if err := ev.Decode(protocol.TypeRequestHeaders, protocol.AppendRequestHeaders(nil, &protocol.RequestHeaders{RequestID: 5, HasBody: true})); err != nil {
		t.Fatal(err)
	}
	d.Dispatch(ev)
	s := out.next(t)
	if s.t != protocol.TypeDecision || len(h.calls) != 1 || bytes.Contains(s.payload, []byte("needs_more")) {
		t.Fatalf("calls %v, reply %s", h.calls, s.payload)
	}
}

// A body handler error is an agent error for the whole event.
func TestInlineBodyHandlerError(t *testing.T) {
	h := &inlineHandler{Base: Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true}},
		body: func(*protocol.BodyChunk, *BodyReply) error { return errors.New("boom") }}
	out := &wireSender{out: make(chan sent, 1)}
	d := NewDispatcher(context.Background(), h, out)
	defer d.Close()
	d.Dispatch(inlineEvent(t, 3, "x", true))
	if s := out.next(t); s.errText == "" {
		t.Fatalf("reply %s %s, want an agent error", s.t, s.payload)
	}
}

// TestAllocsDispatchInline: an event with an inline body costs what any
// event costs, exactly one allocation (the handler's context): the body
// reply and the merge reuse the pooled event.
func TestAllocsDispatchInline(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	out := &signalSender{sent: make(chan struct{}, 1)}
	h := &inlineHandler{Base: Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true}}}
	h.headers = func(_ *protocol.RequestHeaders, d *protocol.Decision) {
		d.RequestHeaderOps = append(d.RequestHeaderOps, opA)
	}
	h.body = func(_ *protocol.BodyChunk, r *BodyReply) error {
		r.Decision.RequestHeaderOps = append(r.Decision.RequestHeaderOps, opB)
		return nil
	}
	noRecord := &allocHandler{inner: h}
	d := NewDispatcher(context.Background(), noRecord, out)
	defer d.Close()
	payload := protocol.AppendRequestHeaders(nil, &protocol.RequestHeaders{Method: []byte("POST"), URI: []byte("/"),
		Headers: protocol.Headers{{Name: []byte("host"), Value: []byte("example.com")}}, HasBody: true,
		HasInlineBody: true, InlineBody: protocol.BodyChunk{Data: bytes.Repeat([]byte("b"), 4096), IsLast: true, TotalSize: 4096, Progress: 4096}})
	allocs := allocsPerEvent(t, payload, d.Dispatch, out.sent)
	if allocs != 1 {
		t.Fatalf("%.2f allocations per inline event, want exactly 1 (the handler's context)", allocs)
	}
}

var opA, opB = setOp("x-a", "1"), setOp("x-b", "2")

// allocHandler forwards to inlineHandler's functions without recording
// calls (the record allocates).
type allocHandler struct {
	Base
	inner *inlineHandler
}

func (a *allocHandler) OnRequestHeaders(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
	a.inner.headers(m, d)
	return nil
}

func (a *allocHandler) OnRequestBody(_ context.Context, m *protocol.BodyChunk, r *BodyReply) error {
	return a.inner.body(m, r)
}
