package dataplane_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/dataplane"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

func allEvents() protocol.Capabilities {
	return protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true, HandlesResponseHeaders: true,
		HandlesResponseBody: true, SupportsStreaming: true, SupportsCancellation: true}
}

// shadowLog records, per request id on the agent's side, the events a
// shadow agent got and the body bytes.
type shadowLog struct {
	mu     sync.Mutex
	events map[uint64][]string
	uri    map[uint64]string
	body   map[uint64]*[2]bytes.Buffer
	done   chan uint64 // a request's last response chunk arrived
}

func newShadowLog() *shadowLog {
	return &shadowLog{events: map[uint64][]string{}, uri: map[uint64]string{}, body: map[uint64]*[2]bytes.Buffer{}, done: make(chan uint64, 64)}
}

func (l *shadowLog) add(id uint64, e string) {
	l.mu.Lock()
	l.events[id] = append(l.events[id], e)
	l.mu.Unlock()
}

func (l *shadowLog) chunk(p int, m *protocol.BodyChunk) {
	l.mu.Lock()
	b := l.body[m.RequestID]
	if b == nil {
		b = new([2]bytes.Buffer)
		l.body[m.RequestID] = b
	}
	b[p].Write(m.Data)
	l.events[m.RequestID] = append(l.events[m.RequestID], fmt.Sprintf("%s %d %v", [2]string{"reqb", "respb"}[p], m.ChunkIndex, m.IsLast))
	l.mu.Unlock()
}

func (l *shadowLog) handler() *agentFuncs {
	return &agentFuncs{
		Base: sdk.Base{Caps: allEvents()},
		reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, _ *protocol.Decision) error {
			l.mu.Lock()
			l.uri[m.RequestID] = string(m.URI)
			l.mu.Unlock()
			l.add(m.RequestID, "reqh")
			return nil
		},
		reqBody: func(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
			l.chunk(0, m)
			r.Pass()
			return nil
		},
		respHeaders: func(_ context.Context, m *protocol.ResponseHeaders, _ *protocol.Decision) error {
			l.add(m.RequestID, fmt.Sprintf("resph %d %v", m.StatusCode, m.HasBody))
			return nil
		},
		respBody: func(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
			l.chunk(1, m)
			r.Pass()
			if m.IsLast {
				l.done <- m.RequestID
			}
			return nil
		},
	}
}

// checkConversation checks the events of one request: RequestHeaders,
// the request body chunks 0, 1, … with only the last one marked last,
// ResponseHeaders, then the response body chunks likewise. The chunks
// follow the pieces the body arrived in, so their number is not fixed.
func checkConversation(t *testing.T, uri string, ev []string) {
	t.Helper()
	k := 0
	fail := func(why string) {
		t.Helper()
		t.Fatalf("request %s: %s at event %d:\n%s", uri, why, k, strings.Join(ev, "\n"))
	}
	if len(ev) == 0 || ev[0] != "reqh" {
		fail("no RequestHeaders first")
	}
	k = 1
	body := func(kind string) {
		for i := 0; ; i++ {
			if k >= len(ev) {
				fail("body " + kind + " not ended")
			}
			switch ev[k] {
			case fmt.Sprintf("%s %d false", kind, i):
				k++
			case fmt.Sprintf("%s %d true", kind, i):
				k++
				return
			default:
				fail("unexpected event")
			}
		}
	}
	body("reqb")
	if k >= len(ev) || ev[k] != "resph 200 true" {
		fail("no ResponseHeaders after the request body")
	}
	k++
	body("respb")
	if k != len(ev) {
		fail("events after the last response chunk")
	}
}

func shadowBytes(seed, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + (i*7+seed)%26)
	}
	return b
}

func shadowBodySetup(t *testing.T, watch sdk.Handler, up http.HandlerFunc, data map[string]any) (*proxy, *upstream) {
	t.Helper()
	u := newUpstream(t, up)
	guard := serveAgent(t, &agentFuncs{Base: sdk.Base{Caps: headersOnly()}})
	watchPath := serveAgent(t, watch)
	vals := map[string]any{"Upstream": u.addr(), "Guard": guard, "Watch": watchPath, "Queue": 4096, "Workers": 4, "Bytes": "8MiB", "Chunk": "1KiB"}
	for k, v := range data {
		vals[k] = v
	}
	cfg := configText(t, shadowConfig, vals)
	agents := map[string]agentmux.Agent{
		"guard": udsAgent(t, "guard", guard, nil),
		"watch": udsAgent(t, "watch", watchPath, func(c *udsclient.Config) { c.MessageTimeout = 5 * time.Second }),
	}
	return startProxy(t, cfg, agents, nil), u
}

