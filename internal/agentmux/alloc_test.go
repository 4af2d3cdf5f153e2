package agentmux

import (
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

// echoLink frames every event (through protocol.Message, as the UDS link
// does) and has a responder goroutine answer it with an allow.
type echoLink struct {
	buf []byte
	ids chan uint64
}

func (l *echoLink) Send(m protocol.Message, _ Wait) error {
	var err error
	if l.buf, err = uds.AppendFrame(l.buf[:0], m); err != nil {
		return err
	}
	id, _ := protocol.PeekRequestID(l.buf[uds.HeaderSize:])
	l.ids <- id
	return nil
}
func (l *echoLink) SendControl(protocol.Message) error { return nil }
func (l *echoLink) Close() error                       { return nil }

// TestAllocsExchange gates the proxy side of a conversation: opening an
// exchange, sending typed messages (headers, a body chunk through
// BodyChunk.As) with a deadline and a cancel channel, taking the replies
// and finishing costs no allocation.
func TestAllocsExchange(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	l := &echoLink{buf: make([]byte, 0, 4096), ids: make(chan uint64, 1)}
	s := NewSession(l, protocol.Capabilities{}, SessionConfig{Name: "a", MaxInFlight: 4, MessageTimeout: time.Minute})
	done := make(chan struct{})
	defer close(done)
	go func() {
		r := new(Reply)
		for {
			select {
			case id := <-l.ids:
				r.Type, r.Err = protocol.TypeDecision, nil
				r.Decision.Reset()
				r.Decision.RequestID = id
				r = s.Deliver(r)
			case <-done:
				return
			}
		}
	}()
	rh := &protocol.RequestHeaders{Method: []byte("POST"), URI: []byte("/x"), HasBody: true,
		Headers: protocol.Headers{{Name: []byte("host"), Value: []byte("example.com")}}}
	chunk := &protocol.BodyChunk{Data: []byte("hello"), IsLast: true, TotalSize: 5, Progress: 5}
	resp := &protocol.ResponseHeaders{StatusCode: 200}
	cancel := make(chan struct{})
	allocs := testing.AllocsPerRun(1000, func() {
		e, err := s.Begin(Wait{Cancel: cancel})
		if err != nil {
			t.Fatal(err)
		}
		w := Wait{Deadline: time.Now().Add(time.Minute), Cancel: cancel}
		if _, err := e.RequestHeaders(w, rh); err != nil {
			t.Fatal(err)
		}
		if _, err := e.BodyChunk(w, protocol.PhaseRequest, chunk); err != nil {
			t.Fatal(err)
		}
		if _, err := e.ResponseHeaders(Wait{Cancel: cancel}, resp); err != nil {
			t.Fatal(err)
		}
		e.Finish()
	})
	if allocs != 0 {
		t.Fatalf("%.2f allocations per exchange, want 0", allocs)
	}
}
