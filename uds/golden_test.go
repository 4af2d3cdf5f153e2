package uds

import (
	"encoding/hex"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/protocol"
)

var update = flag.Bool("update", false, "rewrite testdata/uds golden frames from the encoder")

// goldenMessages are the canonical frames kept in testdata/uds. With
// -update they are rewritten; otherwise TestGoldenFramesRoundTrip checks
// that each decodes and re-encodes byte for byte.
func goldenMessages() map[string]struct {
	t   protocol.MsgType
	msg protocol.Message
} {
	rh := &protocol.RequestHeaders{RequestID: 1, Method: []byte("GET"), URI: []byte("/api/users?id=7"),
		Headers: protocol.Headers{{Name: []byte("host"), Value: []byte("example.com")}, {Name: []byte("accept"), Value: []byte("*/*")}, {Name: []byte("accept"), Value: []byte("text/html")}},
		Metadata: protocol.Metadata{CorrelationID: []byte("b9e2"), ClientIP: []byte("10.0.0.9"), ClientPort: 51234, Protocol: []byte("HTTP/1.1"),
			ServerName: []byte("example.com"), RouteID: []byte("default"), UpstreamID: []byte("app"), Traceparent: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"), Timestamp: []byte("2026-11-21T10:00:00Z")}}
	type gm = struct {
		t   protocol.MsgType
		msg protocol.Message
	}
	return map[string]gm{
		"request_headers.hex": {protocol.TypeRequestHeaders, rh},
		"request_headers_timeout.hex": {protocol.TypeRequestHeaders, &protocol.RequestHeaders{RequestID: 5, TimeoutMs: 1000, Method: []byte("GET"), URI: []byte("/"),
			Headers: protocol.Headers{{Name: []byte("host"), Value: []byte("example.com")}}}},
		"request_body_chunk.hex":  {protocol.TypeRequestBodyChunk, (&protocol.BodyChunk{RequestID: 1, ChunkIndex: 0, Data: []byte("hello"), IsLast: false, TotalSize: 11, Progress: 5}).As(protocol.PhaseRequest)},
		"response_body_chunk.hex": {protocol.TypeResponseBodyChunk, (&protocol.BodyChunk{RequestID: 1, ChunkIndex: 2, Data: []byte("world"), IsLast: true, TotalSize: -1, Progress: -1}).As(protocol.PhaseResponse)},
		"response_headers.hex": {protocol.TypeResponseHeaders, &protocol.ResponseHeaders{RequestID: 1, StatusCode: 200, HasBody: true,
			Headers: protocol.Headers{{Name: []byte("content-type"), Value: []byte("text/html")}}}},
		"decision_allow.hex": {protocol.TypeDecision, &protocol.Decision{RequestID: 1,
			RequestHeaderOps:  []protocol.HeaderOp{{Op: protocol.HeaderSet, Name: []byte("x-user"), Value: []byte("42")}, {Op: protocol.HeaderRemove, Name: []byte("cookie")}},
			ResponseHeaderOps: []protocol.HeaderOp{{Op: protocol.HeaderAdd, Name: []byte("x-frame-options"), Value: []byte("DENY")}}}},
		"decision_block.hex": {protocol.TypeDecision, &protocol.Decision{RequestID: 2, Kind: protocol.DecisionBlock, Status: 403, Body: []byte("denied"),
			BlockHeaders: protocol.Headers{{Name: []byte("x-reason"), Value: []byte("policy")}}}},
		"decision_redirect.hex":   {protocol.TypeDecision, &protocol.Decision{RequestID: 3, Kind: protocol.DecisionRedirect, Status: 302, RedirectURL: []byte("https://login.example.com/")}},
		"decision_needs_more.hex": {protocol.TypeDecision, &protocol.Decision{RequestID: 4, Kind: protocol.DecisionNeedsMore, NeedsMore: true}},
		"body_mutation.hex":       {protocol.TypeBodyMutation, &protocol.BodyMutation{RequestID: 1, Phase: protocol.PhaseResponse, ChunkIndex: 3, Action: protocol.MutationReplace, Data: []byte("redacted")}},
		"body_mutation_drop.hex":  {protocol.TypeBodyMutation, &protocol.BodyMutation{RequestID: 1, ChunkIndex: 4, Action: protocol.MutationDrop}},
		"cancel_request.hex":      {protocol.TypeCancelRequest, &protocol.CancelRequest{RequestID: 1, Reason: []byte("client_disconnect")}},
		"cancel_all.hex":          {protocol.TypeCancelAll, &protocol.CancelAll{Reason: []byte("shutdown")}},
		"ping.hex":                {protocol.TypePing, &protocol.Ping{Sequence: 7, TimestampMs: 1763719200000}},
		"handshake_request.hex": {protocol.TypeHandshakeRequest, &protocol.HandshakeRequest{ProtocolVersion: 2, ClientName: "sidecar/0.1",
			SupportedFeatures: []string{"cancellation", "body_mutation", "streaming"}}},
		"handshake_response.hex": {protocol.TypeHandshakeResponse, &protocol.HandshakeResponse{ProtocolVersion: 2, AgentName: "waf", Accepted: true,
			Capabilities: protocol.Capabilities{HandlesRequestHeaders: true, SupportsCancellation: true, MaxConcurrentRequests: 100}}},
	}
}

func TestUpdateGoldenFrames(t *testing.T) {
	if !*update {
		t.Skip("run with -update to rewrite golden frames")
	}
	for name, g := range goldenMessages() {
		b, err := AppendFrame(nil, g.msg)
		if err != nil {
			t.Fatal(err)
		}
		if protocol.MsgType(b[4]) != g.t {
			t.Fatalf("%s: frame type %s, want %s", name, protocol.MsgType(b[4]), g.t)
		}
		out := hex.EncodeToString(b[:HeaderSize]) + "\n" + hexLines(b[HeaderSize:])
		if err := os.WriteFile(filepath.Join("../testdata/uds", name), []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestGoldenSetComplete(t *testing.T) {
	have := loadGolden(t)
	for name := range goldenMessages() {
		if have[name] == nil {
			t.Errorf("golden frame %s missing (go test ./uds -run Golden -update)", name)
		}
	}
}

func hexLines(b []byte) string {
	var sb strings.Builder
	for len(b) > 0 {
		n := min(32, len(b))
		sb.WriteString(hex.EncodeToString(b[:n]))
		sb.WriteByte('\n')
		b = b[n:]
	}
	return sb.String()
}
