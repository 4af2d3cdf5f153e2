package dataplane_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/uds"
)

// eventLog is the order in which frame-level agents got their events,
// across agents: "a:headers", "a:headers+inline(0 "abc" last)",
// "a:chunk(1 "def" last)".
type eventLog struct {
	mu     sync.Mutex
	events []string
}

func (l *eventLog) add(e string) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func (l *eventLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.events
	l.events = nil
	return e
}

// agentEvent is one request-phase event a frame agent got.
type agentEvent struct {
	headers bool // RequestHeaders (else a RequestBodyChunk)
	inline  bool
	index   uint32
	data    string
	last    bool
	total   int64
	header  func(name string) string // request headers of a RequestHeaders
}

// inlineCaps are the capabilities of a buffered request body agent, with
// or without the inline_body feature.
func inlineCaps(inline bool) protocol.Capabilities {
	return protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true, SupportsCancellation: true, SupportsInlineBody: inline}
}

// serveFrameAgent starts a frame-level agent named name that logs every
// event to log and answers with answer (nil, or a nil answer: allow; a
// Decision or a BodyMutation, whose ids it fills in).
func serveFrameAgent(t *testing.T, name string, caps protocol.Capabilities, log *eventLog, answer func(e *agentEvent) protocol.Message) string {
	t.Helper()
	path := testutil.SocketPath(t)
	testagent.Raw(t, path, caps, func(nc net.Conn, fr *uds.FrameReader) {
		for {
			typ, payload, err := fr.Next()
			if err != nil {
				return
			}
			var e agentEvent
			var id uint64
			switch typ {
			case protocol.TypeRequestHeaders:
				var m protocol.RequestHeaders
				if m.Decode(payload) != nil {
					return
				}
				id = m.RequestID
				e = agentEvent{headers: true, inline: m.HasInlineBody, data: string(m.InlineBody.Data), last: m.InlineBody.IsLast,
					index: m.InlineBody.ChunkIndex, total: m.InlineBody.TotalSize}
				hdrs := slices.Clone(m.Headers)
				e.header = func(n string) string { return string(hdrs.Get(n)) }
				if e.inline {
					log.add(fmt.Sprintf("%s:headers+inline(%d %q %v)", name, e.index, e.data, e.last))
				} else {
					log.add(name + ":headers")
				}
			case protocol.TypeRequestBodyChunk:
				var m protocol.BodyChunk
				if m.Decode(payload) != nil {
					return
				}
				id = m.RequestID
				e = agentEvent{index: m.ChunkIndex, data: string(m.Data), last: m.IsLast, total: m.TotalSize}
				log.add(fmt.Sprintf("%s:chunk(%d %q %v)", name, e.index, e.data, e.last))
			case protocol.TypeResponseHeaders, protocol.TypeResponseBodyChunk:
				log.add(name + ":" + typ.String())
				continue // not expected: these agents handle neither
			default:
				continue
			}
			var reply protocol.Message
			if answer != nil {
				reply = answer(&e)
			}
			switch r := reply.(type) {
			case nil:
				reply = &protocol.Decision{RequestID: id}
			case *protocol.Decision:
				r.RequestID = id
			case *protocol.BodyMutation:
				r.RequestID, r.ChunkIndex = id, e.index
			}
			if uds.WriteFrame(nc, reply) != nil {
				return
			}
		}
	})
	return path
}

func replace(data string) *protocol.Decision {
	return &protocol.Decision{HasRequestBodyMutation: true, RequestBodyMutation: protocol.BodyMutation{Action: protocol.MutationReplace, Data: []byte(data)}}
}

func needsMore() *protocol.Decision { return &protocol.Decision{NeedsMore: true} }

func wantEvents(t *testing.T, log *eventLog, want ...string) {
	t.Helper()
	if got := log.take(); !slices.Equal(got, want) {
		t.Fatalf("events\n got %q\nwant %q", got, want)
	}
}

func bufferedSpec(path string) agentSpec {
	return agentSpec{Path: path, ReqMode: "buffered", RespMode: "none", Limit: "64KiB", Chunk: "1KiB"}
}

