package uds

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/protocol"
)

// protobufGolden is where the protobuf-payload forms of the golden
// frames live (docs/protocol.md §2.7).
const protobufGolden = "../testdata/uds/protobuf"

// decodeProtobuf decodes a protobuf payload of frame type t into a fresh
// message, checking that the envelope's payload field is t's.
func decodeProtobuf(t protocol.MsgType, p []byte) (protocol.Message, error) {
	var f pbwire.Frame
	f.ParseAs(t, p)
	if f.Err != nil {
		return nil, f.Err
	}
	switch t {
	case protocol.TypeRequestHeaders:
		m := new(protocol.RequestHeaders)
		return m, f.DecodeRequestHeaders(m)
	case protocol.TypeRequestBodyChunk:
		m := new(protocol.BodyChunk)
		return m.As(protocol.PhaseRequest), f.DecodeBodyChunk(m)
	case protocol.TypeResponseBodyChunk:
		m := new(protocol.BodyChunk)
		return m.As(protocol.PhaseResponse), f.DecodeBodyChunk(m)
	case protocol.TypeResponseHeaders:
		m := new(protocol.ResponseHeaders)
		return m, f.DecodeResponseHeaders(m)
	case protocol.TypeDecision:
		m := new(protocol.Decision)
		return m, f.DecodeDecision(m)
	case protocol.TypeBodyMutation:
		m := new(protocol.BodyMutation)
		return m, f.DecodeBodyMutation(m)
	case protocol.TypeCancelRequest:
		m := new(protocol.CancelRequest)
		return m, f.DecodeCancel(m)
	case protocol.TypeCancelAll:
		m := new(protocol.CancelAll)
		return m, f.DecodeCancelAll(m)
	default:
		m := new(protocol.Ping)
		return m, f.DecodePing(m)
	}
}

// TestGoldenProtobufFrames keeps the protobuf form of every golden stream
// message in testdata/uds/protobuf (rewritten with -update): each file is
// what AppendFrameAs writes, has the same frame type as its JSON twin,
// decodes with the payload field of its type and re-encodes byte for byte.
func TestGoldenProtobufFrames(t *testing.T) {
	for name, g := range goldenMessages() {
		if strings.HasPrefix(name, "handshake_") {
			continue // handshakes are always JSON
		}
		t.Run(name, func(t *testing.T) {
			b, err := AppendFrameAs(nil, g.msg, Protobuf)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(protobufGolden, name)
			if *update {
				if err := os.MkdirAll(protobufGolden, 0o755); err != nil {
					t.Fatal(err)
				}
				out := hex.EncodeToString(b[:HeaderSize]) + "\n" + hexLines(b[HeaderSize:])
				if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (go test ./uds -run Golden -update)", err)
			}
			frame, err := hex.DecodeString(strings.Join(strings.Fields(string(raw)), ""))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(frame, b) {
				t.Fatalf("encoder and golden file differ\n got % x\nwant % x", b, frame)
			}
			fr := NewFrameReader(bytes.NewReader(frame))
			typ, payload, err := fr.Next()
			if err != nil || typ != g.t {
				t.Fatalf("frame type %s (%v), want %s", typ, err, g.t)
			}
			msg, err := decodeProtobuf(typ, payload)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			again, err := AppendFrameAs(nil, msg, Protobuf)
			if err != nil || !bytes.Equal(again, frame) {
				t.Fatalf("re-encoded frame differs (%v)\n got % x\nwant % x", err, again, frame)
			}
			if _, _, err := fr.Next(); err != io.EOF {
				t.Fatalf("trailing data after golden frame: %v", err)
			}
		})
	}
}

// TestProtobufFramesAreSmaller: the point of the encoding. Every golden
// message is smaller as protobuf than as JSON.
func TestProtobufFramesAreSmaller(t *testing.T) {
	for name, g := range goldenMessages() {
		if strings.HasPrefix(name, "handshake_") {
			continue
		}
		j, err := AppendFrame(nil, g.msg)
		if err != nil {
			t.Fatal(err)
		}
		p, err := AppendFrameAs(nil, g.msg, Protobuf)
		if err != nil {
			t.Fatal(err)
		}
		if len(p) >= len(j) {
			t.Errorf("%s: protobuf frame %d bytes, JSON %d", name, len(p), len(j))
		}
	}
}

// TestAppendFrameAsRefusesHandshakes: the handshake and registration
// frames have no protobuf form.
func TestAppendFrameAsRefusesHandshakes(t *testing.T) {
	for _, m := range []protocol.Message{&protocol.HandshakeRequest{ProtocolVersion: 2}, &protocol.RegistrationRequest{ProtocolVersion: 2}, nil} {
		b, err := AppendFrameAs([]byte("x"), m, Protobuf)
		if !errors.Is(err, ErrUDSUnknownMessage) || string(b) != "x" {
			t.Errorf("%T: %q, %v; want ErrUDSUnknownMessage and dst unchanged", m, b, err)
		}
	}
}
