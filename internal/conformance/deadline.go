package conformance

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// testEventTimeout: every event an agent answers carries timeout_ms, the
// wait the proxy gives its answer (the caller's deadline when it is
// earlier than the message timeout), and the handler's context has a
// deadline no later than that from when it runs.
func testEventTimeout(t *testing.T, dial Dial) {
	// report answers an event with what its handler saw: the event's
	// timeout_ms, and whether its context's deadline is set and at most
	// that far away.
	report := func(ctx context.Context, ms uint32) []protocol.HeaderOp {
		dl, ok := ctx.Deadline()
		within := ok && time.Until(dl) <= time.Duration(ms)*time.Millisecond
		return []protocol.HeaderOp{setOp("x-timeout-ms", strconv.FormatUint(uint64(ms), 10)), setOp("x-deadline-within", strconv.FormatBool(within))}
	}
	h := &handler{Base: sdk.Base{Caps: allCaps}}
	h.reqHeaders = func(ctx context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
		d.NeedsMore = true
		d.RequestHeaderOps = append(d.RequestHeaderOps, report(ctx, m.TimeoutMs)...)
		return nil
	}
	h.reqBody = func(ctx context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
		r.Decision.RequestHeaderOps = append(r.Decision.RequestHeaderOps, report(ctx, m.TimeoutMs)...)
		return nil
	}
	h.respHeaders = func(ctx context.Context, m *protocol.ResponseHeaders, d *protocol.Decision) error {
		d.NeedsMore = true
		d.ResponseHeaderOps = append(d.ResponseHeaderOps, report(ctx, m.TimeoutMs)...)
		return nil
	}
	h.respBody = func(ctx context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
		r.Decision.ResponseHeaderOps = append(r.Decision.ResponseHeaderOps, report(ctx, m.TimeoutMs)...)
		return nil
	}
	a := dial(t, h)
	ex := begin(t, a)
	defer ex.Finish()
	// check reads what the agent saw from the reply's operations; the
	// timeout must lie in (lo, hi].
	check := func(event string, ops []protocol.HeaderOp, lo, hi uint64) {
		t.Helper()
		d := protocol.Decision{RequestHeaderOps: ops}
		ms, _ := op(&d, "x-timeout-ms")
		within, _ := op(&d, "x-deadline-within")
		v, err := strconv.ParseUint(ms, 10, 32)
		if err != nil || v <= lo || v > hi {
			t.Errorf("%s: the agent saw timeout_ms %q, want (%d, %d]", event, ms, lo, hi)
		}
		if within != "true" {
			t.Errorf("%s: the handler's context deadline is unset or later than timeout_ms", event)
		}
	}
	// The caller's deadline in 5s is earlier than the message timeout
	// (10s or more, see Dial).
	w := agentmux.Wait{Deadline: time.Now().Add(5 * time.Second)}
	r, err := ex.RequestHeaders(w, request("POST", "/t"))
	if err != nil {
		t.Fatal(err)
	}
	check("request headers", copyDecision(&r.Decision).RequestHeaderOps, 4000, 5000)
	// Without a deadline of the caller's: the message timeout.
	r, err = ex.BodyChunk(agentmux.Wait{}, protocol.PhaseRequest, &protocol.BodyChunk{Data: []byte("x"), IsLast: true, TotalSize: -1, Progress: -1})
	if err != nil {
		t.Fatal(err)
	}
	check("request body chunk", copyDecision(&r.Decision).RequestHeaderOps, 9999, 1<<32-1)
	r, err = ex.ResponseHeaders(w, &protocol.ResponseHeaders{StatusCode: 200, HasBody: true})
	if err != nil {
		t.Fatal(err)
	}
	check("response headers", copyDecision(&r.Decision).ResponseHeaderOps, 0, 5000)
	r, err = ex.BodyChunk(w, protocol.PhaseResponse, &protocol.BodyChunk{Data: []byte("y"), IsLast: true, TotalSize: -1, Progress: -1})
	if err != nil {
		t.Fatal(err)
	}
	check("response body chunk", copyDecision(&r.Decision).ResponseHeaderOps, 0, 5000)
}

// LimitedDial is a Dial whose agent serves h with lim as its sdk.Limiter
// (nil: none). The same contract as Dial otherwise.
type LimitedDial func(t *testing.T, h sdk.Handler, lim *sdk.Limiter) agentmux.Agent

