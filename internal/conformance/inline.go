package conformance

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// The inline body (feature inline_body): chunk 0 of a request body rides
// in RequestHeaders and one Decision answers both. These cases drive the
// proxy side's Exchange directly, as the dataplane does, against an SDK
// agent.

// testInlineNegotiated: an SDK agent that handles request bodies gets
// supports_inline_body on every transport; one that does not, does not.
func testInlineNegotiated(t *testing.T, dial Dial) {
	for _, tc := range []struct {
		caps protocol.Capabilities
		want bool
	}{
		{protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true}, true},
		{protocol.Capabilities{HandlesRequestHeaders: true, HandlesResponseBody: true}, false},
	} {
		a := dial(t, &handler{Base: sdk.Base{Caps: tc.caps}})
		ex := begin(t, a)
		got := ex.Capabilities().SupportsInlineBody
		ex.Finish()
		if got != tc.want || a.Capabilities().SupportsInlineBody != tc.want {
			t.Errorf("caps %+v: supports_inline_body %v, want %v", tc.caps, got, tc.want)
		}
	}
}

// inlineHeaders is a POST whose whole body, or its first chunk, is inline.
func inlineHeaders(data []byte, last bool, total int64) *protocol.RequestHeaders {
	m := request("POST", "/upload", "content-type", "application/octet-stream")
	m.HasBody = true
	m.HasInlineBody = true
	m.InlineBody = protocol.BodyChunk{Data: data, IsLast: last, TotalSize: total, Progress: int64(len(data))}
	return m
}

// testInlineWhole: a whole body inline is decided in one round trip, with
// every byte value intact; the handler sees the headers, then chunk 0; a
// replacement comes back as the Decision's request_body_mutation; a block
// at the headers means no body handler call.
func testInlineWhole(t *testing.T, dial Dial) {
	body := chunkData(0)
	big := bytes.Repeat(chunkData(7), 200) // ~60 KiB, several frames' worth of base64
	var mu sync.Mutex
	var calls []string
	h := &handler{Base: sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true, SupportsCancellation: true}}}
	h.reqHeaders = func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
		mu.Lock()
		calls = append(calls, "headers "+string(m.URI))
		mu.Unlock()
		if m.Headers.Get("x-block") != nil {
			d.Kind, d.Status = protocol.DecisionBlock, 451
			return nil
		}
		d.RequestHeaderOps = append(d.RequestHeaderOps, setOp("x-from-headers", "1"))
		return nil
	}
	h.reqBody = func(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
		mu.Lock()
		calls = append(calls, fmt.Sprintf("body %d %d %v", m.ChunkIndex, len(m.Data), m.IsLast))
		mu.Unlock()
		switch {
		case bytes.Equal(m.Data, body):
			r.Replace([]byte("redacted\x00\xff"))
		case bytes.Equal(m.Data, big):
			r.Decision.RequestHeaderOps = append(r.Decision.RequestHeaderOps, setOp("x-sum", sum(m.Data)))
		default:
			return fmt.Errorf("inline chunk corrupted (%d bytes)", len(m.Data))
		}
		return nil
	}
	a := dial(t, h)
	ctx, cancel := ctxWait()
	defer cancel()
	take := func() []string {
		mu.Lock()
		defer mu.Unlock()
		c := calls
		calls = nil
		return c
	}

	ex := begin(t, a)
	r, err := ex.RequestHeaders(agentmux.WaitFor(ctx), inlineHeaders(body, true, int64(len(body))))
	if err != nil {
		t.Fatal(err)
	}
	d := copyDecision(&r.Decision)
	mut := r.Decision.RequestBodyMutation
	if r.Type != protocol.TypeDecision || d.Kind != protocol.DecisionAllow || !d.Final() {
		t.Fatalf("reply %s %s final=%v, want a final allow", r.Type, d.Kind, d.Final())
	}
	if !r.Decision.HasRequestBodyMutation || mut.Action != protocol.MutationReplace || string(mut.Data) != "redacted\x00\xff" || mut.ChunkIndex != 0 {
		t.Fatalf("mutation %v %d %q chunk %d", r.Decision.HasRequestBodyMutation, mut.Action, mut.Data, mut.ChunkIndex)
	}
	wantOp(t, &d, "x-from-headers", "1")
	ex.Finish()
	if got := fmt.Sprint(take()); got != fmt.Sprintf("[headers /upload body 0 %d true]", len(body)) {
		t.Fatalf("handler calls %s", got)
	}

	ex = begin(t, a)
	r, err = ex.RequestHeaders(agentmux.WaitFor(ctx), inlineHeaders(big, true, int64(len(big))))
	if err != nil {
		t.Fatal(err)
	}
	d = copyDecision(&r.Decision)
	if !d.Final() || d.Kind != protocol.DecisionAllow || r.Decision.HasRequestBodyMutation {
		t.Fatalf("big body: %s final=%v mutation=%v", d.Kind, d.Final(), r.Decision.HasRequestBodyMutation)
	}
	wantOp(t, &d, "x-sum", sum(big))
	wantOp(t, &d, "x-from-headers", "1")
	ex.Finish()
	take()

	ex = begin(t, a)
	m := inlineHeaders(body, true, int64(len(body)))
	m.Headers = m.Headers.Add([]byte("x-block"), []byte("1"))
	r, err = ex.RequestHeaders(agentmux.WaitFor(ctx), m)
	if err != nil {
		t.Fatal(err)
	}
	if r.Decision.Kind != protocol.DecisionBlock || r.Decision.Status != 451 {
		t.Fatalf("header block: %s %d", r.Decision.Kind, r.Decision.Status)
	}
	ex.Finish()
	if got := fmt.Sprint(take()); got != "[headers /upload]" {
		t.Fatalf("handler calls after a header block %s, want the headers only", got)
	}
}