// One round trip for a small body: the headers and the whole body in one
// event, and no chunk event after it.
func TestInlineBodyOneRoundTrip(t *testing.T) {
	log := &eventLog{}
	var seen agentEvent
	path := serveFrameAgent(t, "a", inlineCaps(true), log, func(e *agentEvent) protocol.Message {
		seen = *e
		return &protocol.Decision{RequestHeaderOps: []protocol.HeaderOp{{Op: protocol.HeaderSet, Name: []byte("x-seen"), Value: []byte(e.data)}}}
	})
	p, up := setup(t, nil, []string{"a"}, nil, map[string]agentSpec{"a": bufferedSpec(path)}, nil)
	resp, _ := p.do(t, "POST", "/", strings.NewReader("hello"))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	wantEvents(t, log, `a:headers+inline(0 "hello" true)`)
	if seen.total != 5 || seen.header("content-length") != "5" {
		t.Errorf("inline total_size %d, content-length %q", seen.total, seen.header("content-length"))
	}
	got := up.last(t)
	if string(got.Body) != "hello" || got.CL != 5 || got.Header.Get("X-Seen") != "hello" {
		t.Fatalf("upstream body %q cl %d x-seen %q", got.Body, got.CL, got.Header.Get("X-Seen"))
	}
	st := p.srv.Stats()
	if st.InlineBodies != 1 {
		t.Errorf("inline_bodies %d, want 1", st.InlineBodies)
	}
	// A chunked upload is inlined the same way, its size unknown.
	resp, _ = p.do(t, "POST", "/", io.MultiReader(strings.NewReader("chunk"), strings.NewReader("ed")))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	wantEvents(t, log, `a:headers+inline(0 "chunked" true)`)
	if seen.total != -1 || string(up.last(t).Body) != "chunked" {
		t.Errorf("chunked: total_size %d, upstream body %q", seen.total, up.last(t).Body)
	}
}

// An agent without the feature gets the conversation it always had.
func TestInlineBodyOldAgent(t *testing.T) {
	log := &eventLog{}
	path := serveFrameAgent(t, "a", inlineCaps(false), log, nil)
	p, up := setup(t, nil, []string{"a"}, nil, map[string]agentSpec{"a": bufferedSpec(path)}, nil)
	resp, _ := p.do(t, "POST", "/", strings.NewReader("hello"))
	if resp.StatusCode != 200 || string(up.last(t).Body) != "hello" {
		t.Fatalf("status %d body %q", resp.StatusCode, up.last(t).Body)
	}
	wantEvents(t, log, `a:headers`, `a:chunk(0 "hello" true)`)
	if st := p.srv.Stats(); st.InlineBodies != 0 {
		t.Errorf("inline_bodies %d", st.InlineBodies)
	}
}

// A block in the reply to the inline event ends the request at once.
func TestInlineBodyBlockAtOnce(t *testing.T) {
	log := &eventLog{}
	path := serveFrameAgent(t, "a", inlineCaps(true), log, func(e *agentEvent) protocol.Message {
		if strings.Contains(e.data, "evil") {
			return &protocol.Decision{Kind: protocol.DecisionBlock, Status: 422, Body: []byte("no")}
		}
		return nil
	})
	p, up := setup(t, nil, []string{"a"}, nil, map[string]agentSpec{"a": bufferedSpec(path)}, nil)
	resp, body := p.do(t, "POST", "/", strings.NewReader("some evil payload"))
	if resp.StatusCode != 422 || body != "no" || up.count() != 0 {
		t.Fatalf("status %d body %q upstream hits %d", resp.StatusCode, body, up.count())
	}
	wantEvents(t, log, `a:headers+inline(0 "some evil payload" true)`)
}

