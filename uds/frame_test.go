package uds

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/protocol"
)

// goldenFrames are whole frames in testdata/uds/*.hex: they must decode
// and re-encode byte for byte.
func loadGolden(t testing.TB) map[string][]byte {
	t.Helper()
	files, err := filepath.Glob("../testdata/uds/*.hex")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden frames: %v", err)
	}
	out := map[string][]byte{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b, err := hex.DecodeString(strings.Join(strings.Fields(string(raw)), ""))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[filepath.Base(f)] = b
	}
	return out
}

// decodeAny decodes a payload of type t into a fresh message of that type.
func decodeAny(t protocol.MsgType, p []byte) (protocol.Message, error) {
	switch t {
	case protocol.TypeRequestHeaders:
		m := new(protocol.RequestHeaders)
		return m, m.Decode(p)
	case protocol.TypeRequestBodyChunk:
		m := new(protocol.BodyChunk)
		return m.As(protocol.PhaseRequest), m.Decode(p)
	case protocol.TypeResponseBodyChunk:
		m := new(protocol.BodyChunk)
		return m.As(protocol.PhaseResponse), m.Decode(p)
	case protocol.TypeResponseHeaders:
		m := new(protocol.ResponseHeaders)
		return m, m.Decode(p)
	case protocol.TypeDecision:
		m := new(protocol.Decision)
		return m, m.Decode(p)
	case protocol.TypeBodyMutation:
		m := new(protocol.BodyMutation)
		return m, m.Decode(p)
	case protocol.TypeCancelRequest:
		m := new(protocol.CancelRequest)
		return m, m.Decode(p)
	case protocol.TypeCancelAll:
		m := new(protocol.CancelAll)
		return m, m.Decode(p)
	case protocol.TypePing:
		m := new(protocol.Ping)
		return m, m.Decode(p)
	case protocol.TypePong:
		m := new(protocol.Ping)
		return (*protocol.Pong)(m), m.Decode(p)
	case protocol.TypeHandshakeRequest:
		m := new(protocol.HandshakeRequest)
		return m, protocol.DecodeHandshakeRequest(p, m)
	case protocol.TypeHandshakeResponse:
		m := new(protocol.HandshakeResponse)
		return m, protocol.DecodeHandshakeResponse(p, m)
	case protocol.TypeRegistrationRequest:
		m := new(protocol.RegistrationRequest)
		return m, protocol.DecodeRegistrationRequest(p, m)
	case protocol.TypeRegistrationResponse:
		m := new(protocol.RegistrationResponse)
		return m, protocol.DecodeRegistrationResponse(p, m)
	}
	return nil, errors.New("no decoder")
}

func TestGoldenFramesRoundTrip(t *testing.T) {
	for name, frame := range loadGolden(t) {
		if strings.Contains(name, ".decodeonly.") {
			// Liberal input forms (e.g. the seed's pair-list headers): they
			// must decode, but the proxy re-encodes them canonically.
			continue
		}
		t.Run(name, func(t *testing.T) {
			fr := NewFrameReader(bytes.NewReader(frame))
			typ, payload, err := fr.Next()
			if err != nil {
				t.Fatal(err)
			}
			msg, err := decodeAny(typ, payload)
			if err != nil {
				t.Fatalf("decode %s: %v", typ, err)
			}
			got, err := AppendFrame(nil, msg)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, frame) {
				t.Fatalf("re-encoded frame differs\n got %q\nwant %q", got, frame)
			}
			if _, _, err := fr.Next(); err != io.EOF {
				t.Fatalf("trailing data after golden frame: %v", err)
			}
		})
	}
}

