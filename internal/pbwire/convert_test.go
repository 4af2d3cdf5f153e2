package pbwire_test

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/zentinelproxy/sidecar/grpcagent/pb"
	"github.com/zentinelproxy/sidecar/protocol"
)

// fromPB decodes an envelope back into the protocol message of type t.
func fromPB(t protocol.MsgType, m *pb.AgentMessage) (any, error) {
	id := m.RequestId
	switch p := m.Payload.(type) {
	case *pb.AgentMessage_RequestHeaders:
		var x protocol.RequestHeaders
		RequestHeadersFromPB(&x, id, p.RequestHeaders)
		return &x, nil
	case *pb.AgentMessage_RequestBodyChunk:
		var x protocol.BodyChunk
		RequestBodyChunkFromPB(&x, id, p.RequestBodyChunk)
		return &x, nil
	case *pb.AgentMessage_ResponseHeaders:
		var x protocol.ResponseHeaders
		ResponseHeadersFromPB(&x, id, p.ResponseHeaders)
		return &x, nil
	case *pb.AgentMessage_ResponseBodyChunk:
		var x protocol.BodyChunk
		ResponseBodyChunkFromPB(&x, id, p.ResponseBodyChunk)
		return &x, nil
	case *pb.AgentMessage_Decision:
		var x protocol.Decision
		err := DecisionFromPB(&x, id, p.Decision)
		return &x, err
	case *pb.AgentMessage_BodyMutation:
		var x protocol.BodyMutation
		err := BodyMutationFromPB(&x, id, p.BodyMutation)
		return &x, err
	case *pb.AgentMessage_Cancel:
		return &protocol.CancelRequest{RequestID: id, Reason: []byte(p.Cancel.Reason)}, nil
	case *pb.AgentMessage_CancelAll:
		return &protocol.CancelAll{Reason: []byte(p.CancelAll.Reason)}, nil
	case *pb.AgentMessage_Ping:
		return &protocol.Ping{Sequence: p.Ping.Sequence, TimestampMs: p.Ping.TimestampMs}, nil
	case *pb.AgentMessage_Pong:
		return &protocol.Ping{Sequence: p.Pong.Sequence, TimestampMs: p.Pong.TimestampMs}, nil
	}
	return nil, fmt.Errorf("unexpected payload %T for %s", m.Payload, t)
}

// toPB builds the envelope of msg with the …ToPB conversions.
func toPB(t protocol.MsgType, msg any) *pb.AgentMessage {
	env := &pb.AgentMessage{}
	switch m := msg.(type) {
	case *protocol.RequestHeaders:
		p := new(pb.RequestHeaders)
		RequestHeadersToPB(p, m)
		env.RequestId, env.Payload = m.RequestID, &pb.AgentMessage_RequestHeaders{RequestHeaders: p}
	case *protocol.BodyChunk:
		env.RequestId = m.RequestID
		if t == protocol.TypeResponseBodyChunk {
			p := new(pb.ResponseBodyChunk)
			ResponseBodyChunkToPB(p, m)
			env.Payload = &pb.AgentMessage_ResponseBodyChunk{ResponseBodyChunk: p}
		} else {
			p := new(pb.RequestBodyChunk)
			RequestBodyChunkToPB(p, m)
			env.Payload = &pb.AgentMessage_RequestBodyChunk{RequestBodyChunk: p}
		}
	case *protocol.ResponseHeaders:
		p := new(pb.ResponseHeaders)
		ResponseHeadersToPB(p, m)
		env.RequestId, env.Payload = m.RequestID, &pb.AgentMessage_ResponseHeaders{ResponseHeaders: p}
	case *protocol.Decision:
		p := new(pb.AgentDecision)
		DecisionToPB(p, m)
		env.RequestId, env.Payload = m.RequestID, &pb.AgentMessage_Decision{Decision: p}
	case *protocol.BodyMutation:
		p := new(pb.BodyMutation)
		BodyMutationToPB(p, m)
		env.RequestId, env.Payload = m.RequestID, &pb.AgentMessage_BodyMutation{BodyMutation: p}
	case *protocol.CancelRequest:
		env.RequestId, env.Payload = m.RequestID, &pb.AgentMessage_Cancel{Cancel: &pb.CancelRequest{Reason: string(m.Reason)}}
	case *protocol.CancelAll:
		env.Payload = &pb.AgentMessage_CancelAll{CancelAll: &pb.CancelAll{Reason: string(m.Reason)}}
	case *protocol.Ping:
		if t == protocol.TypePong {
			env.Payload = &pb.AgentMessage_Pong{Pong: &pb.Pong{Sequence: m.Sequence, TimestampMs: m.TimestampMs}}
		} else {
			env.Payload = &pb.AgentMessage_Ping{Ping: &pb.Ping{Sequence: m.Sequence, TimestampMs: m.TimestampMs}}
		}
	}
	return env
}