// needs_more in the reply to the inline event: the next chunk follows as
// an event of its own, chunk_index 1; a final allow there ends the
// agent's say, and the last chunk passes without it.
func TestInlineBodyNeedsMoreContinues(t *testing.T) {
	log := &eventLog{}
	a, b, c := strings.Repeat("a", 1024), strings.Repeat("b", 1024), strings.Repeat("c", 100)
	path := serveFrameAgent(t, "x", inlineCaps(true), log, func(e *agentEvent) protocol.Message {
		switch {
		case e.headers:
			return needsMore()
		case e.index == 1:
			return &protocol.BodyMutation{Action: protocol.MutationReplace, Data: []byte("B")}
		}
		return nil // chunk 2: not expected
	})
	p, up := setup(t, nil, []string{"x"}, nil, map[string]agentSpec{"x": bufferedSpec(path)}, nil)
	resp, _ := p.do(t, "POST", "/", strings.NewReader(a+b+c))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	got := log.take()
	want := []string{fmt.Sprintf("x:headers+inline(0 %q false)", a), fmt.Sprintf("x:chunk(1 %q false)", b), fmt.Sprintf("x:chunk(2 %q true)", c)}
	if !slices.Equal(got, want) {
		t.Fatalf("events %d, want %d: %.80q", len(got), len(want), got)
	}
	if g := string(up.last(t).Body); g != a+"B"+c {
		t.Fatalf("upstream body %.40q… (%d bytes)", g, len(g))
	}

	// A final allow for chunk 1: chunk 2 is not shown.
	log2 := &eventLog{}
	path2 := serveFrameAgent(t, "y", inlineCaps(true), log2, func(e *agentEvent) protocol.Message {
		if e.headers {
			return needsMore()
		}
		return nil
	})
	p2, up2 := setup(t, nil, []string{"y"}, nil, map[string]agentSpec{"y": bufferedSpec(path2)}, nil)
	if resp, _ := p2.do(t, "POST", "/", strings.NewReader(a+b+c)); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got := log2.take(); len(got) != 2 || !strings.HasPrefix(got[1], "y:chunk(1 ") {
		t.Fatalf("events %.80q", got)
	}
	if g := string(up2.last(t).Body); g != a+b+c {
		t.Fatalf("upstream body changed: %d bytes", len(g))
	}

	// A final allow in the reply to the inline event: no chunk event at
	// all, the body passes as it is.
	log3 := &eventLog{}
	path3 := serveFrameAgent(t, "z", inlineCaps(true), log3, nil)
	p3, up3 := setup(t, nil, []string{"z"}, nil, map[string]agentSpec{"z": bufferedSpec(path3)}, nil)
	if resp, _ := p3.do(t, "POST", "/", strings.NewReader(a+b+c)); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got := log3.take(); len(got) != 1 {
		t.Fatalf("events %.80q", got)
	}
	if g := string(up3.last(t).Body); g != a+b+c {
		t.Fatalf("upstream body changed: %d bytes", len(g))
	}
}

// A mutation in the reply to the inline event rewrites chunk 0; the
// buffered body keeps an exact Content-Length.
func TestInlineBodyMutation(t *testing.T) {
	log := &eventLog{}
	path := serveFrameAgent(t, "a", inlineCaps(true), log, func(e *agentEvent) protocol.Message {
		return replace(strings.ToUpper(e.data))
	})
	p, up := setup(t, nil, []string{"a"}, nil, map[string]agentSpec{"a": bufferedSpec(path)}, nil)
	resp, _ := p.do(t, "POST", "/", strings.NewReader("card 4111"))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	got := up.last(t)
	if string(got.Body) != "CARD 4111" || got.CL != 9 || len(got.TE) != 0 {
		t.Fatalf("upstream body %q cl %d te %v", got.Body, got.CL, got.TE)
	}
	// A drop of the whole body: the upstream gets an empty body.
	log2 := &eventLog{}
	path2 := serveFrameAgent(t, "d", inlineCaps(true), log2, func(*agentEvent) protocol.Message {
		return &protocol.Decision{HasRequestBodyMutation: true, RequestBodyMutation: protocol.BodyMutation{Action: protocol.MutationDrop}}
	})
	p2, up2 := setup(t, nil, []string{"d"}, nil, map[string]agentSpec{"d": bufferedSpec(path2)}, nil)
	if resp, _ := p2.do(t, "POST", "/", strings.NewReader("secret")); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got := up2.last(t); len(got.Body) != 0 || got.CL != 0 {
		t.Fatalf("upstream body %q cl %d", got.Body, got.CL)
	}
}

