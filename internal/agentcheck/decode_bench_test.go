package agentcheck

import (
	"testing"

	"github.com/zentinelproxy/sidecar/grpcagent/pb"
	"github.com/zentinelproxy/sidecar/protocol"
)

// BenchmarkDecodeFrame is the checker's cost per frame read from a UDS
// agent (every reply of a soak goes through it).
func BenchmarkDecodeFrame(b *testing.B) {
	p := []byte(`{"request_id":4294967297,"decision":"allow","request_headers":[{"set":{"name":"x-agent","value":"checked"}}]}`)
	b.ReportAllocs()
	for b.Loop() {
		if r := decodeFrame(protocol.TypeDecision, p); r.Err != nil {
			b.Fatal(r.Err)
		}
	}
}

// BenchmarkFromPB is the same for a gRPC agent.
func BenchmarkFromPB(b *testing.B) {
	m := &pb.AgentMessage{RequestId: 1 << 32, Payload: &pb.AgentMessage_Decision{Decision: &pb.AgentDecision{
		Decision:       &pb.AgentDecision_Allow{Allow: &pb.Allow{}},
		RequestHeaders: []*pb.HeaderOp{{Operation: pb.HeaderOp_SET, Name: []byte("x-agent"), Value: []byte("checked")}},
	}}}
	b.ReportAllocs()
	for b.Loop() {
		if r := fromPB(m); r.Err != nil {
			b.Fatal(r.Err)
		}
	}
}
