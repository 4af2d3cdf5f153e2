package sdk

import (
	"context"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

// signalSender reports each reply on a channel.
type signalSender struct{ sent chan struct{} }

func (s *signalSender) Send(context.Context, protocol.Message) error {
	s.sent <- struct{}{}
	return nil
}
func (s *signalSender) SendError(uint64, string) error { s.sent <- struct{}{}; return nil }

// allocsPerEvent measures the allocations of one event: payload decoded
// into a pooled RequestHeaders event with a new request id each time (a
// new request), handed over with send, and its reply reported on sent.
func allocsPerEvent(t *testing.T, payload []byte, send func(*Event), sent <-chan struct{}) float64 {
	t.Helper()
	var id uint64
	return testing.AllocsPerRun(1000, func() {
		ev := AcquireEvent()
		if err := ev.Decode(protocol.TypeRequestHeaders, payload); err != nil {
			t.Fatal(err)
		}
		id++
		ev.RequestHeaders.RequestID = id
		send(ev)
		<-sent
	})
}

// TestAllocsDispatch gates the agent side's cost of an event: exactly one
// allocation, the handler's context. It is fresh for every handler run and
// never reused (a reused context would break the context.Context contract
// for anything derived from it that outlives the request); Done's channel
// is made only if the handler asks for it. Decoding into pooled events,
// the worker hand-off and the reply cost nothing.
func TestAllocsDispatch(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	out := &signalSender{sent: make(chan struct{}, 1)}
	d := NewDispatcher(context.Background(), &Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true}}, out)
	defer d.Close()
	payload := protocol.AppendRequestHeaders(nil, &protocol.RequestHeaders{Method: []byte("GET"), URI: []byte("/"),
		Headers: protocol.Headers{{Name: []byte("host"), Value: []byte("example.com")}}})
	allocs := allocsPerEvent(t, payload, d.Dispatch, out.sent)
	if allocs != 1 {
		t.Fatalf("%.2f allocations per event, want exactly 1 (the handler's context)", allocs)
	}
}

// TestAllocsDispatchDeadline is TestAllocsDispatch for an event with a
// timeout_ms: its deadline costs the handler's context no allocation
// (nor a timer) unless the handler asks for Done.
func TestAllocsDispatchDeadline(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	out := &signalSender{sent: make(chan struct{}, 1)}
	d := NewDispatcher(context.Background(), &Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true}}, out)
	defer d.Close()
	payload := protocol.AppendRequestHeaders(nil, &protocol.RequestHeaders{TimeoutMs: 60000, Method: []byte("GET"), URI: []byte("/"),
		Headers: protocol.Headers{{Name: []byte("host"), Value: []byte("example.com")}}})
	allocs := allocsPerEvent(t, payload, d.Dispatch, out.sent)
	if allocs != 1 {
		t.Fatalf("%.2f allocations per event, want exactly 1 (the handler's context)", allocs)
	}
}

// TestAllocsDispatchProtobuf is TestAllocsDispatch for an event that
// arrives with a protobuf payload (protobuf_payloads negotiated): its
// decoding into the pooled event's buffer costs nothing either.
func TestAllocsDispatchProtobuf(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	out := &signalSender{sent: make(chan struct{}, 1)}
	d := NewDispatcher(context.Background(), &Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true}}, out)
	defer d.Close()
	payload, err := pbwire.AppendMessage(nil, &protocol.RequestHeaders{RequestID: 1, Method: []byte("GET"), URI: []byte("/"),
		Headers: protocol.Headers{{Name: []byte("host"), Value: []byte("example.com")}}})
	if err != nil {
		t.Fatal(err)
	}
	dec := &frameDecoder{enc: uds.Protobuf}
	var id uint64
	allocs := testing.AllocsPerRun(1000, func() {
		ev, _, _, err := dec.event(protocol.TypeRequestHeaders, payload)
		if err != nil {
			t.Fatal(err)
		}
		id++
		ev.RequestHeaders.RequestID = id // a new request each time
		d.Dispatch(ev)
		<-out.sent
	})
	if allocs != 1 {
		t.Fatalf("%.2f allocations per event, want exactly 1 (the handler's context)", allocs)
	}
}
