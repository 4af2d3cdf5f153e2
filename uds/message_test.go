package uds

import (
	"bytes"
	"testing"

	"github.com/zentinelproxy/sidecar/protocol"
)

// allMessages is one of every message with the frame type it must travel
// as.
func allMessages() []struct {
	want protocol.MsgType
	msg  protocol.Message
} {
	chunk := &protocol.BodyChunk{RequestID: 5, ChunkIndex: 1, Data: []byte("abc"), TotalSize: 9, Progress: 3}
	ping := &protocol.Ping{Sequence: 3, TimestampMs: 1763719200000}
	return []struct {
		want protocol.MsgType
		msg  protocol.Message
	}{
		{protocol.TypeHandshakeRequest, &protocol.HandshakeRequest{ProtocolVersion: 2, ClientName: "p"}},
		{protocol.TypeHandshakeResponse, &protocol.HandshakeResponse{ProtocolVersion: 2, AgentName: "a", Accepted: true}},
		{protocol.TypeRegistrationRequest, &protocol.RegistrationRequest{ProtocolVersion: 2, AgentID: "a-1"}},
		{protocol.TypeRegistrationResponse, &protocol.RegistrationResponse{Accepted: true, AssignedID: "c"}},
		{protocol.TypeRequestHeaders, &protocol.RequestHeaders{RequestID: 5, Method: []byte("GET"), URI: []byte("/")}},
		{protocol.TypeRequestBodyChunk, chunk.As(protocol.PhaseRequest)},
		{protocol.TypeRequestBodyChunk, (*protocol.RequestBodyChunk)(chunk)},
		{protocol.TypeResponseHeaders, &protocol.ResponseHeaders{RequestID: 5, StatusCode: 200}},
		{protocol.TypeResponseBodyChunk, chunk.As(protocol.PhaseResponse)},
		{protocol.TypeResponseBodyChunk, (*protocol.ResponseBodyChunk)(chunk)},
		{protocol.TypeDecision, &protocol.Decision{RequestID: 5, Kind: protocol.DecisionBlock, Status: 403}},
		{protocol.TypeBodyMutation, &protocol.BodyMutation{RequestID: 5, Phase: protocol.PhaseResponse, Action: protocol.MutationDrop}},
		{protocol.TypeCancelRequest, &protocol.CancelRequest{RequestID: 5, Reason: []byte("timeout")}},
		{protocol.TypeCancelAll, &protocol.CancelAll{Reason: []byte("shutdown")}},
		{protocol.TypePing, ping},
		{protocol.TypePong, (*protocol.Pong)(ping)},
	}
}

// TestFrameTypeIsTheMessages: the type byte of every frame is the one its
// message names, whatever message it is, and the payload is that
// message's: it decodes as the frame's type and re-encodes to the same
// bytes (so a response chunk carries bytes_sent, a request chunk
// bytes_received).
func TestFrameTypeIsTheMessages(t *testing.T) {
	seen := map[protocol.MsgType]bool{}
	for _, c := range allMessages() {
		if got := c.msg.MsgType(); got != c.want {
			t.Fatalf("%T: MsgType %s, want %s", c.msg, got, c.want)
		}
		frame, err := AppendFrame(nil, c.msg)
		if err != nil {
			t.Fatalf("%s: %v", c.want, err)
		}
		typ, payload, err := NewFrameReader(bytes.NewReader(frame)).Next()
		if err != nil || typ != c.want {
			t.Fatalf("%T: frame type %s (%v), want %s", c.msg, typ, err, c.want)
		}
		want, _ := c.msg.AppendJSON(nil)
		if !bytes.Equal(payload, want) {
			t.Fatalf("%s: payload %s, want %s", c.want, payload, want)
		}
		back, err := decodeAny(typ, payload)
		if err != nil {
			t.Fatalf("%s: the payload does not decode as its frame type: %v", c.want, err)
		}
		again, err := AppendFrame(nil, back)
		if err != nil || !bytes.Equal(again, frame) {
			t.Fatalf("%s: decoded as its frame type, re-encodes as\n%q\nwant\n%q", c.want, again, frame)
		}
		seen[typ] = true
	}
	// Every frame type of the protocol has a message.
	for _, typ := range []protocol.MsgType{
		protocol.TypeHandshakeRequest, protocol.TypeHandshakeResponse, protocol.TypeRegistrationRequest,
		protocol.TypeRegistrationResponse, protocol.TypeRequestHeaders, protocol.TypeRequestBodyChunk,
		protocol.TypeResponseHeaders, protocol.TypeResponseBodyChunk, protocol.TypeDecision,
		protocol.TypeBodyMutation, protocol.TypeCancelRequest, protocol.TypeCancelAll, protocol.TypePing, protocol.TypePong,
	} {
		if !seen[typ] {
			t.Errorf("no message travels as %s", typ)
		}
	}
}
