package dataplane_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

func bodyCaps(streaming bool) protocol.Capabilities {
	return protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true,
		HandlesResponseBody: true, SupportsStreaming: streaming, SupportsCancellation: true}
}

// chunkRecorder keeps a copy of every chunk an agent saw.
type chunkRecorder struct {
	mu     sync.Mutex
	chunks []protocol.BodyChunk
}

func (c *chunkRecorder) add(m *protocol.BodyChunk) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.chunks = append(c.chunks, protocol.BodyChunk{ChunkIndex: m.ChunkIndex, Data: append([]byte(nil), m.Data...), IsLast: m.IsLast, TotalSize: m.TotalSize})
}

func (c *chunkRecorder) all() []protocol.BodyChunk {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]protocol.BodyChunk(nil), c.chunks...)
}

// rewrite replaces chunks of 'a', drops chunks of 'b' and passes the rest.
func rewrite(rec *chunkRecorder) func(context.Context, *protocol.BodyChunk, *sdk.BodyReply) error {
	return func(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
		rec.add(m)
		switch {
		case len(m.Data) > 0 && m.Data[0] == 'a':
			r.Replace([]byte("AAA"))
		case len(m.Data) > 0 && m.Data[0] == 'b':
			r.Drop()
		default:
			r.Pass()
		}
		return nil
	}
}

func threeChunks() string {
	return strings.Repeat("a", 1024) + strings.Repeat("b", 1024) + strings.Repeat("c", 1024)
}

func TestStreamingRequestBodyMutation(t *testing.T) {
	rec := &chunkRecorder{}
	agent := &agentFuncs{Base: sdk.Base{Caps: bodyCaps(true)}, reqBody: rewrite(rec)}
	p, up := setup(t, nil, []string{"a"}, map[string]sdk.Handler{"a": agent},
		map[string]agentSpec{"a": {ReqMode: "streaming", RespMode: "none", Chunk: "1KiB"}}, nil)
	resp, _ := p.do(t, "POST", "/upload", strings.NewReader(threeChunks()))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	got := up.last(t)
	if want := "AAA" + strings.Repeat("c", 1024); string(got.Body) != want {
		t.Fatalf("upstream body %d bytes %q…, want %d", len(got.Body), clipS(string(got.Body)), len(want))
	}
	if len(got.TE) != 1 || got.TE[0] != "chunked" {
		t.Errorf("upstream transfer-encoding %v (a mutated body must be re-framed)", got.TE)
	}
	chunks := rec.all()
	if len(chunks) != 3 {
		t.Fatalf("agent saw %d chunks", len(chunks))
	}
	for i, c := range chunks {
		if int(c.ChunkIndex) != i || len(c.Data) != 1024 || c.IsLast != (i == 2) || c.TotalSize != 3072 {
			t.Errorf("chunk %d: index %d len %d last %v total %d", i, c.ChunkIndex, len(c.Data), c.IsLast, c.TotalSize)
		}
	}
}

func TestStreamingRequestBodyChunkedUpload(t *testing.T) {
	rec := &chunkRecorder{}
	agent := &agentFuncs{Base: sdk.Base{Caps: bodyCaps(true)}, reqBody: rewrite(rec)}
	p, up := setup(t, nil, []string{"a"}, map[string]sdk.Handler{"a": agent},
		map[string]agentSpec{"a": {ReqMode: "streaming", RespMode: "none", Chunk: "1KiB"}}, nil)
	// A chunked upload of unknown length reaches the agent as the client
	// flushes it: one event per client chunk here, then the end.
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
	for _, ch := range []string{"a", "b", "c"} {
		fmt.Fprintf(c, "400\r\n%s\r\n", strings.Repeat(ch, 1024))
		testutil.WaitFor(t, "chunk "+ch+" at the agent", func() bool { n := len(rec.all()); return n > 0 && rec.all()[n-1].Data[0] == ch[0] })
	}
	fmt.Fprintf(c, "0\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("response %v %v", resp, err)
	}
	if got := up.last(t); string(got.Body) != "AAA"+strings.Repeat("c", 1024) {
		t.Fatalf("upstream body %q", clipS(string(got.Body)))
	}
	chunks := rec.all()
	if n := len(chunks); n != 4 || !chunks[3].IsLast || len(chunks[3].Data) != 0 {
		t.Fatalf("agent chunks %d, want 3 data chunks and an empty last one", n)
	}
	for i, c := range chunks {
		if c.TotalSize != -1 || int(c.ChunkIndex) != i {
			t.Errorf("chunk %d: index %d total_size %d", i, c.ChunkIndex, c.TotalSize)
		}
	}
}

