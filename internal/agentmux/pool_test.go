package agentmux

import (
	"errors"
	"testing"

	"github.com/zentinelproxy/sidecar/protocol"
)

// nopLink accepts every event and never answers: enough to test slot
// accounting and selection, which happen before anything is sent.
type nopLink struct{ closed bool }

func (l *nopLink) Send(protocol.Message, Wait) error  { return nil }
func (l *nopLink) SendControl(protocol.Message) error { return nil }
func (l *nopLink) Close() error                       { l.closed = true; return nil }

func TestPoolPicksLeastInFlight(t *testing.T) {
	p := NewPool("a", "test")
	if _, err := p.Begin(Wait{}); !errors.Is(err, ErrAgentUnavailable) {
		t.Fatalf("empty pool: err = %v", err)
	}
	s1 := NewSession(&nopLink{}, protocol.Capabilities{}, SessionConfig{Name: "a", MaxInFlight: 10})
	s2 := NewSession(&nopLink{}, protocol.Capabilities{MaxConcurrentRequests: 2}, SessionConfig{Name: "a", MaxInFlight: 10})
	p.Add(s1)
	p.Add(s2)
	if s2.Limit() != 2 {
		t.Fatalf("agent limit not applied: %d", s2.Limit())
	}
	var open []*Exchange
	for i := 0; i < 8; i++ {
		e, err := p.Begin(Wait{})
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, e)
	}
	// s2 fills to its limit of 2; everything else lands on s1.
	if s1.InFlight() != 6 || s2.InFlight() != 2 {
		t.Fatalf("in flight s1=%d s2=%d, want 6 and 2", s1.InFlight(), s2.InFlight())
	}
	ids := map[uint64]bool{}
	for _, e := range open {
		if ids[e.RequestID()] {
			t.Fatalf("request id %d reused while in flight", e.RequestID())
		}
		ids[e.RequestID()] = true
		e.Finish()
	}
	if s1.InFlight() != 0 || s2.InFlight() != 0 {
		t.Fatal("slots not released")
	}
	s1.Fail(errors.New("gone"))
	e, err := p.Begin(Wait{})
	if err != nil {
		t.Fatal(err)
	}
	if e.s != s2 {
		t.Fatal("failed session chosen")
	}
	e.Finish()
	p.Remove(s2)
	p.Remove(s1)
	if p.Len() != 0 {
		t.Fatal("sessions not removed")
	}
}

func TestSessionFailWakesWaiters(t *testing.T) {
	s := NewSession(&nopLink{}, protocol.Capabilities{}, SessionConfig{Name: "a", MaxInFlight: 4})
	e, err := s.Begin(Wait{})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := e.RequestHeaders(Wait{}, &protocol.RequestHeaders{})
		errc <- err
	}()
	for {
		s.mu.Lock()
		st := e.state
		s.mu.Unlock()
		if st == stateWaiting {
			break
		}
	}
	s.Fail(errors.New("reset"))
	if err := <-errc; !errors.Is(err, ErrAgentConnLost) {
		t.Fatalf("err = %v", err)
	}
	e.Finish()
	if _, err := s.Begin(Wait{}); !errors.Is(err, ErrAgentConnLost) {
		t.Fatalf("begin after fail: %v", err)
	}
}

func TestDeliverUnknownIsLate(t *testing.T) {
	s := NewSession(&nopLink{}, protocol.Capabilities{}, SessionConfig{Name: "a", MaxInFlight: 4})
	r := &Reply{Type: protocol.TypeDecision}
	r.Decision.RequestID = 999999
	if got := s.Deliver(r); got != r {
		t.Fatal("late reply buffer not handed back")
	}
	if s.Stats().Late != 1 {
		t.Fatal("late reply not counted")
	}
}

// batchLink reports batched writes, as the UDS and reverse links do.
type batchLink struct {
	nopLink
	writes, frames uint64
}

func (l *batchLink) Batching() (writes, frames uint64) { return l.writes, l.frames }

// TestPoolSumsBatching: the writes of an agent's connections and the frames
// they carried add up over its live sessions, the sessions that left, and
// a Multi's members.
func TestPoolSumsBatching(t *testing.T) {
	p := NewPool("a", "uds")
	s1 := NewSession(&batchLink{writes: 3, frames: 10}, protocol.Capabilities{}, SessionConfig{Name: "a"})
	s2 := NewSession(&batchLink{writes: 5, frames: 7}, protocol.Capabilities{}, SessionConfig{Name: "a"})
	s3 := NewSession(&nopLink{}, protocol.Capabilities{}, SessionConfig{Name: "a"}) // reports none
	p.Add(s1)
	p.Add(s2)
	p.Add(s3)
	if st := s1.Stats(); st.Writes != 3 || st.FramesWritten != 10 {
		t.Fatalf("session stats %+v", st)
	}
	p.Remove(s1)
	st := p.Snapshot()
	if st.Writes != 8 || st.FramesWritten != 17 {
		t.Fatalf("pool: writes %d frames %d, want 8 and 17", st.Writes, st.FramesWritten)
	}
	q := NewPool("a", "uds")
	q.Add(NewSession(&batchLink{writes: 1, frames: 2}, protocol.Capabilities{}, SessionConfig{Name: "a"}))
	if m := NewMulti("a", "uds", []Agent{p, q}, false).Snapshot(); m.Writes != 9 || m.FramesWritten != 19 {
		t.Fatalf("multi: writes %d frames %d, want 9 and 19", m.Writes, m.FramesWritten)
	}
}