// The seed's example frame: 00 00 00 4A 10 {"request_id":1,"method":"GET","uri":"/api/users"...}
func TestSeedExampleFrame(t *testing.T) {
	frame := loadGolden(t)["seed_example.decodeonly.hex"]
	if frame == nil {
		t.Fatal("seed_example.decodeonly.hex missing")
	}
	if !bytes.HasPrefix(frame, []byte{0, 0, 0, 0x4A, 0x10}) {
		t.Fatalf("header % x, want 00 00 00 4a 10", frame[:5])
	}
	if !bytes.HasPrefix(frame[5:], []byte(`{"request_id":1,"method":"GET","uri":"/api/users"`)) {
		t.Fatalf("payload %q", frame[5:])
	}
	var m protocol.RequestHeaders
	if err := m.Decode(frame[5:]); err != nil {
		t.Fatal(err)
	}
	if m.RequestID != 1 || string(m.Method) != "GET" || string(m.URI) != "/api/users" || string(m.Headers.Get("x")) != "ok" {
		t.Fatalf("decoded %+v", m)
	}
	// Re-encoded canonically, the length prefix still counts type + payload.
	out, err := AppendFrame(nil, &m)
	if err != nil {
		t.Fatal(err)
	}
	if n := binary.BigEndian.Uint32(out); int(n) != len(out)-4 || out[4] != 0x10 {
		t.Fatalf("re-encoded header % x for %d bytes", out[:5], len(out))
	}
}

func TestFrameReaderErrors(t *testing.T) {
	big := make([]byte, 5)
	binary.BigEndian.PutUint32(big, protocol.MaxFrameSize+1)
	big[4] = byte(protocol.TypeDecision)
	okFrame, _ := AppendRawFrame(nil, protocol.TypeDecision, []byte(`{"request_id":1,"decision":"allow"}`))
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty stream", nil, io.EOF},
		{"zero length", []byte{0, 0, 0, 0, 0x20}, ErrUDSFrameEmpty},
		{"oversized", big, ErrUDSFrameTooLarge},
		{"max uint32", []byte{0xff, 0xff, 0xff, 0xff, 0x20}, ErrUDSFrameTooLarge},
		{"truncated header", []byte{0, 0, 0}, io.ErrUnexpectedEOF},
		{"truncated payload", okFrame[:len(okFrame)-3], io.ErrUnexpectedEOF},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := NewFrameReader(bytes.NewReader(tc.in)).Next()
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

// oneByteReader returns at most one byte per Read, so every frame is split
// at every offset.
type oneByteReader struct{ r io.Reader }

func (o oneByteReader) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1]
	}
	return o.r.Read(p)
}

func TestFrameReaderSplitAtEveryOffset(t *testing.T) {
	var stream []byte
	var want [][]byte
	for i, p := range []string{`{"request_id":1,"decision":"allow"}`, `{"sequence":7}`, strings.Repeat("x", 70000)} {
		typ := []protocol.MsgType{protocol.TypeDecision, protocol.TypePing, protocol.TypeBodyMutation}[i]
		stream, _ = AppendRawFrame(stream, typ, []byte(p))
		want = append(want, []byte(p))
	}
	// Every split point of the whole stream into two writes.
	for cut := 0; cut <= len(stream); cut += 1 + cut/64 {
		r := io.MultiReader(bytes.NewReader(stream[:cut]), bytes.NewReader(stream[cut:]))
		fr := NewFrameReaderSize(r, 4096)
		for i, w := range want {
			_, p, err := fr.Next()
			if err != nil {
				t.Fatalf("cut %d frame %d: %v", cut, i, err)
			}
			if !bytes.Equal(p, w) {
				t.Fatalf("cut %d frame %d: payload differs", cut, i)
			}
		}
	}
	fr := NewFrameReaderSize(oneByteReader{bytes.NewReader(stream)}, 4096)
	for i, w := range want {
		_, p, err := fr.Next()
		if err != nil || !bytes.Equal(p, w) {
			t.Fatalf("one-byte reads, frame %d: %v", i, err)
		}
	}
}

func TestAppendFrameRejectsOversized(t *testing.T) {
	m := &protocol.BodyChunk{Data: make([]byte, protocol.MaxFrameSize), TotalSize: -1, Progress: -1}
	dst := []byte("keep")
	out, err := AppendFrame(dst, m.As(protocol.PhaseRequest))
	if !errors.Is(err, ErrUDSFrameTooLarge) {
		t.Fatalf("err = %v", err)
	}
	if string(out) != "keep" {
		t.Fatalf("dst not restored: %d bytes", len(out))
	}
	if _, err := AppendFrame(nil, nil); !errors.Is(err, ErrUDSUnknownMessage) {
		t.Fatalf("err = %v", err)
	}
}
