package grpcwire

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/zentinelproxy/sidecar/grpcagent/pb"
	"github.com/zentinelproxy/sidecar/protocol"
)

func hdrs(kv ...string) protocol.Headers {
	var h protocol.Headers
	for i := 0; i+1 < len(kv); i += 2 {
		h = h.Add([]byte(kv[i]), []byte(kv[i+1]))
	}
	return h
}

func b(s string) []byte { return []byte(s) }

// protocolMessages is one of every message a stream carries, with every
// field set somewhere, in the form a decoder followed (for a Decision) by
// protocol.Decision.Normalize produces them.
func protocolMessages() []struct {
	name string
	t    protocol.MsgType
	msg  any
} {
	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	return []struct {
		name string
		t    protocol.MsgType
		msg  any
	}{
		{"request headers", protocol.TypeRequestHeaders, &protocol.RequestHeaders{
			RequestID: 1<<63 + 5, Method: b("POST"), URI: b("/api/users?id=7&x=\xff"), HasBody: true,
			Headers: hdrs("host", "example.com", "accept", "*/*", "x-bin", "\x80\xfe", "accept", "text/html", "x-empty", ""),
			Metadata: protocol.Metadata{
				CorrelationID: b("b9e2"), ClientIP: b("10.0.0.9"), ClientPort: 51234, Protocol: b("HTTP/2"),
				ServerName: b("example.com"), RouteID: b("default"), UpstreamID: b("app"),
				Traceparent: b("00-ab-cd-01"), Timestamp: b("2026-11-21T10:00:00Z"),
			},
		}},
		{"request headers tls", protocol.TypeRequestHeaders, &protocol.RequestHeaders{
			RequestID: 9, Method: b("GET"), URI: b("/ws"), Headers: hdrs("host", "api.example.com", "upgrade", "websocket"),
			Metadata: protocol.Metadata{
				ClientIP: b("10.0.0.9"), Protocol: b("HTTP/1.1"), ServerName: b("api.example.com"),
				TLSVersion: b("TLS1.3"), TLSCipher: b("TLS_AES_128_GCM_SHA256"), TLSServerName: b("api.example.com"),
				TLSClientSubject: b("CN=billing,O=Example"), TLSClientSAN: b("DNS:billing.internal,URI:spiffe://example.org/billing"),
			},
		}},
		{"request headers minimal", protocol.TypeRequestHeaders, &protocol.RequestHeaders{RequestID: 2, Method: b("GET"), URI: b("/")}},
		{"request chunk", protocol.TypeRequestBodyChunk, &protocol.BodyChunk{RequestID: 3, ChunkIndex: 7, Data: binary, IsLast: true, TotalSize: 4096, Progress: 2048}},
		{"request chunk unknown sizes", protocol.TypeRequestBodyChunk, &protocol.BodyChunk{RequestID: 3, Data: b("x"), TotalSize: -1, Progress: -1}},
		{"request chunk zero total", protocol.TypeRequestBodyChunk, &protocol.BodyChunk{RequestID: 3, TotalSize: 0, Progress: 0}},
		{"response headers", protocol.TypeResponseHeaders, &protocol.ResponseHeaders{RequestID: 4, StatusCode: 204, Headers: hdrs("content-type", "text/html", "set-cookie", "a=1", "set-cookie", "b=2"), HasBody: true}},
		{"response chunk", protocol.TypeResponseBodyChunk, &protocol.BodyChunk{RequestID: 5, ChunkIndex: 1, Data: b("hello"), TotalSize: -1, Progress: 10}},
		{"decision allow", protocol.TypeDecision, &protocol.Decision{RequestID: 6, Kind: protocol.DecisionAllow}},
		{"decision allow full", protocol.TypeDecision, &protocol.Decision{
			RequestID: 6, Kind: protocol.DecisionAllow, NeedsMore: true,
			RequestHeaderOps: []protocol.HeaderOp{
				{Op: protocol.HeaderSet, Name: b("x-user"), Value: b("42")},
				{Op: protocol.HeaderRemove, Name: b("cookie")},
				{Op: protocol.HeaderAdd, Name: b("x-empty"), Value: b("")},
			},
			ResponseHeaderOps:       []protocol.HeaderOp{{Op: protocol.HeaderAdd, Name: b("x-frame-options"), Value: b("DENY")}},
			HasRequestBodyMutation:  true,
			RequestBodyMutation:     protocol.BodyMutation{RequestID: 6, Phase: protocol.PhaseRequest, ChunkIndex: 2, Action: protocol.MutationReplace, Data: b("r")},
			HasResponseBodyMutation: true,
			ResponseBodyMutation:    protocol.BodyMutation{RequestID: 6, Phase: protocol.PhaseResponse, ChunkIndex: 0, Action: protocol.MutationDrop},
			Audit: protocol.Audit{
				Tags: [][]byte{b("sqli"), b("xss")}, RuleIDs: [][]byte{b("942100")}, Confidence: 0, HasConf: true,
				ReasonCodes: [][]byte{b("R1")}, Custom: b(`{"k":[1,2]}`),
			},
		}},
		{"decision block", protocol.TypeDecision, &protocol.Decision{RequestID: 7, Kind: protocol.DecisionBlock, Status: 451, Body: b("denied"), BlockHeaders: hdrs("x-reason", "policy")}},
		{"decision block no_store", protocol.TypeDecision, &protocol.Decision{RequestID: 7, Kind: protocol.DecisionBlock, Status: 403, Cache: protocol.CacheDirective{NoStore: true}}},
		{"decision allow cached", protocol.TypeDecision, &protocol.Decision{RequestID: 7, Kind: protocol.DecisionAllow, Cache: protocol.CacheDirective{TTLMs: 30000}}},
		{"decision redirect", protocol.TypeDecision, &protocol.Decision{RequestID: 8, Kind: protocol.DecisionRedirect, Status: 308, RedirectURL: b("https://login.example.com/")}},
		{"decision needs_more", protocol.TypeDecision, &protocol.Decision{RequestID: 9, Kind: protocol.DecisionNeedsMore, NeedsMore: true}},
		{"mutation pass", protocol.TypeBodyMutation, &protocol.BodyMutation{RequestID: 10, ChunkIndex: 1, Action: protocol.MutationPass}},
		{"mutation drop", protocol.TypeBodyMutation, &protocol.BodyMutation{RequestID: 10, ChunkIndex: 2, Action: protocol.MutationDrop, Phase: protocol.PhaseResponse}},
		{"mutation replace", protocol.TypeBodyMutation, &protocol.BodyMutation{RequestID: 10, ChunkIndex: 3, Action: protocol.MutationReplace, Data: binary}},
		{"cancel", protocol.TypeCancelRequest, &protocol.CancelRequest{RequestID: 11, Reason: b("client_disconnect")}},
		{"cancel all", protocol.TypeCancelAll, &protocol.CancelAll{Reason: b("shutdown")}},
		{"ping", protocol.TypePing, &protocol.Ping{Sequence: 7, TimestampMs: 1763719200000}},
		{"pong", protocol.TypePong, &protocol.Ping{Sequence: 8, TimestampMs: -1}},
		{"request headers inline body", protocol.TypeRequestHeaders, &protocol.RequestHeaders{
			RequestID: 12, Method: b("POST"), URI: b("/upload"), HasBody: true, Headers: hdrs("host", "example.com", "content-length", "256"),
			HasInlineBody: true, InlineBody: protocol.BodyChunk{Data: binary, IsLast: true, TotalSize: 256, Progress: 256},
		}},
		{"request headers inline first chunk", protocol.TypeRequestHeaders, &protocol.RequestHeaders{
			RequestID: 13, Method: b("POST"), URI: b("/"), HasBody: true,
			HasInlineBody: true, InlineBody: protocol.BodyChunk{Data: b("first"), TotalSize: -1, Progress: -1},
		}},
		{"request headers inline empty", protocol.TypeRequestHeaders, &protocol.RequestHeaders{
			RequestID: 14, Method: b("POST"), URI: b("/"), HasBody: true,
			HasInlineBody: true, InlineBody: protocol.BodyChunk{IsLast: true, TotalSize: 0, Progress: 0},
		}},
		{"request headers timeout", protocol.TypeRequestHeaders, &protocol.RequestHeaders{
			RequestID: 15, TimeoutMs: 1000, Method: b("POST"), URI: b("/"), HasBody: true,
			HasInlineBody: true, InlineBody: protocol.BodyChunk{Data: b("first"), TotalSize: -1, Progress: -1},
		}},
		{"request chunk timeout", protocol.TypeRequestBodyChunk, &protocol.BodyChunk{RequestID: 15, TimeoutMs: 850, ChunkIndex: 1, Data: b("x"), IsLast: true, TotalSize: -1, Progress: -1}},
		{"response headers timeout", protocol.TypeResponseHeaders, &protocol.ResponseHeaders{RequestID: 15, TimeoutMs: 4294967295, StatusCode: 200}},
		{"response chunk timeout", protocol.TypeResponseBodyChunk, &protocol.BodyChunk{RequestID: 15, TimeoutMs: 1, Data: b("y"), TotalSize: -1, Progress: -1}},
		{"request headers client", protocol.TypeRequestHeaders, &protocol.RequestHeaders{
			RequestID: 12, Method: b("POST"), URI: b("/upload?x=1"), RequestTarget: b("http://Example.COM./upload?x=1"), HasBody: true,
			Headers: hdrs("host", "example.com", "transfer-encoding", "chunked", "connection", "keep-alive, x-hop", "x-hop", "1", "x-forwarded-for", "203.0.113.9"),
			Metadata: protocol.Metadata{
				ClientIP: b("192.0.2.7"), ClientPort: 51234, Protocol: b("HTTP/1.1"), ServerName: b("example.com"),
				ServerIP: b("10.0.0.2"), ServerPort: 8080, ListenerID: b("public"), UpstreamHost: b("app.internal:9000"),
				ForwardedFor: b("192.0.2.7"), ForwardedProto: b("http"), ForwardedHost: b("example.com"),
			},
		}},
	}
}

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

