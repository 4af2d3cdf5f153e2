package sdk_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/zentinelproxy/sidecar/handshake"
	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/uds"
)

type echoHandler struct{ sdk.Base }

func (echoHandler) OnRequestHeaders(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
	d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderSet, Name: []byte("x-echo"), Value: append([]byte(nil), m.URI...)})
	return nil
}

// TestProtobufEventWithUnknownEnvelopeField: a proxy built on a
// newer agent.proto that adds a bytes field to the AgentMessage envelope
// writes it after the payload. docs/protocol.md §2.7: unknown fields are
// skipped, as protobuf decoders do; the generated decoder reads the
// message as a RequestHeaders. The SDK must answer it with a Decision, not
// with an agent error.
func TestProtobufEventWithUnknownEnvelopeField(t *testing.T) {
	nc, fr := serveProtobuf(t, nil)
	for i, order := range []string{"before", "after"} {
		id := uint64(100 + i)
		body, _ := pbwire.AppendMessage(nil, &protocol.RequestHeaders{RequestID: id, Method: []byte("GET"), URI: []byte("/" + order)})
		unknown := protowire.AppendBytes(protowire.AppendTag(nil, 20, protowire.BytesType), []byte("trace"))
		var payload []byte
		if order == "before" {
			payload = append(append(payload, unknown...), body...)
		} else {
			payload = append(append(payload, body...), unknown...)
		}
		frame, _ := uds.AppendRawFrame(nil, protocol.TypeRequestHeaders, payload)
		if _, err := nc.Write(frame); err != nil {
			t.Fatal(err)
		}
		d, f, typ, ok := nextProtobufDecision(t, fr)
		if !ok || d.RequestID != id {
			msg, _ := f.AgentError()
			t.Errorf("unknown envelope field %s the event: reply %s payload %d (agent error %q), want a Decision for %d", order, typ, f.Payload, msg, id)
			continue
		}
		if len(d.RequestHeaderOps) != 1 || string(d.RequestHeaderOps[0].Value) != "/"+order {
			t.Errorf("unknown envelope field %s the event: decision %+v", order, d)
		}
	}
}

// serveProtobuf serves one connection with echoHandler and opts, and
// returns the proxy's end of it and its frame reader, after a handshake
// that agreed on protobuf payloads. The connection is served until the
// test ends.
func serveProtobuf(t *testing.T, opts *sdk.Options) (net.Conn, *uds.FrameReader) {
	t.Helper()
	path := tempSocket(t)
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	t.Cleanup(func() { cancel(); <-served })
	go func() {
		defer close(served)
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		_ = sdk.ServeConn(ctx, nc, echoHandler{sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true}}}, opts)
	}()
	nc, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(hangGuard))
	req := handshake.NewRequestWith("newer-proxy", protocol.FeatureProtobufPayloads)
	if err := uds.WriteFrame(nc, &req); err != nil {
		t.Fatal(err)
	}
	fr := uds.NewFrameReader(nc)
	_, p, err := fr.Next()
	if err != nil {
		t.Fatal(err)
	}
	var resp protocol.HandshakeResponse
	if err := protocol.DecodeHandshakeResponse(p, &resp); err != nil || !resp.Capabilities.SupportsProtobufPayloads {
		t.Fatalf("handshake: %+v %v", resp, err)
	}
	return nc, fr
}
