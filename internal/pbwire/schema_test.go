package pbwire_test

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/zentinelproxy/sidecar/grpcagent/pb"
	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/protocol"
)

// readings reads one decision the three ways the proxy and its tests can:
// the JSON of a UDS or reverse agent, and the protobuf of a gRPC agent
// through the hand decoder and through the generated code. Each is
// decoded, then normalized, as agentmux does.
type readings struct {
	json, hand, generated    protocol.Decision
	jsonErr, handErr, genErr error
}

func readAll(t *testing.T, id uint64, payload []byte, d *pb.AgentDecision) readings {
	t.Helper()
	var r readings
	if r.jsonErr = r.json.Decode(payload); r.jsonErr == nil {
		r.jsonErr = r.json.Normalize()
	}
	wire, err := proto.Marshal(&pb.AgentMessage{RequestId: id, Payload: &pb.AgentMessage_Decision{Decision: d}})
	if err != nil {
		t.Fatal(err)
	}
	var f pbwire.Frame
	f.Parse(wire)
	if f.Err != nil || f.Payload != pbwire.PayloadDecision {
		t.Fatalf("envelope: %v, payload %d", f.Err, f.Payload)
	}
	if r.handErr = f.DecodeDecision(&r.hand); r.handErr == nil {
		r.handErr = r.hand.Normalize()
	}
	var env pb.AgentMessage
	if err := proto.Unmarshal(wire, &env); err != nil {
		t.Fatal(err)
	}
	r.genErr = readPB(&r.generated, env.RequestId, env.GetDecision())
	return r
}

// same fails unless the three readings agree: the same sentinel (want, nil
// for none) and, on success, the same Decision.
func (r *readings) same(t *testing.T, want error) {
	t.Helper()
	for _, e := range []struct {
		via string
		err error
	}{{"json", r.jsonErr}, {"hand", r.handErr}, {"generated", r.genErr}} {
		if (want == nil && e.err != nil) || (want != nil && !errors.Is(e.err, want)) {
			t.Fatalf("%s: err = %v, want %v", e.via, e.err, want)
		}
	}
	if want != nil {
		return
	}
	j, h, g := canon(&r.json), canon(&r.hand), canon(&r.generated)
	if j != h || h != g {
		t.Fatalf("readings differ\n json:      %s\n hand:      %s\n generated: %s", j, h, g)
	}
}