// A chain of inline agents: each sees the request, body included, as the
// ones before left it, and the upstream gets the result.
func TestInlineBodyChain(t *testing.T) {
	log := &eventLog{}
	pathA := serveFrameAgent(t, "a", inlineCaps(true), log, func(e *agentEvent) protocol.Message {
		d := replace("[" + e.data + "]")
		d.RequestHeaderOps = []protocol.HeaderOp{{Op: protocol.HeaderSet, Name: []byte("x-a"), Value: []byte("1")}}
		return d
	})
	var bHeader string
	pathB := serveFrameAgent(t, "b", inlineCaps(true), log, func(e *agentEvent) protocol.Message {
		bHeader = e.header("x-a")
		return replace(e.data + "!")
	})
	specs := map[string]agentSpec{"a": bufferedSpec(pathA), "b": bufferedSpec(pathB)}
	p, up := setup(t, nil, []string{"a", "b"}, nil, specs, nil)
	resp, _ := p.do(t, "POST", "/", strings.NewReader("body"))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	wantEvents(t, log, `a:headers+inline(0 "body" true)`, `b:headers+inline(0 "[body]" true)`)
	if bHeader != "1" {
		t.Errorf("agent b saw x-a %q: the headers as agent a left them", bHeader)
	}
	if got := up.last(t); string(got.Body) != "[body]!" || got.CL != 7 {
		t.Fatalf("upstream body %q cl %d", got.Body, got.CL)
	}
	if st := p.srv.Stats(); st.InlineBodies != 2 {
		t.Errorf("inline_bodies %d, want 2", st.InlineBodies)
	}
}

// A chain with an agent without the feature before an inline one: the old
// agent gets its headers and then chunk 0 (its own conversation is
// unchanged), before the inline agent's event, which carries chunk 0 as
// the old agent left it. An agent after the last inline one gets chunk 0
// in the body phase, and chunk 1 goes through the chain as usual.
func TestInlineBodyMixedChain(t *testing.T) {
	log := &eventLog{}
	a, b := strings.Repeat("a", 1024), strings.Repeat("b", 10)
	pathOld := serveFrameAgent(t, "old", inlineCaps(false), log, func(e *agentEvent) protocol.Message {
		if e.headers {
			return nil
		}
		return &protocol.BodyMutation{Action: protocol.MutationReplace, Data: []byte(strings.ToUpper(e.data[:1]))}
	})
	pathNew := serveFrameAgent(t, "new", inlineCaps(true), log, func(e *agentEvent) protocol.Message {
		if e.headers {
			return needsMore()
		}
		return nil
	})
	pathLast := serveFrameAgent(t, "last", inlineCaps(false), log, nil)
	specs := map[string]agentSpec{"old": bufferedSpec(pathOld), "new": bufferedSpec(pathNew), "last": bufferedSpec(pathLast)}
	p, up := setup(t, nil, []string{"old", "new", "last"}, nil, specs, nil)
	resp, _ := p.do(t, "POST", "/", strings.NewReader(a+b))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	wantEvents(t, log,
		`old:headers`,
		fmt.Sprintf("old:chunk(0 %q false)", a),
		`new:headers+inline(0 "A" false)`,
		`last:headers`,
		`last:chunk(0 "A" false)`,
		`old:chunk(1 "bbbbbbbbbb" true)`,
		`new:chunk(1 "B" true)`,
		// last's final allow for chunk 0 ended its say: no chunk 1.
	)
	if got := string(up.last(t).Body); got != "AB" {
		t.Fatalf("upstream body %q", got)
	}
}

