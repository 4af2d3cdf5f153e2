package exchange

import (
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/dataplane/internal/clock"
)

// TestCancelChannelAcrossRequests: the pooled request state keeps its
// cancel channel for the next request only while it was never closed; a
// closed one is replaced, so a new request never starts canceled and a
// wait of the old request can never be woken by the new one.
func TestCancelChannelAcrossRequests(t *testing.T) {
	ex := testExchange()
	first := ex.cancelCh
	ex.resetCancel()
	if ex.cancelCh != first || ex.canceled() {
		t.Fatal("an unused cancel channel was replaced")
	}
	old := ex.streamWait(clock.Mono())
	ex.cancel()
	ex.cancel() // idempotent
	select {
	case <-old.Cancel:
	default:
		t.Fatal("cancel did not close the channel")
	}
	ex.resetCancel()
	if ex.cancelCh == first || ex.canceled() {
		t.Fatal("a closed cancel channel was kept for the next request")
	}
	select {
	case <-ex.streamWait(clock.Mono()).Cancel:
		t.Fatal("the next request starts canceled")
	default:
	}
}

// TestAgentWaitBudget: each call gets the deadline left in the agent's
// request budget, computed from the reading it is given, which it also
// passes on as the call's clock.
func TestAgentWaitBudget(t *testing.T) {
	ex := testExchange()
	ra := &routeAgent{timeout: time.Hour}
	sl := &slot{ra: ra}
	now := clock.Mono()
	w, ok := ex.agentWait(sl, now)
	if !ok || w.Cancel == nil || !w.Deadline.Equal(clock.At(now+time.Hour)) || !w.Now.Equal(clock.At(now)) {
		t.Fatalf("fresh budget: %+v %v", w, ok)
	}
	sl.spent = time.Hour
	if w, ok = ex.agentWait(sl, clock.Mono()); ok || w.Deadline.After(time.Now()) {
		t.Fatalf("spent budget: %+v %v", w, ok)
	}
	ra.timeout = 0
	if w, ok = ex.agentWait(sl, clock.Mono()); !ok || !w.Deadline.IsZero() || w.Now.IsZero() {
		t.Fatalf("no budget: %+v %v", w, ok)
	}
}
