package sdk

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestHandlerContextDeadline: a handler's context has its event's
// deadline (timeout_ms from when the event was dispatched); once it has
// passed, Err says context.DeadlineExceeded without Done having been
// asked for, Done is closed, and no answer is sent. An event without
// timeout_ms gets no deadline.
func TestHandlerContextDeadline(t *testing.T) {
	type seen struct {
		ok        bool
		left      time.Duration
		err       error
		doneAfter bool
	}
	got := make(chan seen, 2)
	h := &funcHandler{headers: func(ctx context.Context, id uint64) {
		dl, ok := ctx.Deadline()
		s := seen{ok: ok, left: time.Until(dl)}
		if id == 1 {
			for time.Now().Before(dl) { // past the deadline, without Done
				time.Sleep(time.Millisecond)
			}
			s.err = ctx.Err()
			select {
			case <-ctx.Done():
				s.doneAfter = true
			default:
			}
		}
		got <- s
	}}
	out := &recordSender{got: make(chan uint64, 4)}
	d := NewDispatcher(context.Background(), h, out)
	ev := headersEvent(1)
	ev.RequestHeaders.TimeoutMs = 20
	d.Dispatch(ev)
	s := <-got
	if !s.ok || s.left > 20*time.Millisecond {
		t.Errorf("deadline set %v, %v away; want at most 20ms", s.ok, s.left)
	}
	if !errors.Is(s.err, context.DeadlineExceeded) || !s.doneAfter {
		t.Errorf("after the deadline: Err %v, Done closed %v; want DeadlineExceeded, true", s.err, s.doneAfter)
	}
	d.Dispatch(headersEvent(2))
	if s := <-got; s.ok {
		t.Error("an event without timeout_ms has a deadline")
	}
	if id := waitReply(t, out); id != 2 {
		t.Fatalf("reply for %d, want 2", id)
	}
	d.Close() // every handler returned
	select {
	case id := <-out.got:
		t.Fatalf("a reply for %d after its deadline", id)
	default:
	}
}

// TestQueuedBehindRequestDeadline: an event queued behind another event
// of its request (a pipelining proxy) gets a context of its own, with its
// own deadline, and is dropped when that passed before its turn.
func TestQueuedBehindRequestDeadline(t *testing.T) {
	release := make(chan struct{})
	ran := make(chan uint32, 4)
	var first context.Context
	h := &funcHandler{body: func(ctx context.Context, _ uint64, index uint32) {
		if index == 0 {
			first = ctx
			<-release
		}
		ran <- index
	}}
	out := &recordSender{got: make(chan uint64, 4)}
	d := NewDispatcher(context.Background(), h, out)
	defer d.Close()
	before := ReadStats()
	d.Dispatch(bodyEvent(7, 0))
	late := bodyEvent(7, 1)
	late.Chunk.TimeoutMs = 1
	d.Dispatch(late)
	d.Dispatch(bodyEvent(7, 2))
	time.Sleep(5 * time.Millisecond) // chunk 1's deadline passes in the queue
	close(release)
	if i := <-ran; i != 0 {
		t.Fatalf("ran chunk %d first", i)
	}
	if i := <-ran; i != 2 {
		t.Fatalf("ran chunk %d, want 2 (1 expired)", i)
	}
	if first.Err() == nil {
		t.Error("chunk 0's context still live once chunk 2 ran")
	}
	if got := ReadStats().DroppedExpired - before.DroppedExpired; got != 1 {
		t.Errorf("DroppedExpired grew by %d, want 1", got)
	}
}

// TestLimiterOrderAndCancel: with one slot, events wait in arrival order;
// a canceled one leaves the queue at once and is never handled.
func TestLimiterOrderAndCancel(t *testing.T) {
	release := make(chan struct{})
	ran := make(chan uint64, 8)
	h := &funcHandler{headers: func(_ context.Context, id uint64) {
		if id == 1 {
			<-release
		}
		ran <- id
	}}
	out := &recordSender{got: make(chan uint64, 8)}
	lim := NewLimiter(1)
	d := NewDispatcher(context.Background(), h, out)
	d.SetLimiter(lim)
	defer d.Close()
	for id := uint64(1); id <= 4; id++ {
		d.Dispatch(headersEvent(id))
	}
	if n := lim.Waiting(); n != 3 {
		t.Fatalf("%d waiting, want 3", n)
	}
	d.Cancel(3)
	if n := lim.Waiting(); n != 2 {
		t.Fatalf("%d waiting after a cancel, want 2", n)
	}
	close(release)
	for _, want := range []uint64{1, 2, 4} {
		select {
		case id := <-ran:
			if id != want {
				t.Fatalf("ran %d, want %d", id, want)
			}
		case <-time.After(serveHangGuard):
			t.Fatal("handler did not run")
		}
	}
	d.Dispatch(headersEvent(5)) // the slot was given back
	if id := <-ran; id != 5 {
		t.Fatalf("ran %d, want 5", id)
	}
}