// Bodies over a limit keep their usual handling: 413 with reject (the
// agent sees no body), the skip mark with skip (the agent sees its
// headers only).
func TestInlineBodyOverLimit(t *testing.T) {
	for _, action := range []string{"reject", "skip"} {
		t.Run(action, func(t *testing.T) {
			log := &eventLog{}
			path := serveFrameAgent(t, "a", inlineCaps(true), log, nil)
			spec := agentSpec{Path: path, ReqMode: "buffered", RespMode: "none", Limit: "1KiB", OverLimit: action, Chunk: "1KiB"}
			p, up := setup(t, nil, []string{"a"}, nil, map[string]agentSpec{"a": spec}, nil)
			for _, body := range []io.Reader{strings.NewReader(threeChunks()), io.MultiReader(strings.NewReader(threeChunks()))} {
				resp, _ := p.do(t, "POST", "/", body)
				if action == "reject" {
					if resp.StatusCode != 413 || up.count() != 0 {
						t.Fatalf("status %d upstream hits %d", resp.StatusCode, up.count())
					}
				} else if resp.StatusCode != 200 || resp.Header.Get("X-Sidecar-Inspection") != "skipped" || string(up.last(t).Body) != threeChunks() {
					t.Fatalf("status %d mark %q", resp.StatusCode, resp.Header.Get("X-Sidecar-Inspection"))
				}
				wantEvents(t, log, "a:headers")
			}
			if st := p.srv.Stats(); st.InlineBodies != 0 {
				t.Errorf("inline_bodies %d", st.InlineBodies)
			}
		})
	}
}

// Streaming mode is never inlined.
func TestInlineBodyNotForStreaming(t *testing.T) {
	log := &eventLog{}
	caps := inlineCaps(true)
	caps.SupportsStreaming = true
	path := serveFrameAgent(t, "a", caps, log, nil)
	spec := agentSpec{Path: path, ReqMode: "auto", RespMode: "none", Chunk: "1KiB"}
	p, up := setup(t, nil, []string{"a"}, nil, map[string]agentSpec{"a": spec}, nil)
	if resp, _ := p.do(t, "POST", "/", strings.NewReader("hello")); resp.StatusCode != 200 || string(up.last(t).Body) != "hello" {
		t.Fatalf("status %d", resp.StatusCode)
	}
	wantEvents(t, log, "a:headers", `a:chunk(0 "hello" true)`)
}

// An invalid reply to the inline event fails open like any other: the
// request passes, marked, with its body intact, and the agent gets
// nothing more of it.
func TestInlineBodyFailOpen(t *testing.T) {
	log := &eventLog{}
	path := serveFrameAgent(t, "a", inlineCaps(true), log, func(*agentEvent) protocol.Message {
		return &protocol.Decision{Kind: protocol.DecisionBlock, Status: 99} // not a usable status
	})
	spec := bufferedSpec(path)
	spec.Failure = "open"
	p, up := setup(t, nil, []string{"a"}, nil, map[string]agentSpec{"a": spec}, nil)
	resp, _ := p.do(t, "POST", "/", strings.NewReader(threeChunks()))
	if resp.StatusCode != 200 || resp.Header.Get("X-Sidecar-Fail-Open") != "a" {
		t.Fatalf("status %d fail-open %q", resp.StatusCode, resp.Header.Get("X-Sidecar-Fail-Open"))
	}
	if got := up.last(t); string(got.Body) != threeChunks() {
		t.Fatalf("upstream body %d bytes", len(got.Body))
	}
	if got := log.take(); len(got) != 1 || !strings.HasPrefix(got[0], "a:headers+inline(0 ") {
		t.Fatalf("events %.60q", got)
	}
}

// A header-only agent that blocks before the inline agent ends the request
// before the body is read for it.
func TestInlineBodyEarlierHeaderBlock(t *testing.T) {
	log := &eventLog{}
	pathH := serveFrameAgent(t, "h", headersOnly(), log, func(*agentEvent) protocol.Message {
		return &protocol.Decision{Kind: protocol.DecisionBlock, Status: 403}
	})
	pathB := serveFrameAgent(t, "b", inlineCaps(true), log, nil)
	specs := map[string]agentSpec{"h": {Path: pathH}, "b": bufferedSpec(pathB)}
	p, up := setup(t, nil, []string{"h", "b"}, nil, specs, nil)
	resp, _ := p.do(t, "POST", "/", strings.NewReader("hello"))
	if resp.StatusCode != 403 || up.count() != 0 {
		t.Fatalf("status %d upstream %d", resp.StatusCode, up.count())
	}
	wantEvents(t, log, "h:headers")
}