// TestRoundTripProtocol: protocol message → pb → wire → pb → protocol.
func TestRoundTripProtocol(t *testing.T) {
	for _, c := range protocolMessages() {
		t.Run(c.name, func(t *testing.T) {
			wire, err := proto.Marshal(toPB(c.t, c.msg))
			if err != nil {
				t.Fatal(err)
			}
			var m pb.AgentMessage
			if err := proto.Unmarshal(wire, &m); err != nil {
				t.Fatal(err)
			}
			got, err := fromPB(c.t, &m)
			if err != nil {
				t.Fatal(err)
			}
			if d, ok := got.(*protocol.Decision); ok {
				if err := d.Normalize(); err != nil {
					t.Fatal(err)
				}
			}
			if g, w := canon(got), canon(c.msg); g != w {
				t.Fatalf("round trip changed the message\n got %s\nwant %s", g, w)
			}
		})
	}
}

// TestRoundTripPB: pb envelope → protocol message → pb.
func TestRoundTripPB(t *testing.T) {
	for _, c := range protocolMessages() {
		t.Run(c.name, func(t *testing.T) {
			want := toPB(c.t, c.msg)
			msg, err := fromPB(c.t, want)
			if err != nil {
				t.Fatal(err)
			}
			if got := toPB(c.t, msg); !proto.Equal(got, want) {
				t.Fatalf("pb round trip differs\n got %v\nwant %v", got, want)
			}
		})
	}
}

// TestToPBReuse: converting into a pb message that held another message
// leaves nothing of the old one (the …ToPB functions reuse what dst holds).
func TestToPBReuse(t *testing.T) {
	msgs := protocolMessages()
	var rh pb.RequestHeaders
	var dec pb.AgentDecision
	var mut pb.BodyMutation
	for round := 0; round < 2; round++ {
		for i := range msgs {
			c := msgs[(i*7+round)%len(msgs)]
			fresh := toPB(c.t, c.msg)
			switch m := c.msg.(type) {
			case *protocol.RequestHeaders:
				RequestHeadersToPB(&rh, m)
				if !proto.Equal(&rh, fresh.GetRequestHeaders()) {
					t.Fatalf("%s: reused %v, fresh %v", c.name, &rh, fresh.GetRequestHeaders())
				}
			case *protocol.Decision:
				DecisionToPB(&dec, m)
				if !proto.Equal(&dec, fresh.GetDecision()) {
					t.Fatalf("%s: reused %v, fresh %v", c.name, &dec, fresh.GetDecision())
				}
			case *protocol.BodyMutation:
				BodyMutationToPB(&mut, m)
				if !proto.Equal(&mut, fresh.GetBodyMutation()) {
					t.Fatalf("%s: reused %v, fresh %v", c.name, &mut, fresh.GetBodyMutation())
				}
			}
		}
	}
}

// TestMutationPresence: pass, drop and replace survive the wire as absent,
// empty and non-empty data.
func TestMutationPresence(t *testing.T) {
	for _, c := range []struct {
		action protocol.MutationAction
		data   []byte
		want   protocol.MutationAction
	}{
		{protocol.MutationPass, nil, protocol.MutationPass},
		{protocol.MutationPass, b("ignored"), protocol.MutationPass},
		{protocol.MutationDrop, nil, protocol.MutationDrop},
		{protocol.MutationReplace, b("x"), protocol.MutationReplace},
		{protocol.MutationReplace, nil, protocol.MutationDrop}, // replace with nothing
	} {
		var p pb.BodyMutation
		BodyMutationToPB(&p, &protocol.BodyMutation{Action: c.action, Data: c.data})
		wire, err := proto.Marshal(&p)
		if err != nil {
			t.Fatal(err)
		}
		var back pb.BodyMutation
		if err := proto.Unmarshal(wire, &back); err != nil {
			t.Fatal(err)
		}
		var m protocol.BodyMutation
		if err := BodyMutationFromPB(&m, 1, &back); err != nil {
			t.Fatal(err)
		}
		if m.Action != c.want {
			t.Errorf("action %d data %q: decoded action %d, want %d", c.action, c.data, m.Action, c.want)
		}
	}
}

