package udsclient_test

import (
	"errors"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
)

// TestWaitEndsExchangeOnHungAgent: an exchange waiting on an agent that
// never answers ends with ErrAgentTimeout at the deadline of its Wait and
// with ErrAgentCanceled when its cancel channel closes (the session's own
// message timeout is far away), and the agent's handler is canceled in
// both cases. Waits for an in-flight slot end the same way.
func TestWaitEndsExchangeOnHungAgent(t *testing.T) {
	path := testutil.SocketPath(t)
	h := newTestHandler(allCaps)
	testagent.Serve(t, path, h)
	c := newClient(t, path, func(cfg *udsclient.Config) {
		cfg.MessageTimeout = time.Minute
		cfg.MaxInFlight = 1
		cfg.MaxQueue = 4
	})
	handlerCanceled := func(id uint64) {
		t.Helper()
		select {
		case got := <-h.canceled:
			if got != id {
				t.Fatalf("handler of request %d canceled, want %d", got, id)
			}
		case <-time.After(hangGuard):
			t.Fatalf("handler of request %d not canceled", id)
		}
	}

	// The deadline.
	ex, err := c.Begin(agentmux.Wait{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = ex.RequestHeaders(agentmux.Wait{Deadline: time.Now().Add(50 * time.Millisecond)}, headers("x-block", "1"))
	if !errors.Is(err, agentmux.ErrAgentTimeout) {
		t.Fatalf("deadline: %v, want ErrAgentTimeout", err)
	}
	handlerCanceled(ex.RequestID())

	// While that exchange holds the only slot, Begin waits and gives up
	// at its deadline or its cancel, whichever comes first.
	if _, err := c.Begin(agentmux.Wait{Deadline: time.Now().Add(20 * time.Millisecond)}); !errors.Is(err, agentmux.ErrAgentTimeout) {
		t.Fatalf("slot wait with a deadline: %v, want ErrAgentTimeout", err)
	}
	gone := make(chan struct{})
	close(gone)
	if _, err := c.Begin(agentmux.Wait{Deadline: time.Now().Add(time.Hour), Cancel: gone}); !errors.Is(err, agentmux.ErrAgentCanceled) {
		t.Fatalf("slot wait canceled: %v, want ErrAgentCanceled", err)
	}
	ex.Finish()

	// The cancel channel, closed while the handler runs.
	ex, err = c.Begin(agentmux.Wait{})
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Finish()
	cancel := make(chan struct{})
	go func() {
		for h.seen.Load() < 2 { // the handler of this request runs
			time.Sleep(time.Millisecond)
		}
		close(cancel)
	}()
	_, err = ex.RequestHeaders(agentmux.Wait{Deadline: time.Now().Add(time.Hour), Cancel: cancel}, headers("x-block", "1"))
	if !errors.Is(err, agentmux.ErrAgentCanceled) {
		t.Fatalf("cancel: %v, want ErrAgentCanceled", err)
	}
	handlerCanceled(ex.RequestID())
	if st := c.Snapshot(); st.Timeouts != 2 {
		t.Fatalf("timeouts counted %d, want 2 (one reply, one slot)", st.Timeouts)
	}
}