// DeadlineCase is one conversation of the deadline suite.
type DeadlineCase struct {
	Name string
	Run  func(t *testing.T, dial LimitedDial)
}

// DeadlineCases are the conversations about events the proxy gave up on:
// the agent must not start work on them, and a handler's context ends at
// its event's deadline.
var DeadlineCases = []DeadlineCase{
	{"QueuedPastDeadlineNeverRuns", testQueuedPastDeadline},
	{"CanceledWhileQueuedNeverRuns", testCanceledWhileQueued},
	{"HandlerContextEndsAtDeadline", testContextEndsAtDeadline},
}

// RunDeadlines runs every deadline case as a subtest.
func RunDeadlines(t *testing.T, dial LimitedDial) {
	for _, c := range DeadlineCases {
		t.Run(c.Name, func(t *testing.T) { c.Run(t, dial) })
	}
}

// holdHandler holds the handler of /hold until release is closed, records
// the URI of every other request whose handler runs, and every OnCancel.
type holdHandler struct {
	handler
	held     chan struct{} // a /hold handler started
	release  chan struct{}
	mu       sync.Mutex
	ran      []string
	canceled map[uint64]bool
}

func newHoldHandler(caps protocol.Capabilities) *holdHandler {
	h := &holdHandler{handler: handler{Base: sdk.Base{Caps: caps}}, held: make(chan struct{}, 1),
		release: make(chan struct{}), canceled: map[uint64]bool{}}
	h.reqHeaders = func(_ context.Context, m *protocol.RequestHeaders, _ *protocol.Decision) error {
		if string(m.URI) == "/hold" {
			h.held <- struct{}{}
			select {
			case <-h.release:
			case <-time.After(wait):
			}
			return nil
		}
		h.mu.Lock()
		h.ran = append(h.ran, string(m.URI))
		h.mu.Unlock()
		return nil
	}
	return h
}

func (h *holdHandler) OnCancel(id uint64) {
	h.mu.Lock()
	h.canceled[id] = true
	h.mu.Unlock()
}

func (h *holdHandler) wasCanceled(id uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.canceled[id]
}

// hold starts a /hold request and returns once its handler holds the
// agent's only slot; done reports the request's end.
func hold(t *testing.T, a agentmux.Agent, h *holdHandler) (done <-chan error) {
	t.Helper()
	errc := make(chan error, 1)
	ex := begin(t, a)
	go func() {
		ctx, cancel := ctxWait()
		defer cancel()
		_, err := ex.RequestHeaders(agentmux.WaitFor(ctx), request("GET", "/hold"))
		ex.Finish()
		errc <- err
	}()
	select {
	case <-h.held:
	case <-time.After(wait):
		t.Fatal("the /hold handler never started")
	}
	return errc
}

// eventually waits (bounded) for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("%s: not after %v", what, wait)
		}
		time.Sleep(time.Millisecond)
	}
}

// testQueuedPastDeadline: with the agent's only handler slot held, two
// requests wait for it at the agent past their deadline (the proxy gives
// up; without cancellation it sends nothing more). Once the slot frees,
// neither handler runs: both are dropped, counted, and the handler hears
// of them through OnCancel. The next request is handled as usual.
func testQueuedPastDeadline(t *testing.T, dial LimitedDial) {
	caps := allCaps
	caps.SupportsCancellation = false
	h := newHoldHandler(caps)
	lim := sdk.NewLimiter(1)
	a := dial(t, h, lim)
	before := sdk.ReadStats()
	held := hold(t, a, h)
	var ids []uint64
	var sent time.Time
	for _, uri := range []string{"/late-1", "/late-2"} {
		ex := begin(t, a)
		ids = append(ids, ex.RequestID())
		sent = time.Now()
		_, err := ex.RequestHeaders(agentmux.Wait{Deadline: sent.Add(100 * time.Millisecond)}, request("GET", uri))
		ex.Finish()
		if !errors.Is(err, agentmux.ErrAgentTimeout) {
			t.Fatalf("%s: %v, want the proxy's timeout", uri, err)
		}
	}
	eventually(t, "both events waiting for the slot", func() bool { return lim.Waiting() == 2 })
	// The agent counts each deadline from when it read the event, a
	// little after the proxy sent it: leave that a wide margin.
	time.Sleep(time.Until(sent.Add(time.Second)))
	close(h.release)
	if err := <-held; err != nil {
		t.Fatalf("/hold: %v", err)
	}
	if d := get(t, a, "/after"); d.Kind != protocol.DecisionAllow {
		t.Fatalf("/after: %s", d.Kind)
	}
	h.mu.Lock()
	ran := strings.Join(h.ran, " ")
	h.mu.Unlock()
	if ran != "/after" {
		t.Errorf("handlers ran for %q, want only /after", ran)
	}
	for _, id := range ids {
		if !h.wasCanceled(id) {
			t.Errorf("OnCancel(%d) not called for the expired event", id)
		}
	}
	if got := sdk.ReadStats().DroppedExpired - before.DroppedExpired; got < 2 {
		t.Errorf("DroppedExpired grew by %d, want at least 2", got)
	}
	if n := lim.Waiting(); n != 0 {
		t.Errorf("%d events still waiting", n)
	}
}