// readPB is what the proxy does with a decision: decode it (here with the
// generated code), then Normalize it.
func readPB(d *protocol.Decision, id uint64, src *pb.AgentDecision) error {
	if err := DecisionFromPB(d, id, src); err != nil {
		return err
	}
	return d.Normalize()
}

// TestDecisionFromPBErrors: replies the proxy must refuse.
func TestDecisionFromPBErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		d    *pb.AgentDecision
		want error
	}{
		{"nil", nil, protocol.ErrProtocolDecision},
		{"no verdict", &pb.AgentDecision{}, protocol.ErrProtocolDecision},
		{"redirect without url", &pb.AgentDecision{Decision: &pb.AgentDecision_Redirect{Redirect: &pb.Redirect{Status: 302}}}, protocol.ErrProtocolDecision},
		{"unspecified op", &pb.AgentDecision{Decision: &pb.AgentDecision_Allow{Allow: &pb.Allow{}}, RequestHeaders: []*pb.HeaderOp{{Name: b("x")}}}, protocol.ErrProtocolField},
		{"unknown op", &pb.AgentDecision{Decision: &pb.AgentDecision_Allow{Allow: &pb.Allow{}}, ResponseHeaders: []*pb.HeaderOp{{Operation: 99, Name: b("x")}}}, protocol.ErrProtocolField},
		{"op without name", &pb.AgentDecision{Decision: &pb.AgentDecision_Allow{Allow: &pb.Allow{}}, RequestHeaders: []*pb.HeaderOp{{Operation: pb.HeaderOp_SET}}}, protocol.ErrProtocolField},
		{"bad mutation phase", &pb.AgentDecision{Decision: &pb.AgentDecision_Allow{Allow: &pb.Allow{}}, RequestBodyMutation: &pb.BodyMutation{Phase: 5}}, protocol.ErrProtocolField},
	} {
		t.Run(c.name, func(t *testing.T) {
			var d protocol.Decision
			err := readPB(&d, 77, c.d)
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			if d.RequestID != 77 {
				t.Fatalf("request id %d not kept on error", d.RequestID)
			}
		})
	}
	// Defaults of an empty block and redirect status, as in the JSON form.
	var d protocol.Decision
	if err := readPB(&d, 1, &pb.AgentDecision{Decision: &pb.AgentDecision_Block{Block: &pb.Block{}}}); err != nil || d.Status != 403 {
		t.Fatalf("empty block: status %d err %v", d.Status, err)
	}
	if err := readPB(&d, 1, &pb.AgentDecision{Decision: &pb.AgentDecision_Redirect{Redirect: &pb.Redirect{Url: b("/x")}}}); err != nil || d.Status != 302 {
		t.Fatalf("redirect: status %d err %v", d.Status, err)
	}
	if err := readPB(&d, 1, &pb.AgentDecision{Decision: &pb.AgentDecision_NeedsMoreDecision{NeedsMoreDecision: &pb.NeedsMore{}}}); err != nil || d.Final() {
		t.Fatalf("needs_more verdict: final=%v err %v", d.Final(), err)
	}
}

// TestDecisionFromPBReuse: a reused Decision keeps nothing of the last one.
func TestDecisionFromPBReuse(t *testing.T) {
	var d protocol.Decision
	full := protocolMessages()[8].msg.(*protocol.Decision)
	if err := DecisionFromPB(&d, 1, toPB(protocol.TypeDecision, full).GetDecision()); err != nil {
		t.Fatal(err)
	}
	if err := DecisionFromPB(&d, 2, &pb.AgentDecision{Decision: &pb.AgentDecision_Allow{Allow: &pb.Allow{}}}); err != nil {
		t.Fatal(err)
	}
	if want := canon(&protocol.Decision{RequestID: 2}); canon(&d) != want {
		t.Fatalf("reused decision kept state:\n got %s\nwant %s", canon(&d), want)
	}
}