// canon renders a protocol message for comparison: exported fields only,
// nil and empty byte slices alike.
func canon(v any) string {
	var sb strings.Builder
	canonValue(&sb, reflect.ValueOf(v))
	return sb.String()
}

func canonValue(sb *strings.Builder, v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			sb.WriteString("nil")
			return
		}
		canonValue(sb, v.Elem())
	case reflect.Struct:
		sb.WriteString("{")
		for i := 0; i < v.NumField(); i++ {
			if !v.Type().Field(i).IsExported() {
				continue
			}
			sb.WriteString(v.Type().Field(i).Name + ":")
			canonValue(sb, v.Field(i))
			sb.WriteString(" ")
		}
		sb.WriteString("}")
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			fmt.Fprintf(sb, "%q", v.Bytes())
			return
		}
		sb.WriteString("[")
		for i := 0; i < v.Len(); i++ {
			canonValue(sb, v.Index(i))
			sb.WriteString(",")
		}
		sb.WriteString("]")
	default:
		fmt.Fprintf(sb, "%v", v.Interface())
	}
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

func TestCapabilitiesRoundTrip(t *testing.T) {
	caps := protocol.Capabilities{HandlesRequestHeaders: true, HandlesResponseBody: true, SupportsCancellation: true, MaxConcurrentRequests: 100}
	if got := CapabilitiesFromPB(CapabilitiesToPB(caps)); got != caps {
		t.Fatalf("capabilities %+v, want %+v", got, caps)
	}
	inline := protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true, SupportsInlineBody: true}
	if p := CapabilitiesToPB(inline); !p.SupportsInlineBody {
		t.Fatal("supports_inline_body lost on the way to protobuf")
	} else if got := CapabilitiesFromPB(p); got != inline {
		t.Fatalf("capabilities %+v, want %+v", got, inline)
	}
	client := protocol.Capabilities{HandlesRequestHeaders: true, SupportsClientRequest: true}
	if p := CapabilitiesToPB(client); !p.SupportsClientRequest {
		t.Fatal("supports_client_request lost on the way to protobuf")
	} else if got := CapabilitiesFromPB(p); got != client {
		t.Fatalf("capabilities %+v, want %+v", got, client)
	}
	if got := CapabilitiesFromPB(nil); got != (protocol.Capabilities{}) {
		t.Fatalf("nil capabilities %+v", got)
	}
	req := protocol.HandshakeRequest{ProtocolVersion: 2, ClientName: "sidecar", SupportedFeatures: []string{"cancellation", "streaming"}}
	if got := CapabilityRequestFromPB(CapabilityRequestToPB(&req)); !reflect.DeepEqual(got, req) {
		t.Fatalf("request %+v, want %+v", got, req)
	}
	for _, resp := range []protocol.HandshakeResponse{
		{ProtocolVersion: 2, AgentName: "waf", Accepted: true, Capabilities: caps},
		{ProtocolVersion: 3, AgentName: "waf", Accepted: false, Error: "version"},
	} {
		if got := CapabilityResponseFromPB(CapabilityResponseToPB(&resp)); !reflect.DeepEqual(got, resp) {
			t.Fatalf("response %+v, want %+v", got, resp)
		}
	}
	// Without accepted (the seed's shape) a response is an acceptance.
	if got := CapabilityResponseFromPB(&pb.CapabilityResponse{ProtocolVersion: 2}); !got.Accepted {
		t.Fatal("response without accepted was not an acceptance")
	}
}