// testInlineConversation: the first chunk inline, needs_more, then chunk 1
// as an event of its own (index 1), then the verdict.
func testInlineConversation(t *testing.T, dial Dial) {
	c0, c1 := chunkData(0), chunkData(1)
	total := int64(len(c0) + len(c1))
	h := &handler{Base: sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true, SupportsCancellation: true}}}
	h.reqBody = func(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
		want := map[uint32][]byte{0: c0, 1: c1}[m.ChunkIndex]
		if !bytes.Equal(m.Data, want) || m.IsLast != (m.ChunkIndex == 1) || m.TotalSize != total {
			return fmt.Errorf("chunk %d: %d bytes last=%v total=%d", m.ChunkIndex, len(m.Data), m.IsLast, m.TotalSize)
		}
		if m.ChunkIndex == 0 {
			r.NeedMore()
			r.Decision.RequestHeaderOps = append(r.Decision.RequestHeaderOps, setOp("x-c0", sum(m.Data)))
			return nil
		}
		r.Decision.Kind, r.Decision.Status, r.Decision.Body = protocol.DecisionBlock, 422, []byte("no")
		return nil
	}
	a := dial(t, h)
	ctx, cancel := ctxWait()
	defer cancel()
	ex := begin(t, a)
	defer ex.Finish()
	r, err := ex.RequestHeaders(agentmux.WaitFor(ctx), inlineHeaders(c0, false, total))
	if err != nil {
		t.Fatal(err)
	}
	d := copyDecision(&r.Decision)
	if d.Final() || d.Kind != protocol.DecisionAllow {
		t.Fatalf("first chunk: %s final=%v, want allow + needs_more", d.Kind, d.Final())
	}
	wantOp(t, &d, "x-c0", sum(c0))
	r, err = ex.BodyChunk(agentmux.WaitFor(ctx), protocol.PhaseRequest,
		&protocol.BodyChunk{ChunkIndex: 1, Data: c1, IsLast: true, TotalSize: total, Progress: total})
	if err != nil {
		t.Fatal(err)
	}
	if r.Type != protocol.TypeDecision || r.Decision.Kind != protocol.DecisionBlock || r.Decision.Status != 422 || string(r.Decision.Body) != "no" {
		t.Fatalf("chunk 1: %s %s %d %q", r.Type, r.Decision.Kind, r.Decision.Status, r.Decision.Body)
	}
}
