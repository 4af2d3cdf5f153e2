package sdk

import (
	"context"
	"testing"
	"time"
)

// cancelHandler records OnCancel calls and whether the running handler's
// context had ended by then.
type cancelHandler struct {
	funcHandler
	running  chan context.Context
	canceled chan uint64
	ctxEnded chan bool
	runCtx   context.Context
}

func (h *cancelHandler) OnCancel(id uint64) {
	if h.runCtx != nil {
		h.ctxEnded <- h.runCtx.Err() != nil
	}
	h.canceled <- id
}

func TestCancelObserver(t *testing.T) {
	h := &cancelHandler{running: make(chan context.Context, 1), canceled: make(chan uint64, 4), ctxEnded: make(chan bool, 4)}
	release := make(chan struct{})
	h.headers = func(ctx context.Context, id uint64) {
		h.running <- ctx
		<-release
	}
	if _, ok := any(h).(CancelObserver); !ok {
		t.Fatal("not a CancelObserver")
	}
	out := &recordSender{got: make(chan uint64, 4)}
	d := NewDispatcher(context.Background(), h, out)
	defer d.Close()

	// A request with nothing in progress: only the observer hears of it.
	d.Cancel(42)
	if got := <-h.canceled; got != 42 {
		t.Fatalf("OnCancel(%d), want 42", got)
	}

	// A running handler: its context ends before OnCancel is called.
	d.Dispatch(headersEvent(7))
	select {
	case h.runCtx = <-h.running:
	case <-time.After(serveHangGuard):
		t.Fatal("handler did not start")
	}
	d.Cancel(7)
	if ended := <-h.ctxEnded; !ended {
		t.Error("OnCancel ran before the handler's context ended")
	}
	if got := <-h.canceled; got != 7 {
		t.Fatalf("OnCancel(%d), want 7", got)
	}
	close(release)
}
