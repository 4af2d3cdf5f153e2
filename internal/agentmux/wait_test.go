package agentmux

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
)

// backedUpLink never has room for an event: Send fails with sendErr, as
// a transport's does when the event's wait for room ends. Control frames
// are recorded.
type backedUpLink struct {
	sendErr error
	control []protocol.Message
}

func (l *backedUpLink) Send(protocol.Message, Wait) error { return l.sendErr }
func (l *backedUpLink) SendControl(m protocol.Message) error {
	l.control = append(l.control, m)
	return nil
}
func (l *backedUpLink) Close() error { return nil }

// TestNoRoomIsTimeoutOrCancel: an event that found no room to be queued
// before its deadline (or its cancel) fails as ErrAgentTimeout (or
// ErrAgentCanceled), not as a lost connection, and the agent is told.
func TestNoRoomIsTimeoutOrCancel(t *testing.T) {
	for _, tc := range []struct {
		sendErr error
		want    error
		reason  string
	}{
		{fmt.Errorf("%w: no room", ErrAgentTimeout), ErrAgentTimeout, "timeout"},
		{fmt.Errorf("%w: no room", ErrAgentCanceled), ErrAgentCanceled, "client_disconnect"},
		{errors.New("broken pipe"), ErrAgentConnLost, ""},
	} {
		l := &backedUpLink{sendErr: tc.sendErr}
		s := NewSession(l, protocol.Capabilities{SupportsCancellation: true}, SessionConfig{Name: "a", MaxInFlight: 1})
		e, err := s.Begin(Wait{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.RequestHeaders(Wait{}, &protocol.RequestHeaders{})
		if !errors.Is(err, tc.want) {
			t.Fatalf("send error %v: got %v, want %v", tc.sendErr, err, tc.want)
		}
		if _, again := e.ResponseHeaders(Wait{}, &protocol.ResponseHeaders{}); !errors.Is(again, tc.want) {
			t.Fatalf("the exchange goes on after %v: %v", err, again)
		}
		e.Finish()
		var reason string
		if len(l.control) == 1 {
			if c, ok := l.control[0].(*protocol.CancelRequest); ok {
				reason = string(c.Reason)
			}
		}
		if reason != tc.reason || len(l.control) > 1 {
			t.Fatalf("send error %v: control frames %v, want one CancelRequest %q", tc.sendErr, l.control, tc.reason)
		}
	}
}

// TestCancelAfterDeadlineIsTimeout: a cancel channel that closes at or
// after the Wait's deadline (a context's Done at its deadline) counts as
// the deadline.
func TestCancelAfterDeadlineIsTimeout(t *testing.T) {
	s := NewSession(&nopLink{}, protocol.Capabilities{}, SessionConfig{Name: "a", MaxInFlight: 1})
	closed := make(chan struct{})
	close(closed)
	e, err := s.Begin(Wait{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Finish()
	_, err = e.RequestHeaders(Wait{Deadline: time.Now().Add(-time.Second), Cancel: closed}, &protocol.RequestHeaders{})
	if !errors.Is(err, ErrAgentTimeout) {
		t.Fatalf("got %v, want ErrAgentTimeout", err)
	}
	if s.Stats().Timeouts != 1 {
		t.Fatalf("timeouts %d, want 1", s.Stats().Timeouts)
	}
}

// silentLink accepts every event and never answers; sent reports each
// event's request id, and waits (when set) the Wait it was sent with.
type silentLink struct {
	sent  chan uint64
	waits chan Wait
}

func (l *silentLink) Send(m protocol.Message, w Wait) error {
	if rh, ok := m.(*protocol.RequestHeaders); ok {
		l.sent <- rh.RequestID
	}
	if l.waits != nil {
		l.waits <- w
	}
	return nil
}

// answer delivers an empty decision for request id, as the agent would.
func answer(s *Session, id uint64) {
	r := new(Reply)
	r.Type = protocol.TypeDecision
	r.Decision.RequestID = id
	s.Deliver(r)
}
func (l *silentLink) SendControl(protocol.Message) error { return nil }
func (l *silentLink) Close() error                       { return nil }

// TestSessionTimerEarliestDeadline: the session's one timer serves every
// waiting event. An event whose deadline is earlier than those already
// waiting moves it forward and times out (ErrAgentTimeout) while the
// others go on waiting; they are answered normally afterwards, and the
// one after them times out by MessageTimeout.
func TestSessionTimerEarliestDeadline(t *testing.T) {
	l := &silentLink{sent: make(chan uint64, 4)}
	s := NewSession(l, protocol.Capabilities{}, SessionConfig{Name: "a", MaxInFlight: 4, MessageTimeout: time.Hour})
	type result struct {
		id  uint64
		err error
	}
	done := make(chan result, 4)
	call := func(w Wait) {
		e, err := s.Begin(Wait{})
		if err != nil {
			t.Error(err)
			return
		}
		defer e.Finish()
		_, err = e.RequestHeaders(w, &protocol.RequestHeaders{})
		done <- result{e.RequestID(), err}
	}
	go call(Wait{}) // waits up to MessageTimeout (an hour)
	slow := <-l.sent
	go call(Wait{Deadline: time.Now().Add(20 * time.Millisecond)})
	fast := <-l.sent
	select {
	case r := <-done:
		if r.id != fast || !errors.Is(r.err, ErrAgentTimeout) {
			t.Fatalf("request %d ended with %v; want %d to time out", r.id, r.err, fast)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the earlier deadline did not fire")
	}
	answer(s, slow)
	if r := <-done; r.id != slow || r.err != nil {
		t.Fatalf("request %d ended with %v; want %d answered", r.id, r.err, slow)
	}
	if st := s.Stats(); st.Timeouts != 1 || st.Completed != 1 {
		t.Fatalf("stats %+v, want 1 timeout and 1 completed", st)
	}
}

// TestSessionTimerMessageTimeout: an event answered by nobody fails by
// MessageTimeout with a message naming it, and its reply is late.
func TestSessionTimerMessageTimeout(t *testing.T) {
	l := &silentLink{sent: make(chan uint64, 1)}
	s := NewSession(l, protocol.Capabilities{}, SessionConfig{Name: "a", MaxInFlight: 1, MessageTimeout: 10 * time.Millisecond})
	e, err := s.Begin(Wait{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Finish()
	_, err = e.RequestHeaders(Wait{}, &protocol.RequestHeaders{})
	if !errors.Is(err, ErrAgentTimeout) || !strings.Contains(err.Error(), "no reply to RequestHeaders") {
		t.Fatalf("got %v, want a message timeout", err)
	}
	answer(s, <-l.sent)
	if st := s.Stats(); st.Late != 1 || st.Timeouts != 1 {
		t.Fatalf("stats %+v, want the reply counted late", st)
	}
}

// TestWaitNowIsTheCallsClock: a call computes its message deadline from
// the caller's clock reading (Wait.Now) when it is given one, instead of
// reading the clock again, and from its own reading otherwise.
func TestWaitNowIsTheCallsClock(t *testing.T) {
	const timeout = time.Hour
	l := &silentLink{sent: make(chan uint64, 1), waits: make(chan Wait, 1)}
	s := NewSession(l, protocol.Capabilities{}, SessionConfig{Name: "a", MaxInFlight: 1, MessageTimeout: timeout})
	for _, now := range []time.Time{time.Now().Add(-time.Minute), {}} {
		e, err := s.Begin(Wait{})
		if err != nil {
			t.Fatal(err)
		}
		before := time.Now()
		done := make(chan error, 1)
		go func() {
			_, err := e.RequestHeaders(Wait{Now: now}, &protocol.RequestHeaders{})
			done <- err
		}()
		id, w := <-l.sent, <-l.waits
		switch {
		case !now.IsZero() && !w.Deadline.Equal(now.Add(timeout)):
			t.Errorf("Now %v: sent with deadline %v, want Now + %v", now, w.Deadline, timeout)
		case now.IsZero() && (w.Deadline.Before(before.Add(timeout)) || w.Deadline.After(time.Now().Add(timeout))):
			t.Errorf("no Now: sent with deadline %v, want the call's own clock + %v", w.Deadline, timeout)
		}
		answer(s, id)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		e.Finish()
	}
}

// TestSessionTimerHonorsAnOldReading: the message deadline of a call
// whose Wait.Now is old is that much earlier, and the session's timer
// fires at it, not a message timeout after the call: here the deadline
// is 100 ms away while a reply comes after 2 s.
func TestSessionTimerHonorsAnOldReading(t *testing.T) {
	l := &silentLink{sent: make(chan uint64, 1)}
	s := NewSession(l, protocol.Capabilities{}, SessionConfig{Name: "a", MaxInFlight: 1, MessageTimeout: 10*time.Second + 100*time.Millisecond})
	e, err := s.Begin(Wait{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Finish()
	go func() {
		id := <-l.sent
		time.AfterFunc(2*time.Second, func() {
			answer(s, id)
		})
	}()
	_, err = e.RequestHeaders(Wait{Now: time.Now().Add(-10 * time.Second)}, &protocol.RequestHeaders{})
	if !errors.Is(err, ErrAgentTimeout) {
		t.Fatalf("got %v; want the message timeout, 100 ms after the call", err)
	}
}
