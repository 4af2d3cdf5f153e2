package agentcheck

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/zentinelproxy/sidecar/grpcagent/pb"
	"github.com/zentinelproxy/sidecar/protocol"
)

// FuzzDecodeFrame: whatever an agent sends is judged, never a panic.
func FuzzDecodeFrame(f *testing.F) {
	f.Add(uint8(protocol.TypeDecision), []byte(`{"request_id":7,"decision":{"block":{"status":403}}}`))
	f.Add(uint8(protocol.TypeDecision), []byte(`{"request_id":7,"decision":"maybe"}`))
	f.Add(uint8(protocol.TypeBodyMutation), []byte(`{"request_id":1,"phase":"response","chunk_index":3,"data":"cmVkYWN0ZWQ="}`))
	f.Add(uint8(protocol.TypePong), []byte(`{"sequence":7,"timestamp_ms":1763719200000}`))
	f.Add(uint8(0x7e), []byte(`not json`))
	f.Fuzz(func(t *testing.T, typ uint8, payload []byte) {
		r := decodeFrame(protocol.MsgType(typ), payload)
		_ = r.Ev() // formatted lazily: still never a panic
		if r.Type == protocol.TypeDecision && r.Err == nil && r.Dec == nil {
			t.Fatal("a decoded Decision without its message")
		}
		_ = phaseProblem(r, r.ID, true, protocol.PhaseRequest, 0, false)
	})
}

// FuzzFromPB: any AgentMessage from a gRPC agent is judged, never a panic.
func FuzzFromPB(f *testing.F) {
	for _, m := range []*pb.AgentMessage{
		{RequestId: 7, Payload: &pb.AgentMessage_Decision{Decision: &pb.AgentDecision{Decision: &pb.AgentDecision_Block{Block: &pb.Block{Status: 451}}}}},
		{RequestId: 7, Payload: &pb.AgentMessage_BodyMutation{BodyMutation: &pb.BodyMutation{Phase: pb.Phase_PHASE_RESPONSE, ChunkIndex: 2, Data: []byte{}}}},
		{Payload: &pb.AgentMessage_Pong{Pong: &pb.Pong{Sequence: 1}}},
		{RequestId: 3, Payload: &pb.AgentMessage_AgentError{AgentError: &pb.AgentError{Message: "x"}}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var m pb.AgentMessage
		if proto.Unmarshal(b, &m) != nil {
			return
		}
		r := fromPB(&m)
		_ = r.Ev()
		if r.Type == protocol.TypeDecision && r.Err == nil && r.Dec == nil {
			t.Fatal("a decoded Decision without its message")
		}
	})
}