// A shadow agent that handles bodies and responses gets every event of
// multi-chunk POSTs and their responses, in order per request, with the
// exact bytes — several requests at once over several workers — and no
// request waits for it.
func TestShadowGetsEveryEventInOrder(t *testing.T) {
	const reqLen, respLen, n = 5000, 100_000, 4
	resp := shadowBytes(3, respLen)
	l := newShadowLog()
	p, up := shadowBodySetup(t, l.handler(), func(w http.ResponseWriter, r *http.Request) {
		w.Write(resp)
	}, nil)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, body := p.do(t, "POST", fmt.Sprintf("/r%d", i), bytes.NewReader(shadowBytes(i, reqLen)))
			if res.StatusCode != 200 || body != string(resp) {
				t.Errorf("request %d: status %d, %d bytes", i, res.StatusCode, len(body))
			}
		}()
	}
	wg.Wait()
	if up.count() != n {
		t.Fatalf("upstream saw %d requests, want %d", up.count(), n)
	}
	for i := 0; i < n; i++ {
		<-l.done
	}
	st := waitShadow(t, p, func(s dataplane.ShadowStatus) bool { return s.Waiting == 0 })
	events := 0
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.events) != n {
		t.Fatalf("shadow agent saw %d requests, want %d", len(l.events), n)
	}
	seen := map[string]bool{}
	for id, got := range l.events {
		uri := l.uri[id]
		var i int
		if _, err := fmt.Sscanf(uri, "/r%d", &i); err != nil || seen[uri] {
			t.Fatalf("request %d: uri %q", id, uri)
		}
		seen[uri] = true
		checkConversation(t, uri, got)
		events += len(got)
		b := l.body[id]
		if !bytes.Equal(b[0].Bytes(), shadowBytes(i, reqLen)) || !bytes.Equal(b[1].Bytes(), resp) {
			t.Fatalf("request %s: shadow got %d request and %d response body bytes, not the ones sent", uri, b[0].Len(), b[1].Len())
		}
	}
	if st.Dropped != 0 || st.Failed != 0 || st.WouldBlock != 0 || st.Queued != uint64(events) || st.PeakWaitingBytes <= 0 {
		t.Fatalf("shadow counters %+v, want %d events queued", st, events)
	}
}

// A shadow agent's block on a body chunk and its body mutations are
// counted, never applied: the upstream gets the whole body, the client
// the upstream's answer; the conversation ends at the would-be block.
func TestShadowBodyBlockIsOnlyCounted(t *testing.T) {
	l := newShadowLog()
	h := l.handler()
	h.reqBody = func(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
		l.chunk(0, m)
		switch m.ChunkIndex {
		case 0:
			r.Replace([]byte("changed"))
		case 2:
			r.UseMutation = false
			r.Decision.Kind = protocol.DecisionBlock
			r.Decision.Status = 403
			r.Decision.Audit.RuleIDs = [][]byte{[]byte("body-rule")}
		default:
			r.Pass()
		}
		return nil
	}
	p, up := shadowBodySetup(t, h, nil, nil)
	body := shadowBytes(1, 4000)
	res, got := p.do(t, "POST", "/upload", bytes.NewReader(body))
	if res.StatusCode != 200 || got != "hello from upstream" {
		t.Fatalf("status %d %q, want the upstream's answer", res.StatusCode, got)
	}
	if !bytes.Equal(up.last(t).Body, body) {
		t.Fatal("the upstream did not get the body as sent")
	}
	st := waitShadow(t, p, func(s dataplane.ShadowStatus) bool { return s.WouldBlock == 1 && s.Waiting == 0 })
	if st.ByStatus["403"] != 1 || st.ByRule["body-rule"] != 1 || st.WouldMutate != 1 || st.Dropped != 0 || st.Failed != 0 {
		t.Fatalf("shadow counters %+v", st)
	}
	// Once the request is over, nothing more reaches the agent.
	p.do(t, "GET", "/next", nil)
	waitShadow(t, p, func(s dataplane.ShadowStatus) bool { return s.Allowed >= 4 && s.Waiting == 0 })
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, ev := range l.events {
		if l.uri[id] != "/upload" {
			continue
		}
		if want := "reqh\nreqb 0 false\nreqb 1 false\nreqb 2 false"; strings.Join(ev, "\n") != want {
			t.Fatalf("events after the would-be block:\n%s\nwant\n%s", strings.Join(ev, "\n"), want)
		}
	}
	if !strings.Contains(p.logs.String(), "shadow agent would block") || !strings.Contains(p.logs.String(), "request_body") {
		t.Fatalf("no log line for the would-be block:\n%s", p.logs.String())
	}
}

