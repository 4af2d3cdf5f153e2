package udsclient_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/uds"
)

// TestPayloadEncodingNegotiated: protobuf payloads only when the proxy
// offers them and the agent declares them (docs/protocol.md §2.7), and a
// real round trip works either way.
func TestPayloadEncodingNegotiated(t *testing.T) {
	cases := []struct {
		name         string
		agentJSON    bool // sdk.Options.JSONPayloads
		proxyJSON    bool // Config.JSONOnly
		rawJSONAgent bool // a hand-written agent that knows nothing of the feature
		want         uds.Encoding
	}{
		{name: "both willing", want: uds.Protobuf},
		{name: "agent keeps JSON", agentJSON: true, want: uds.JSON},
		{name: "proxy keeps JSON", proxyJSON: true, want: uds.JSON},
		{name: "agent without the feature", rawJSONAgent: true, want: uds.JSON},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := testutil.SocketPath(t)
			if tc.rawJSONAgent {
				testagent.Raw(t, path, allCaps, func(nc net.Conn, fr *uds.FrameReader) {
					for {
						p, ok := testagent.NextHeaders(fr)
						if !ok {
							return
						}
						id, _ := protocol.PeekRequestID(p)
						_ = uds.WriteFrame(nc, &protocol.Decision{RequestID: id})
					}
				})
			} else {
				testagent.ServeWith(t, path, newTestHandler(allCaps), &sdk.Options{JSONPayloads: tc.agentJSON})
			}
			cfg := udsclient.DefaultConfig("enc", path)
			cfg.JSONOnly = tc.proxyJSON
			ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
			defer cancel()
			link, caps, err := udsclient.Dial(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer link.Close()
			if got := link.Encoding(); got != tc.want || caps.SupportsProtobufPayloads != (tc.want == uds.Protobuf) {
				t.Fatalf("encoding %s, capability %v; want %s", got, caps.SupportsProtobufPayloads, tc.want)
			}
			c := newClient(t, path, func(c *udsclient.Config) { c.JSONOnly = tc.proxyJSON })
			if _, err := roundTrip(ctx, c, headers("x-id", "7")); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// protobufAgent runs a hand-written agent at path that declares
// supports_protobuf_payloads and writes, for each RequestHeaders event,
// what answer returns for it. The events must really be protobuf: one that
// is not is sent on the returned channel (and the connection ends), for
// the test to fail on.
func protobufAgent(t *testing.T, path string, answer func(id uint64, m *protocol.RequestHeaders) []byte) <-chan string {
	caps := allCaps
	caps.SupportsProtobufPayloads = true
	wrongWire := make(chan string, 16)
	testagent.Raw(t, path, caps, func(nc net.Conn, fr *uds.FrameReader) {
		var f pbwire.Frame
		for {
			p, ok := testagent.NextHeaders(fr)
			if !ok {
				return
			}
			var m protocol.RequestHeaders
			if f.ParseAs(protocol.TypeRequestHeaders, p); f.Err != nil || f.DecodeRequestHeaders(&m) != nil {
				wrongWire <- string(p)
				return
			}
			if _, err := nc.Write(answer(f.RequestID, &m)); err != nil {
				return
			}
		}
	})
	return wrongWire
}

// protobufFrame is a frame of type t carrying the AgentMessage of m.
func protobufFrame(t testing.TB, m protocol.Message) []byte {
	t.Helper()
	b, err := uds.AppendFrameAs(nil, m, uds.Protobuf)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestProtobufRepliesFromHostileAgent: an agent on protobuf payloads that
// answers with what the wire allows but the protocol does not. A reply
// whose request is known fails that request only; one without a request id
// drops the connection, which comes back; nothing panics.
func TestProtobufRepliesFromHostileAgent(t *testing.T) {
	path := testutil.SocketPath(t)
	wrongWire := protobufAgent(t, path, func(id uint64, m *protocol.RequestHeaders) []byte {
		var out []byte
		switch string(m.Headers.Get("x-case")) {
		case "mismatch": // a Decision frame carrying a body mutation
			out = protobufFrame(t, &protocol.BodyMutation{RequestID: id, Action: protocol.MutationDrop})
			out[4] = byte(protocol.TypeDecision)
		case "agent-error":
			out, _ = uds.AppendRawFrame(nil, protocol.TypeDecision, pbwire.AppendAgentError(nil, id, "handler exploded"))
		case "bad-payload": // request id, then a payload field with a bad length
			pl := append(protowireVarint(nil, 0x08, id), 0x32, 0x7f, 0x01)
			out, _ = uds.AppendRawFrame(nil, protocol.TypeDecision, pl)
		case "json": // JSON on a protobuf connection: no readable request id
			out, _ = uds.AppendFrame(nil, &protocol.Decision{RequestID: id})
		case "no-id":
			out, _ = uds.AppendRawFrame(nil, protocol.TypeDecision, []byte{0xff, 0xff, 0xff})
		default:
			out = protobufFrame(t, &protocol.Decision{RequestID: id,
				RequestHeaderOps: []protocol.HeaderOp{{Op: protocol.HeaderSet, Name: []byte("x-echo"), Value: m.Headers.Get("x-id")}}})
		}
		return out
	})
	c := newClient(t, path, func(c *udsclient.Config) { c.MessageTimeout = time.Minute })
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	d, err := roundTrip(ctx, c, headers("x-id", "41"))
	if err != nil || len(d.RequestHeaderOps) != 1 || string(d.RequestHeaderOps[0].Value) != "41" {
		t.Fatalf("good reply: %+v, %v", d, err)
	}
	for _, kase := range []string{"mismatch", "agent-error", "bad-payload"} {
		_, err := roundTrip(ctx, c, headers("x-case", kase))
		if !errors.Is(err, agentmux.ErrAgentProtocol) {
			t.Fatalf("%s: err = %v, want ErrAgentProtocol", kase, err)
		}
		if kase == "agent-error" && !strings.Contains(err.Error(), "handler exploded") {
			t.Fatalf("agent error lost its reason: %v", err)
		}
		// The connection survives a reply whose request is known.
		if _, err := roundTrip(ctx, c, headers("x-id", "1")); err != nil {
			t.Fatalf("after %s: %v", kase, err)
		}
	}
	// Without a readable request id nobody can be told: the connection is
	// dropped (its requests fail at once) and redialed. JSON on a protobuf
	// connection is such a reply: '{' is not a valid protobuf field.
	for _, kase := range []string{"no-id", "json"} {
		if _, err := roundTrip(ctx, c, headers("x-case", kase)); !errors.Is(err, agentmux.ErrAgentConnLost) {
			t.Fatalf("%s: err = %v, want ErrAgentConnLost", kase, err)
		}
		for {
			if _, err := roundTrip(ctx, c, headers()); err == nil {
				break
			} else if ctx.Err() != nil {
				t.Fatalf("proxy side never recovered after %s: %v", kase, err)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	select {
	case p := <-wrongWire:
		t.Fatalf("proxy sent a non-protobuf event on a protobuf connection: %q", p)
	default:
	}
}

// protowireVarint appends tag then v as varints.
func protowireVarint(dst []byte, tag byte, v uint64) []byte {
	dst = append(dst, tag)
	for v >= 0x80 {
		dst = append(dst, byte(v)|0x80)
		v >>= 7
	}
	return append(dst, byte(v))
}