// TestOneSchema: a JSON reply and a protobuf reply that say the same thing
// read as the same Decision (or fail the same way), rule by rule: the
// codecs are syntactic and protocol.Decision.Normalize, shared by every
// transport, applies the schema.
func TestOneSchema(t *testing.T) {
	allow := &pb.AgentDecision_Allow{Allow: &pb.Allow{}}
	block := func(b *pb.Block) *pb.AgentDecision_Block { return &pb.AgentDecision_Block{Block: b} }
	redirect := func(r *pb.Redirect) *pb.AgentDecision_Redirect { return &pb.AgentDecision_Redirect{Redirect: r} }
	op := func(o pb.HeaderOp_Operation, name, value []byte) *pb.HeaderOp {
		return &pb.HeaderOp{Operation: o, Name: name, Value: value}
	}
	for _, c := range []struct {
		name string
		json string
		pb   *pb.AgentDecision
		want error
	}{
		{"allow", `{"request_id":7,"decision":"allow"}`, &pb.AgentDecision{Decision: allow}, nil},
		{"allow that needs more", `{"request_id":7,"decision":"Allow","needs_more":true}`,
			&pb.AgentDecision{Decision: allow, NeedsMore: true}, nil},
		{"needs_more verdict", `{"request_id":7,"decision":{"needs_more":true}}`,
			&pb.AgentDecision{Decision: &pb.AgentDecision_NeedsMoreDecision{NeedsMoreDecision: &pb.NeedsMore{}}}, nil},
		{"bare block is 403", `{"request_id":7,"decision":"block"}`, &pb.AgentDecision{Decision: block(&pb.Block{})}, nil},
		{"block status 0 is 403", `{"request_id":7,"decision":{"block":{"status":0,"body":"no"}}}`,
			&pb.AgentDecision{Decision: block(&pb.Block{Body: b("no")})}, nil},
		{"block with status and headers", `{"request_id":7,"decision":{"block":{"status":451,"headers":[["x-a","1"],["x-b","2"]]}}}`,
			&pb.AgentDecision{Decision: block(&pb.Block{Status: 451, Headers: []*pb.Header{{Name: b("x-a"), Value: b("1")}, {Name: b("x-b"), Value: b("2")}}})}, nil},
		{"block is final", `{"request_id":7,"decision":{"block":{}},"needs_more":true}`,
			&pb.AgentDecision{Decision: block(&pb.Block{}), NeedsMore: true}, nil},
		{"redirect is 302", `{"request_id":7,"decision":{"redirect":{"url":"/login"}}}`,
			&pb.AgentDecision{Decision: redirect(&pb.Redirect{Url: b("/login")})}, nil},
		{"redirect with status is final", `{"request_id":7,"decision":{"redirect":{"url":"/x","status":308}},"needs_more":true}`,
			&pb.AgentDecision{Decision: redirect(&pb.Redirect{Url: b("/x"), Status: 308}), NeedsMore: true}, nil},
		{"redirect without url", `{"request_id":7,"decision":{"redirect":{"status":301}}}`,
			&pb.AgentDecision{Decision: redirect(&pb.Redirect{Status: 301})}, protocol.ErrProtocolDecision},
		{"redirect with an empty url", `{"request_id":7,"decision":{"redirect":{"url":""}}}`,
			&pb.AgentDecision{Decision: redirect(&pb.Redirect{Url: []byte{}})}, protocol.ErrProtocolDecision},
		{"no verdict", `{"request_id":7,"needs_more":true}`, &pb.AgentDecision{NeedsMore: true}, protocol.ErrProtocolDecision},
		{"operations", `{"request_id":7,"decision":"allow","request_headers":[{"set":{"name":"x-a","value":"1"}},{"operation":"remove","name":"cookie","value":"ignored"}],"response_headers":[{"op":"add","name":"x-b","value":""}]}`,
			&pb.AgentDecision{Decision: allow,
				RequestHeaders:  []*pb.HeaderOp{op(pb.HeaderOp_SET, b("x-a"), b("1")), op(pb.HeaderOp_REMOVE, b("cookie"), b("ignored"))},
				ResponseHeaders: []*pb.HeaderOp{op(pb.HeaderOp_ADD, b("x-b"), nil)}}, nil},
		{"operation missing", `{"request_id":7,"decision":"allow","request_headers":[{"name":"x-a","value":"1"}]}`,
			&pb.AgentDecision{Decision: allow, RequestHeaders: []*pb.HeaderOp{op(pb.HeaderOp_OPERATION_UNSPECIFIED, b("x-a"), b("1"))}}, protocol.ErrProtocolField},
		{"operation without a name", `{"request_id":7,"decision":"allow","response_headers":[{"operation":"set","value":"1"}]}`,
			&pb.AgentDecision{Decision: allow, ResponseHeaders: []*pb.HeaderOp{op(pb.HeaderOp_SET, nil, b("1"))}}, protocol.ErrProtocolField},
		{"operation with an empty name", `{"request_id":7,"decision":{"block":{}},"response_headers":[{"operation":"set","name":"","value":"1"}]}`,
			&pb.AgentDecision{Decision: block(&pb.Block{}), ResponseHeaders: []*pb.HeaderOp{op(pb.HeaderOp_SET, []byte{}, b("1"))}}, protocol.ErrProtocolField},
		{"embedded mutations belong to their key and decision", `{"request_id":7,"decision":"allow","request_body_mutation":{"phase":"response","chunk_index":1,"data":"eA=="},"response_body_mutation":{"request_id":3,"data":""}}`,
			&pb.AgentDecision{Decision: allow,
				RequestBodyMutation:  &pb.BodyMutation{Phase: pb.Phase_PHASE_RESPONSE, ChunkIndex: 1, Data: b("x")},
				ResponseBodyMutation: &pb.BodyMutation{Data: []byte{}}}, nil},
		{"audit", `{"request_id":7,"decision":"allow","audit":{"tags":["a"],"rule_ids":["942100"],"confidence":0.5,"reason_codes":["r"],"custom":{"k":1}}}`,
			&pb.AgentDecision{Decision: allow, Audit: &pb.AuditMetadata{Tags: [][]byte{b("a")}, RuleIds: [][]byte{b("942100")},
				Confidence: proto.Float64(0.5), ReasonCodes: [][]byte{b("r")}, Custom: b(`{"k":1}`)}}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := readAll(t, 7, []byte(c.json), c.pb)
			r.same(t, c.want)
			for _, d := range []*protocol.Decision{&r.json, &r.hand, &r.generated} {
				if d.RequestID != 7 {
					t.Fatalf("request id %d, want 7 (kept even on error)", d.RequestID)
				}
			}
		})
	}
}

// TestOneSchemaEncoders: every decision of the suite, sent by the JSON
// encoder of a UDS agent and by the generated code of a gRPC agent, reads
// back as itself.
func TestOneSchemaEncoders(t *testing.T) {
	for _, c := range protocolMessages() {
		want, ok := c.msg.(*protocol.Decision)
		if !ok {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			r := readAll(t, want.RequestID, protocol.AppendDecision(nil, want), toPB(c.t, want).GetDecision())
			r.same(t, nil)
			if got := canon(&r.json); got != canon(want) {
				t.Fatalf("read back\n got %s\nwant %s", got, canon(want))
			}
		})
	}
}
