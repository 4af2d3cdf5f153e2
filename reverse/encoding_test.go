package reverse

import (
	"bytes"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/conformance"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/uds"
)

// TestConformanceReverseJSON runs the conversation suite over reverse
// connections kept on JSON payloads by the agent's configuration
// (TestConformanceReverse runs it on the default, protobuf).
func TestConformanceReverseJSON(t *testing.T) {
	conformance.Run(t, func(t *testing.T, h sdk.Handler) agentmux.Agent {
		return dialReverseWith(t, h, func(c *Config) { c.Agents[0].JSONOnly = true })
	})
}

// TestRegistrationChoosesPayloadEncoding: the RegistrationResponse says
// "protobuf" exactly when the agent declared supports_protobuf_payloads,
// the agent's config allows it and the answer is a RegistrationResponse;
// the frames after it are then protobuf (a Ping is answered with the
// protobuf Pong), else JSON.
func TestRegistrationChoosesPayloadEncoding(t *testing.T) {
	cases := []struct {
		name      string
		declare   bool
		jsonOnly  bool
		frameType protocol.MsgType
		want      string
	}{
		{"declared", true, false, protocol.TypeRegistrationRequest, protocol.EncodingProtobuf},
		{"not declared", false, false, protocol.TypeRegistrationRequest, ""},
		{"agent config json", true, true, protocol.TypeRegistrationRequest, ""},
		{"handshake-frame compatibility", true, false, protocol.TypeHandshakeRequest, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Agents[0].JSONOnly = tc.jsonOnly
			startListener(t, cfg)
			c := dialRaw(t, "unix", cfg.UnixPath)
			req := regReq("waf-1", testToken)
			req.Capabilities.SupportsProtobufPayloads = tc.declare
			c.send(tc.frameType, req)
			_, resp := c.answer()
			if !resp.Accepted || resp.PayloadEncoding != tc.want {
				t.Fatalf("answer %+v, want accepted with payload_encoding %q", resp, tc.want)
			}
			// A Ping in the chosen encoding is answered in it.
			ping := &protocol.Ping{Sequence: 9, TimestampMs: 1763719200000}
			enc := appendJSONFrame
			if tc.want == protocol.EncodingProtobuf {
				enc = appendProtobufFrame
			}
			frame, err := enc(ping)
			if err != nil {
				t.Fatal(err)
			}
			pong, err := enc((*protocol.Pong)(ping))
			if err != nil {
				t.Fatal(err)
			}
			c.sendRaw(frame)
			typ, payload, err := c.fr.Next()
			if err != nil {
				t.Fatal(err)
			}
			if typ != protocol.TypePong || !bytes.Equal(payload, pong[5:]) {
				t.Fatalf("got %s % x, want the Pong % x", typ, payload, pong[5:])
			}
		})
	}
}

func appendProtobufFrame(m protocol.Message) ([]byte, error) {
	return uds.AppendFrameAs(nil, m, uds.Protobuf)
}

func appendJSONFrame(m protocol.Message) ([]byte, error) { return uds.AppendFrame(nil, m) }

// TestReversePayloadEncoding: the suite's two reverse runs really differ —
// the SDK agent registers on protobuf payloads by default and on JSON when
// the agent's config says json — as the registered capabilities say.
func TestReversePayloadEncoding(t *testing.T) {
	h := &sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true}}
	for _, jsonOnly := range []bool{false, true} {
		a := dialReverseWith(t, h, func(c *Config) { c.Agents[0].JSONOnly = jsonOnly })
		if got := a.Capabilities().SupportsProtobufPayloads; got == jsonOnly {
			t.Errorf("JSONOnly %v: protobuf payloads %v", jsonOnly, got)
		}
	}
}
