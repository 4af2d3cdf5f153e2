package sdk

import (
	"testing"

	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

// FuzzFrameDecoder drives the agent side's payload decoding with any frame
// type and payload, in both encodings: it never panics, an event it
// accepts has the frame's type, and a protobuf event re-encodes to a
// payload that decodes to the same event.
func FuzzFrameDecoder(f *testing.F) {
	for _, m := range []protocol.Message{
		&protocol.RequestHeaders{RequestID: 7, Method: []byte("GET"), URI: []byte("/"), Headers: protocol.Headers{{Name: []byte("host"), Value: []byte("a")}}},
		(&protocol.BodyChunk{RequestID: 7, Data: []byte("x"), IsLast: true, TotalSize: -1, Progress: -1}).As(protocol.PhaseRequest),
		&protocol.ResponseHeaders{RequestID: 7, StatusCode: 200},
		&protocol.CancelRequest{RequestID: 7, Reason: []byte("r")},
		&protocol.Ping{Sequence: 1},
	} {
		p, _ := pbwire.AppendMessage(nil, m)
		f.Add(uint8(m.MsgType()), true, p)
		j, _ := m.AppendJSON(nil)
		f.Add(uint8(m.MsgType()), false, j)
	}
	f.Fuzz(func(t *testing.T, typ uint8, protobuf bool, payload []byte) {
		dec := &frameDecoder{enc: uds.JSON}
		if protobuf {
			dec.enc = uds.Protobuf
		}
		mt := protocol.MsgType(typ)
		switch mt {
		case protocol.TypeRequestHeaders, protocol.TypeRequestBodyChunk, protocol.TypeResponseHeaders, protocol.TypeResponseBodyChunk:
		default:
			dec.cancel(payload)
			var p protocol.Ping
			dec.ping(payload, &p)
			return
		}
		ev, _, _, err := dec.event(mt, payload)
		if err != nil {
			return
		}
		defer ReleaseEvent(ev)
		if ev.Type != mt {
			t.Fatalf("event type %s from a %s frame", ev.Type, mt)
		}
		if !protobuf {
			return
		}
		var msg protocol.Message
		switch mt {
		case protocol.TypeRequestHeaders:
			msg = &ev.RequestHeaders
		case protocol.TypeResponseHeaders:
			msg = &ev.ResponseHeaders
		case protocol.TypeRequestBodyChunk:
			msg = ev.Chunk.As(protocol.PhaseRequest)
		default:
			msg = ev.Chunk.As(protocol.PhaseResponse)
		}
		again, err := pbwire.AppendMessage(nil, msg)
		if err != nil {
			t.Fatalf("re-encoding an accepted event: %v", err)
		}
		ev2, _, _, err := (&frameDecoder{enc: uds.Protobuf}).event(mt, again)
		if err != nil {
			t.Fatalf("re-encoded event does not decode: %v", err)
		}
		defer ReleaseEvent(ev2)
		if ev2.RequestID() != ev.RequestID() {
			t.Fatalf("request id %d after re-encoding, was %d", ev2.RequestID(), ev.RequestID())
		}
	})
}
