package ratelog

import "testing"

// TestRateLog: a burst passes, the rest is suppressed and its count
// reported with the next line of a new window.
func TestRateLog(t *testing.T) {
	var r Limit
	for i := 0; i < Burst; i++ {
		if ok, _ := r.Allow(); !ok {
			t.Fatalf("line %d of the burst suppressed", i)
		}
	}
	for i := 0; i < 5; i++ {
		if ok, _ := r.Allow(); ok {
			t.Fatal("line past the burst allowed")
		}
	}
	r.mu.Lock()
	r.start = r.start.Add(-Window) // the window passed
	r.mu.Unlock()
	ok, suppressed := r.Allow()
	if !ok || suppressed != 5 {
		t.Fatalf("new window: ok %v suppressed %d, want true 5", ok, suppressed)
	}
}
