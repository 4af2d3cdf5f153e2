package pbwire_test

import (
	"errors"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/protocol"
)

// TestEnvelopeFieldIsTheMessages: every message that travels on the stream
// lands in the payload field of its own type (a response chunk in the
// response-chunk field, a Pong in the pong field), and the handshake and
// registration messages, which do not travel on the stream, are refused.
func TestEnvelopeFieldIsTheMessages(t *testing.T) {
	chunk := &protocol.BodyChunk{RequestID: 5, ChunkIndex: 1, Data: []byte("abc"), TotalSize: -1, Progress: -1}
	ping := &protocol.Ping{Sequence: 3, TimestampMs: 17}
	for _, m := range []protocol.Message{
		&protocol.RequestHeaders{RequestID: 5, Method: []byte("GET"), URI: []byte("/")},
		chunk.As(protocol.PhaseRequest),
		&protocol.ResponseHeaders{RequestID: 5, StatusCode: 200},
		chunk.As(protocol.PhaseResponse),
		&protocol.Decision{RequestID: 5},
		&protocol.BodyMutation{RequestID: 5, Phase: protocol.PhaseResponse},
		&protocol.CancelRequest{RequestID: 5, Reason: []byte("timeout")},
		&protocol.CancelAll{Reason: []byte("shutdown")},
		ping,
		(*protocol.Pong)(ping),
	} {
		wire, err := pbwire.AppendMessage(nil, m)
		if err != nil {
			t.Fatalf("%s: %v", m.MsgType(), err)
		}
		var f pbwire.Frame
		f.Parse(wire)
		if f.Err != nil || f.Payload != payloadOf(m.MsgType()) {
			t.Fatalf("%T: payload %d (%v), want %d (%s)", m, f.Payload, f.Err, payloadOf(m.MsgType()), m.MsgType())
		}
	}
	for _, m := range []protocol.Message{
		&protocol.HandshakeRequest{}, &protocol.HandshakeResponse{}, &protocol.RegistrationRequest{}, &protocol.RegistrationResponse{},
	} {
		if _, err := pbwire.AppendMessage(nil, m); !errors.Is(err, pbwire.ErrMessageType) {
			t.Fatalf("%s on the stream: %v, want pbwire.ErrMessageType", m.MsgType(), err)
		}
	}
}