func TestStreamingResponseBodyMutation(t *testing.T) {
	rec := &chunkRecorder{}
	agent := &agentFuncs{Base: sdk.Base{Caps: bodyCaps(true)}, respBody: rewrite(rec)}
	p, _ := setup(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "3072")
		io.WriteString(w, threeChunks())
	}, []string{"a"}, map[string]sdk.Handler{"a": agent},
		map[string]agentSpec{"a": {ReqMode: "none", RespMode: "streaming", Chunk: "1KiB"}}, nil)
	resp, body := p.do(t, "GET", "/", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if want := "AAA" + strings.Repeat("c", 1024); body != want {
		t.Fatalf("client body %q, want %q…", clipS(body), clipS(want))
	}
	if resp.ContentLength != -1 || len(resp.TransferEncoding) == 0 {
		t.Errorf("content-length %d te %v: a mutated body must not keep the upstream's length", resp.ContentLength, resp.TransferEncoding)
	}
	if n := len(rec.all()); n != 3 {
		t.Errorf("agent saw %d chunks", n)
	}
}

func TestStreamingPassAfterFinalAllow(t *testing.T) {
	// The agent sees the first chunk, allows, and sees nothing more.
	var calls atomic.Int32
	agent := &agentFuncs{Base: sdk.Base{Caps: bodyCaps(true)}, reqBody: func(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
		calls.Add(1)
		return nil // Decision allow, final
	}}
	p, up := setup(t, nil, []string{"a"}, map[string]sdk.Handler{"a": agent},
		map[string]agentSpec{"a": {ReqMode: "streaming", RespMode: "none", Chunk: "1KiB"}}, nil)
	body := strings.Repeat("z", 10*1024)
	resp, _ := p.do(t, "POST", "/", strings.NewReader(body))
	if resp.StatusCode != 200 || string(up.last(t).Body) != body {
		t.Fatalf("status %d, upstream body %d bytes", resp.StatusCode, len(up.last(t).Body))
	}
	if calls.Load() != 1 {
		t.Errorf("agent called %d times after a final allow", calls.Load())
	}
}

func TestStreamingBlockMidUpload(t *testing.T) {
	agent := &agentFuncs{Base: sdk.Base{Caps: bodyCaps(true)}, reqBody: func(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
		if bytes.Contains(m.Data, []byte("EVIL")) {
			r.Decision.Kind = protocol.DecisionBlock
			r.Decision.Status = 403
			r.Decision.Body = []byte("nope")
			return nil
		}
		r.NeedMore()
		return nil
	}}
	p, _ := setup(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte("should not reach the client"))
	}, []string{"a"}, map[string]sdk.Handler{"a": agent},
		map[string]agentSpec{"a": {ReqMode: "streaming", RespMode: "none", Chunk: "1KiB"}}, nil)
	body := strings.Repeat("x", 4096) + "EVIL" + strings.Repeat("y", 4096)
	resp, got := p.do(t, "POST", "/", strings.NewReader(body))
	if resp.StatusCode != 403 || got != "nope" {
		t.Fatalf("got %d %q", resp.StatusCode, got)
	}
}

func TestBufferedBodyUnderLimit(t *testing.T) {
	var upstreamHit atomic.Bool
	var sawBeforeUpstream atomic.Bool
	rec := &chunkRecorder{}
	agent := &agentFuncs{Base: sdk.Base{Caps: bodyCaps(false)}, reqBody: func(ctx context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
		rec.add(m)
		if m.IsLast {
			sawBeforeUpstream.Store(!upstreamHit.Load())
		}
		return rewrite(&chunkRecorder{})(ctx, m, r)
	}}
	p, up := setup(t, func(w http.ResponseWriter, r *http.Request) {
		upstreamHit.Store(true)
		w.Write([]byte("ok"))
	}, []string{"a"}, map[string]sdk.Handler{"a": agent},
		map[string]agentSpec{"a": {ReqMode: "buffered", RespMode: "none", Limit: "4KiB", Chunk: "1KiB"}}, nil)
	resp, _ := p.do(t, "POST", "/", strings.NewReader(threeChunks()))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if !sawBeforeUpstream.Load() {
		t.Errorf("upstream contacted before the agent saw the whole body")
	}
	got := up.last(t)
	if string(got.Body) != "AAA"+strings.Repeat("c", 1024) || got.CL != int64(3+1024) || len(got.TE) != 0 {
		t.Errorf("upstream body %q cl %d te %v: a buffered rewrite keeps an exact Content-Length", clipS(string(got.Body)), got.CL, got.TE)
	}
	if n := len(rec.all()); n != 3 {
		t.Errorf("agent saw %d chunks", n)
	}
}

func TestBufferedBlockBeforeUpstream(t *testing.T) {
	agent := &agentFuncs{Base: sdk.Base{Caps: bodyCaps(false)}, reqBody: func(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
		if !m.IsLast {
			r.NeedMore()
			return nil
		}
		r.Decision.Kind = protocol.DecisionBlock
		r.Decision.Status = 422
		return nil
	}}
	p, up := setup(t, nil, []string{"a"}, map[string]sdk.Handler{"a": agent},
		map[string]agentSpec{"a": {ReqMode: "buffered", RespMode: "none", Limit: "64KiB", Chunk: "1KiB"}}, nil)
	resp, _ := p.do(t, "POST", "/", strings.NewReader(strings.Repeat("q", 5000)))
	if resp.StatusCode != 422 || up.count() != 0 {
		t.Fatalf("status %d, upstream hits %d", resp.StatusCode, up.count())
	}
}