// A slow shadow agent with a small byte budget delays nothing: every
// request completes while it holds its first event, the conversations
// that do not fit are dropped and counted, and the queued body bytes
// never exceed the budget.
func TestShadowByteBudget(t *testing.T) {
	release := make(chan struct{})
	held := make(chan struct{}, 1)
	l := newShadowLog()
	h := l.handler()
	h.reqHeaders = func(ctx context.Context, m *protocol.RequestHeaders, _ *protocol.Decision) error {
		select {
		case held <- struct{}{}:
			// The first event holds the only worker until release.
			select {
			case <-release:
			case <-ctx.Done():
			}
		default:
		}
		time.Sleep(time.Millisecond) // slow: a millisecond per event
		return nil
	}
	slowBody := func(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
		time.Sleep(time.Millisecond)
		r.Pass()
		return nil
	}
	h.reqBody, h.respBody = slowBody, slowBody
	const budget = 64 << 10
	p, up := shadowBodySetup(t, h, nil, map[string]any{"Workers": 1, "Bytes": "64KiB", "Chunk": "16KiB"})
	const n = 8
	body := shadowBytes(2, 40_000)
	for i := 0; i < n; i++ {
		if res, _ := p.do(t, "POST", "/", bytes.NewReader(body)); res.StatusCode != 200 {
			t.Fatalf("request %d: status %d", i, res.StatusCode)
		}
	}
	if up.count() != n {
		t.Fatalf("upstream saw %d, want %d", up.count(), n)
	}
	st := shadowStatus(t, p)
	// The first conversation's 40000 bytes wait behind its held headers;
	// the next one's do not fit with them: dropped.
	if st.Dropped < n-2 || st.PeakWaitingBytes > budget || st.WaitingBytes > budget || st.PeakWaitingBytes < 40_000 {
		t.Fatalf("shadow counters %+v, want drops and at most %d bytes queued", st, budget)
	}
	if !strings.Contains(p.logs.String(), "shadow agent queue full") {
		t.Fatalf("no log line for the drops:\n%s", p.logs.String())
	}
	close(release)
	st = waitShadow(t, p, func(s dataplane.ShadowStatus) bool { return s.Waiting == 0 && s.WaitingBytes == 0 })
	if st.PeakWaitingBytes > budget || st.Failed != 0 {
		t.Fatalf("after release: %+v", st)
	}
	// The budget is free again: a request now is seen whole.
	before := st.Dropped
	if res, _ := p.do(t, "POST", "/", bytes.NewReader(body)); res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	st = waitShadow(t, p, func(s dataplane.ShadowStatus) bool { return s.Waiting == 0 })
	if st.Dropped != before {
		t.Fatalf("a request after release was dropped: %+v", st)
	}
}

// A shadow agent that is down delays no request, bodies included; each
// request's conversation fails once and is counted.
func TestShadowDownWithBodies(t *testing.T) {
	p, u := shadowDownSetup(t, allEvents(), map[string]any{"Bytes": "64KiB", "Chunk": "1KiB"})
	body := shadowBytes(5, 3000)
	for i := 0; i < 4; i++ {
		if res, _ := p.do(t, "POST", "/", bytes.NewReader(body)); res.StatusCode != 200 {
			t.Fatalf("request %d: status %d", i, res.StatusCode)
		}
	}
	if !bytes.Equal(u.last(t).Body, body) {
		t.Fatal("the upstream did not get the body")
	}
	st := waitShadow(t, p, func(s dataplane.ShadowStatus) bool { return s.Failed == 4 && s.Waiting == 0 })
	if st.Allowed != 0 || st.Dropped != 0 || st.WaitingBytes != 0 {
		t.Fatalf("down shadow: %+v", st)
	}
}