// testCanceledWhileQueued: a request canceled (the client went away)
// while its event waits for the agent's only handler slot is dropped at
// once: it leaves the queue, and its handler never runs.
func testCanceledWhileQueued(t *testing.T, dial LimitedDial) {
	h := newHoldHandler(allCaps)
	lim := sdk.NewLimiter(1)
	a := dial(t, h, lim)
	before := sdk.ReadStats()
	held := hold(t, a, h)
	ex := begin(t, a)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := ex.RequestHeaders(agentmux.WaitFor(ctx), request("GET", "/gone"))
		errc <- err
	}()
	eventually(t, "the event waiting for the slot", func() bool { return lim.Waiting() == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, agentmux.ErrAgentCanceled) {
		t.Fatalf("/gone: %v, want ErrAgentCanceled", err)
	}
	ex.Finish()
	// The CancelRequest takes it out of the queue while the slot is
	// still held.
	eventually(t, "the canceled event leaving the queue", func() bool { return lim.Waiting() == 0 })
	if !h.wasCanceled(ex.RequestID()) {
		t.Error("OnCancel not called for the canceled request")
	}
	close(h.release)
	if err := <-held; err != nil {
		t.Fatalf("/hold: %v", err)
	}
	if d := get(t, a, "/after"); d.Kind != protocol.DecisionAllow {
		t.Fatalf("/after: %s", d.Kind)
	}
	h.mu.Lock()
	ran := strings.Join(h.ran, " ")
	h.mu.Unlock()
	if ran != "/after" {
		t.Errorf("handlers ran for %q, want only /after", ran)
	}
	if got := sdk.ReadStats().DroppedCanceled - before.DroppedCanceled; got < 1 {
		t.Errorf("DroppedCanceled grew by %d, want at least 1", got)
	}
}

// testContextEndsAtDeadline: a running handler's context ends with
// context.DeadlineExceeded when its event's timeout_ms has passed (the
// agent declares no cancellation, so nothing else ends it), and the
// Deadline it reports is when.
func testContextEndsAtDeadline(t *testing.T, dial LimitedDial) {
	caps := allCaps
	caps.SupportsCancellation = false
	type seen struct {
		err      error
		deadline time.Time
		ended    time.Time
	}
	got := make(chan seen, 1)
	h := &handler{Base: sdk.Base{Caps: caps}}
	h.reqHeaders = func(ctx context.Context, m *protocol.RequestHeaders, _ *protocol.Decision) error {
		dl, ok := ctx.Deadline()
		if !ok {
			got <- seen{err: errors.New("no deadline")}
			return nil
		}
		select {
		case <-ctx.Done():
			got <- seen{err: ctx.Err(), deadline: dl, ended: time.Now()}
		case <-time.After(wait):
			got <- seen{err: fmt.Errorf("context still live after %v (timeout_ms %d)", wait, m.TimeoutMs)}
		}
		return nil
	}
	a := dial(t, h, nil)
	ex := begin(t, a)
	defer ex.Finish()
	_, err := ex.RequestHeaders(agentmux.Wait{Deadline: time.Now().Add(200 * time.Millisecond)}, request("GET", "/slow"))
	if !errors.Is(err, agentmux.ErrAgentTimeout) {
		t.Fatalf("/slow: %v, want the proxy's timeout", err)
	}
	s := <-got
	if !errors.Is(s.err, context.DeadlineExceeded) {
		t.Fatalf("handler context ended with %v, want context.DeadlineExceeded", s.err)
	}
	if s.ended.Before(s.deadline) {
		t.Errorf("context ended at %v, before its deadline %v", s.ended, s.deadline)
	}
}
