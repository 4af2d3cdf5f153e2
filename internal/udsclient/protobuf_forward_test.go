package udsclient_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/zentinelproxy/sidecar/grpcagent/pb"
	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

// TestProtobufUnknownEnvelopeFieldAfterPayload: docs/protocol.md
// §2.7 says unknown fields are skipped, as protobuf decoders do. An agent
// built on a newer agent.proto that adds a bytes field to the AgentMessage
// envelope (outside the payload oneof) writes it after the payload field
// (generated encoders write in field-number order). The generated decoder
// reads such a message as a Decision; the proxy must too, whatever the
// order of the fields.
func TestProtobufUnknownEnvelopeFieldAfterPayload(t *testing.T) {
	path := testutil.SocketPath(t)
	generated := make(chan string, 16)
	wrongWire := protobufAgent(t, path, func(id uint64, m *protocol.RequestHeaders) []byte {
		d := &protocol.Decision{RequestID: id,
			RequestHeaderOps: []protocol.HeaderOp{{Op: protocol.HeaderSet, Name: []byte("x-echo"), Value: m.Headers.Get("x-id")}}}
		body, _ := pbwire.AppendMessage(nil, d)
		unknown := protowire.AppendBytes(protowire.AppendTag(nil, 20, protowire.BytesType), []byte("trace"))
		var payload []byte
		if string(m.Headers.Get("x-order")) == "before" {
			payload = append(append(payload, unknown...), body...)
		} else {
			payload = append(append(payload, body...), unknown...)
		}
		// What the generated code makes of it.
		var ref pb.AgentMessage
		if err := proto.Unmarshal(payload, &ref); err != nil || ref.GetDecision() == nil {
			generated <- "generated decoder does not see a Decision"
		}
		out, _ := uds.AppendRawFrame(nil, protocol.TypeDecision, payload)
		return out
	})
	c := newClient(t, path, func(c *udsclient.Config) { c.MessageTimeout = 3 * time.Second })
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	for _, order := range []string{"before", "after"} {
		d, err := roundTrip(ctx, c, headers("x-id", "5", "x-order", order))
		select {
		case msg := <-generated:
			t.Fatal(msg)
		case p := <-wrongWire:
			t.Fatalf("the proxy sent a non-protobuf event: %q", p)
		default:
		}
		if err != nil {
			t.Errorf("unknown envelope field %s the decision: %v", order, err)
			continue
		}
		if len(d.RequestHeaderOps) != 1 || string(d.RequestHeaderOps[0].Value) != "5" {
			t.Errorf("unknown envelope field %s the decision: decision %+v", order, d)
		}
	}
}