func TestBufferedOverLimit(t *testing.T) {
	for _, tc := range []struct {
		name, action string
		chunked      bool
	}{
		{"reject", "reject", false},
		{"reject-chunked", "reject", true},
		{"skip", "skip", false},
		{"skip-chunked", "skip", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &chunkRecorder{}
			agent := &agentFuncs{Base: sdk.Base{Caps: bodyCaps(false)}, reqBody: rewrite(rec)}
			p, up := setup(t, nil, []string{"a"}, map[string]sdk.Handler{"a": agent},
				map[string]agentSpec{"a": {ReqMode: "buffered", RespMode: "none", Limit: "2KiB", OverLimit: tc.action, Chunk: "1KiB"}}, nil)
			var body io.Reader = strings.NewReader(threeChunks())
			if tc.chunked {
				body = io.MultiReader(body)
			}
			resp, _ := p.do(t, "POST", "/", body)
			if n := len(rec.all()); n != 0 {
				t.Errorf("agent saw %d chunks of an over-limit body", n)
			}
			if tc.action == "reject" {
				if resp.StatusCode != 413 || up.count() != 0 {
					t.Fatalf("status %d upstream hits %d", resp.StatusCode, up.count())
				}
				return
			}
			if resp.StatusCode != 200 || resp.Header.Get("X-Sidecar-Inspection") != "skipped" {
				t.Fatalf("status %d inspection header %q", resp.StatusCode, resp.Header.Get("X-Sidecar-Inspection"))
			}
			if got := up.last(t); string(got.Body) != threeChunks() || got.Header.Get("X-Sidecar-Inspection") != "skipped" {
				t.Errorf("upstream body %d bytes, mark %q", len(got.Body), got.Header.Get("X-Sidecar-Inspection"))
			}
			if st := p.srv.Stats(); st.InspectionSkipped != 1 {
				t.Errorf("skipped counter %d", st.InspectionSkipped)
			}
		})
	}
}

func TestBufferedResponseBody(t *testing.T) {
	agent := &agentFuncs{Base: sdk.Base{Caps: bodyCaps(false)}, respBody: func(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
		r.Replace(bytes.ReplaceAll(m.Data, []byte("secret"), []byte("******")))
		return nil
	}}
	p, _ := setup(t, func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("the secret is out, secret!"))
	}, []string{"a"}, map[string]sdk.Handler{"a": agent},
		map[string]agentSpec{"a": {ReqMode: "none", RespMode: "buffered"}}, nil)
	resp, body := p.do(t, "GET", "/", nil)
	if resp.StatusCode != 200 || body != "the ****** is out, ******!" || resp.ContentLength != int64(len(body)) {
		t.Fatalf("got %d %q cl %d", resp.StatusCode, body, resp.ContentLength)
	}
}

func TestResponseBlockReplacesUpstreamResponse(t *testing.T) {
	agent := &agentFuncs{Base: sdk.Base{Caps: protocol.Capabilities{HandlesResponseHeaders: true}},
		respHeaders: func(_ context.Context, m *protocol.ResponseHeaders, d *protocol.Decision) error {
			if m.StatusCode == 500 {
				d.Kind = protocol.DecisionBlock
				d.Status = 502
				d.Body = []byte("upstream error hidden")
			}
			return nil
		}}
	p, _ := setup(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Stack", "trace")
		w.WriteHeader(500)
		w.Write([]byte("panic: stack trace here"))
	}, []string{"a"}, map[string]sdk.Handler{"a": agent}, nil, nil)
	resp, body := p.do(t, "GET", "/", nil)
	if resp.StatusCode != 502 || body != "upstream error hidden" || resp.Header.Get("X-Stack") != "" {
		t.Fatalf("got %d %q %v", resp.StatusCode, body, resp.Header)
	}
	// The connection pool survives the discarded upstream body.
	resp, _ = p.do(t, "GET", "/", nil)
	if resp.StatusCode != 502 {
		t.Fatalf("second request %d", resp.StatusCode)
	}
}

func clipS(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

func TestStreamingResponseEventsAreNotHeldBack(t *testing.T) {
	// A streamed response of unknown length reaches the client event by
	// event through a response-body agent: the upstream only sends the
	// second event after the client has seen the first.
	rec := &chunkRecorder{}
	agent := &agentFuncs{Base: sdk.Base{Caps: bodyCaps(true)}, respBody: rewrite(rec)}
	clientGotFirst := make(chan struct{})
	p, _ := setup(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-clientGotFirst:
		case <-time.After(hangGuard):
		}
		io.WriteString(w, "data: two\n\n")
	}, []string{"a"}, map[string]sdk.Handler{"a": agent},
		map[string]agentSpec{"a": {ReqMode: "none", RespMode: "streaming"}}, nil)
	resp, err := p.client.Get(p.url("/events"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "data: one\n" {
		t.Fatalf("first event %q %v", line, err)
	}
	close(clientGotFirst)
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "\ndata: two\n\n" {
		t.Fatalf("rest %q %v", rest, err)
	}
	if n := len(rec.all()); n < 2 {
		t.Errorf("agent saw %d chunks", n)
	}
}
