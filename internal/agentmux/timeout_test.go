package agentmux

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
)

// timeoutLink records the timeout_ms of each event as the transport would
// encode it, then fails the send (nothing is answered here).
type timeoutLink struct{ got []uint32 }

func (l *timeoutLink) Send(m protocol.Message, _ Wait) error {
	switch m := m.(type) {
	case *protocol.RequestHeaders:
		l.got = append(l.got, m.TimeoutMs)
	case *protocol.ResponseHeaders:
		l.got = append(l.got, m.TimeoutMs)
	case *protocol.RequestBodyChunk:
		l.got = append(l.got, m.TimeoutMs)
	case *protocol.ResponseBodyChunk:
		l.got = append(l.got, m.TimeoutMs)
	}
	return fmt.Errorf("%w: recorded", ErrAgentTimeout)
}
func (l *timeoutLink) SendControl(protocol.Message) error { return nil }
func (l *timeoutLink) Close() error                       { return nil }

// TestEventTimeoutMs: every event carries the wait the proxy gives its
// reply: the message timeout, or what is left of the caller's deadline
// when that is earlier, in whole milliseconds rounded up (at least 1, at
// most the field's range); 0 when neither bounds it.
func TestEventTimeoutMs(t *testing.T) {
	now := time.Now()
	cases := []struct {
		name string
		msg  time.Duration
		w    Wait
		want uint32
	}{
		{"message timeout", time.Second, Wait{Now: now}, 1000},
		{"request budget earlier", time.Second, Wait{Now: now, Deadline: now.Add(300*time.Millisecond + 100*time.Microsecond)}, 301},
		{"message timeout earlier", 250 * time.Millisecond, Wait{Now: now, Deadline: now.Add(time.Hour)}, 250},
		{"budget only", 0, Wait{Now: now, Deadline: now.Add(2 * time.Second)}, 2000},
		{"under a millisecond", 0, Wait{Now: now, Deadline: now.Add(time.Microsecond)}, 1},
		{"budget spent", time.Second, Wait{Now: now, Deadline: now.Add(-time.Second)}, 1},
		{"beyond the range", 2000 * time.Hour, Wait{Now: now}, math.MaxUint32},
		{"unbounded", 0, Wait{Now: now}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := &timeoutLink{}
			s := NewSession(l, protocol.Capabilities{}, SessionConfig{Name: "a", MaxInFlight: 4, MessageTimeout: c.msg})
			events := []func(e *Exchange) error{
				func(e *Exchange) error { _, err := e.RequestHeaders(c.w, &protocol.RequestHeaders{}); return err },
				func(e *Exchange) error {
					_, err := e.BodyChunk(c.w, protocol.PhaseRequest, &protocol.BodyChunk{})
					return err
				},
				func(e *Exchange) error { _, err := e.ResponseHeaders(c.w, &protocol.ResponseHeaders{}); return err },
				func(e *Exchange) error {
					_, err := e.BodyChunk(c.w, protocol.PhaseResponse, &protocol.BodyChunk{})
					return err
				},
			}
			for _, ev := range events {
				e, err := s.Begin(Wait{})
				if err != nil {
					t.Fatal(err)
				}
				if err := ev(e); !errors.Is(err, ErrAgentTimeout) {
					t.Fatalf("event: %v", err)
				}
				e.Finish()
			}
			if len(l.got) != 4 {
				t.Fatalf("recorded %d events", len(l.got))
			}
			for i, got := range l.got {
				if got != c.want {
					t.Errorf("event %d: timeout_ms %d, want %d", i, got, c.want)
				}
			}
		})
	}
}

// TestMessageDeadline: the earlier of the call's deadline and the message
// timeout, and which one it was.
func TestMessageDeadline(t *testing.T) {
	now := time.Unix(1000, 0)
	soon, late := now.Add(100*time.Millisecond), now.Add(time.Hour)
	for _, tc := range []struct {
		name    string
		w       Wait
		timeout time.Duration
		want    time.Time
		byMsg   bool
	}{
		{"neither", Wait{}, 0, time.Time{}, false},
		{"timeout only", Wait{}, time.Second, now.Add(time.Second), true},
		{"deadline only", Wait{Deadline: soon}, 0, soon, false},
		{"deadline first", Wait{Deadline: soon}, time.Second, soon, false},
		{"timeout first", Wait{Deadline: late}, time.Second, now.Add(time.Second), true},
		{"negative timeout", Wait{Deadline: late}, -time.Second, late, false},
	} {
		got, byMsg := MessageDeadline(tc.w, now, tc.timeout)
		if !got.Equal(tc.want) || byMsg != tc.byMsg {
			t.Errorf("%s: %v %v, want %v %v", tc.name, got, byMsg, tc.want, tc.byMsg)
		}
	}
}
