package pbwire_test

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/zentinelproxy/sidecar/grpcagent/pb"
	"github.com/zentinelproxy/sidecar/protocol"
)

// TestMergedMutationDropClearsData: a Decision whose
// response_body_mutation occurs twice, first replacing with "0", then with
// an empty data (a drop). Protobuf merges the two occurrences: the data is
// the last one's, empty, so the hand decoder must leave no data from the
// first occurrence behind the drop (a FuzzFrame input, minimized).
func TestMergedMutationDropClearsData(t *testing.T) {
	decision := []byte{
		0x0a, 0x00, // allow {}
		0x4a, 0x03, 0x1a, 0x01, '0', // response_body_mutation {data: "0"}
		0x4a, 0x02, 0x1a, 0x00, // response_body_mutation {data: ""}
	}
	wire := append([]byte{0x08, 0x07, 0x32, byte(len(decision))}, decision...)
	var ref pb.AgentMessage
	if err := proto.Unmarshal(wire, &ref); err != nil {
		t.Fatal(err)
	}
	want, err := fromPB(protocol.TypeDecision, &ref)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeFrame(protocol.TypeDecision, wire)
	if err != nil {
		t.Fatal(err)
	}
	if g, w := canon(got), canon(want); g != w {
		t.Fatalf("hand decoder\n got %s\nwant %s (generated decoder)", g, w)
	}
}
