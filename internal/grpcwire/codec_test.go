package grpcwire

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/zentinelproxy/sidecar/grpcagent/pb"
	"github.com/zentinelproxy/sidecar/internal/pbwire/pbwiretest"
	"github.com/zentinelproxy/sidecar/protocol"
)

func TestEncodeErrors(t *testing.T) {
	var o Outgoing
	big := &protocol.BodyChunk{RequestID: 1, Data: make([]byte, MaxMessageSize), TotalSize: -1, Progress: -1}
	err := o.Encode(big.As(protocol.PhaseRequest), 0)
	if !errors.Is(err, ErrGRPCMessageTooLarge) || !strings.Contains(err.Error(), "10485760") {
		t.Fatalf("oversized: %v", err)
	}
	if err := o.Encode(big.As(protocol.PhaseRequest), 1024); !errors.Is(err, ErrGRPCMessageTooLarge) {
		t.Fatalf("over a lower limit: %v", err)
	}
	if err := o.Encode(nil, 0); !errors.Is(err, ErrGRPCMessageType) {
		t.Fatalf("no message: %v", err)
	}
	if err := o.Encode(&protocol.HandshakeRequest{}, 0); !errors.Is(err, ErrGRPCMessageType) {
		t.Fatalf("handshake on the stream: %v", err)
	}
	if err := o.Encode(&protocol.CancelRequest{RequestID: 1, Reason: []byte("\xff")}, 0); !errors.Is(err, ErrGRPCMessageType) {
		t.Fatalf("invalid UTF-8 in a string field: %v", err)
	}
	if o.Len() != 0 {
		t.Fatal("a failed Encode left a message behind")
	}
	if err := o.Encode(&protocol.CancelRequest{RequestID: 1, Reason: []byte("timeout")}, 0); err != nil || o.Len() == 0 {
		t.Fatal(err)
	}
	o.Free()
	// A large message goes through gRPC's buffer pool and decodes.
	chunk := &protocol.BodyChunk{RequestID: 9, Data: bytes.Repeat([]byte("z"), 64<<10), TotalSize: -1, Progress: -1}
	if err := o.Encode(chunk.As(protocol.PhaseRequest), 0); err != nil {
		t.Fatal(err)
	}
	got, err := pbwiretest.Decode(protocol.TypeRequestBodyChunk, o.buf.ReadOnlyData())
	o.Free()
	if err != nil || pbwiretest.Canon(got) != pbwiretest.Canon(chunk) {
		t.Fatalf("large chunk: %v", err)
	}
}

// TestCodecFrame: a malformed message yields its request id and an error
// instead of failing the stream; unknown payloads are recognized.
func TestCodecFrame(t *testing.T) {
	good, _ := proto.Marshal(&pb.AgentMessage{RequestId: 9, Payload: &pb.AgentMessage_Decision{Decision: &pb.AgentDecision{Decision: &pb.AgentDecision_Allow{Allow: &pb.Allow{}}}}})
	for _, c := range []struct {
		name    string
		wire    []byte
		id      uint64
		ok      bool
		payload Payload
	}{
		{"good", good, 9, true, PayloadDecision},
		{"truncated payload", []byte{0x08, 42, 0x32, 100, 1, 2}, 42, false, PayloadNone},
		{"bad tag", []byte{0x08, 7, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 7, false, PayloadNone},
		{"unknown payload field", []byte{0x08, 5, 0xaa, 0x01, 0x00}, 5, true, PayloadUnknown}, // field 21, empty message
		{"unknown scalar ignored", []byte{0x08, 5, 0xa8, 0x01, 0x01, 0x32, 0x02, 0x0a, 0x00}, 5, true, PayloadDecision},
		{"empty", nil, 0, true, PayloadNone},
	} {
		t.Run(c.name, func(t *testing.T) {
			var f Frame
			if err := Codec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(c.wire)}, &f); err != nil {
				t.Fatalf("codec failed the stream: %v", err)
			}
			if (f.Err == nil) != c.ok {
				t.Fatalf("Err = %v, want ok=%v", f.Err, c.ok)
			}
			if !c.ok && !errors.Is(f.Err, ErrGRPCMalformed) {
				t.Fatalf("Err = %v, want ErrGRPCMalformed", f.Err)
			}
			if f.RequestID != c.id || (c.ok && f.Payload != c.payload) {
				t.Fatalf("request id %d payload %d, want %d %d", f.RequestID, f.Payload, c.id, c.payload)
			}
		})
	}
	// A decision payload that is garbage inside fails to decode, with the id.
	var f Frame
	f.Parse([]byte{0x08, 3, 0x32, 0x02, 0xff, 0xff})
	var d protocol.Decision
	if err := f.DecodeDecision(&d); !errors.Is(err, ErrGRPCMalformed) || d.RequestID != 3 {
		t.Fatalf("garbage decision: %v id %d", err, d.RequestID)
	}
	// Plain protobuf messages still go through the standard codec.
	data, err := Codec().Marshal(&pb.HealthResponse{Status: pb.HealthResponse_SERVING})
	if err != nil {
		t.Fatal(err)
	}
	var h pb.HealthResponse
	if err := Codec().Unmarshal(data, &h); err != nil || h.Status != pb.HealthResponse_SERVING {
		t.Fatalf("standard path: %v %v", err, h.Status)
	}
}

// TestAllocsOutgoing: encoding any message of the suite for the stream
// costs its output buffer and the mem.Buffer around it, no more.
func TestAllocsOutgoing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, c := range pbwiretest.Messages() {
		var o Outgoing
		msg := pbwiretest.AsMessage(c.Type, c.Msg)
		allocs := testing.AllocsPerRun(100, func() {
			if err := o.Encode(msg, 0); err != nil {
				t.Fatal(err)
			}
			o.Free()
		})
		// The output buffer and its mem.Buffer wrapper, no more.
		if allocs > 2 {
			t.Errorf("encode %s: %.1f allocs, want <= 2", c.Name, allocs)
		}
	}
}
