package agentmux

import (
	"errors"
	"fmt"
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