// SDK agents declare the feature and get the same results with it: the
// handler sees chunk 0 through OnRequestBody, whichever way it came.
func TestInlineBodySDKAgent(t *testing.T) {
	rec := &chunkRecorder{}
	agent := &agentFuncs{Base: sdk.Base{Caps: bodyCaps(false)}, reqBody: rewrite(rec)}
	p, up := setup(t, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }, []string{"a"}, map[string]sdk.Handler{"a": agent},
		map[string]agentSpec{"a": {ReqMode: "buffered", RespMode: "none", Limit: "4KiB", Chunk: "1KiB"}}, nil)
	resp, _ := p.do(t, "POST", "/", strings.NewReader(threeChunks()))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got := up.last(t); string(got.Body) != "AAA"+strings.Repeat("c", 1024) {
		t.Fatalf("upstream body %q", clipS(string(got.Body)))
	}
	var idx []uint32
	for _, c := range rec.all() {
		idx = append(idx, c.ChunkIndex)
	}
	if !slices.Equal(idx, []uint32{0, 1, 2}) {
		t.Fatalf("handler saw chunks %v", idx)
	}
	if st := p.srv.Stats(); st.InlineBodies != 1 {
		t.Fatalf("inline_bodies %d: the SDK agent did not get its first chunk inline", st.InlineBodies)
	}
}

// TestAllocsInlineBody extends the allocation gate of the request path
// (TestAllocsProxiedRequest) to a 4 KiB POST through a buffered body
// agent: the proxy side allocates nothing, and with the body inline the
// request is one event, so the whole process allocates only the agent's
// handler context, once (two events, before the feature: twice).
func TestAllocsInlineBody(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	up := fastUpstream(t)
	// The handler does not declare inline_body itself: the SDK does.
	spec := agentSpec{Path: serveAgent(t, &agentFuncs{Base: sdk.Base{Caps: inlineCaps(false)}}), ReqMode: "buffered", RespMode: "none"}
	data := map[string]any{"Upstream": up, "Chain": "a", "Agents": map[string]agentSpec{"a": spec}}
	agents := map[string]agentmux.Agent{"a": udsAgent(t, "a", spec.Path, nil)}
	p := startProxy(t, configText(t, oneAgentConfig, data), agents, nil)
	req := fasthttp.AcquireRequest()
	req.SetRequestURI("http://x/alloc")
	req.Header.SetMethod("POST")
	req.SetBody(make([]byte, 4096))
	do := steadyRequest(t, p.addr, req)
	before := p.srv.Stats().InlineBodies
	n := testing.AllocsPerRun(500, do)
	t.Logf("%.2f allocations per request", n)
	if n > 1 {
		t.Errorf("%.2f allocations per proxied 4 KiB POST with an inline body, want at most 1", n)
	}
	if p.srv.Stats().InlineBodies == before {
		t.Fatal("the body was not inlined")
	}
}

// A body that fails to read ahead (here a chunked upload past
// max_request_body) is reported as before, after the header events: the
// agent gets its headers without a body, the client 413.
func TestInlineBodyReadErrorDeferred(t *testing.T) {
	log := &eventLog{}
	path := serveFrameAgent(t, "a", inlineCaps(true), log, nil)
	p, up := setup(t, nil, []string{"a"}, nil, map[string]agentSpec{"a": bufferedSpec(path)},
		func(d map[string]any) { d["MaxBody"] = "1KiB" })
	resp, _ := p.do(t, "POST", "/", io.MultiReader(strings.NewReader(threeChunks())))
	if resp.StatusCode != 413 || up.count() != 0 {
		t.Fatalf("status %d upstream hits %d", resp.StatusCode, up.count())
	}
	wantEvents(t, log, "a:headers")
}
