package uds

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/zentinelproxy/sidecar/protocol"
)

// FuzzFrameReader feeds arbitrary byte streams, split at a fuzzed offset,
// to the frame reader and the decoder of each frame's type: nothing may
// panic, every error must be one of the documented kinds, and the same
// stream read whole or split must give the same frames.
func FuzzFrameReader(f *testing.F) {
	for _, frame := range loadGolden(f) {
		f.Add(frame, uint16(3))
	}
	f.Add([]byte{0, 0, 0, 0, 0x20}, uint16(0))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x20}, uint16(2))
	f.Add([]byte{0, 0, 0, 3, 0x20, '{', '}'}, uint16(6))
	f.Add([]byte("\x00\x00\x00\x05\x20nope"), uint16(1))
	f.Fuzz(func(t *testing.T, stream []byte, cut uint16) {
		c := int(cut) % (len(stream) + 1)
		whole := readAll(t, bytes.NewReader(stream))
		split := readAll(t, io.MultiReader(bytes.NewReader(stream[:c]), bytes.NewReader(stream[c:])))
		if len(whole) != len(split) {
			t.Fatalf("whole read %d frames, split read %d", len(whole), len(split))
		}
		for i := range whole {
			if !bytes.Equal(whole[i], split[i]) {
				t.Fatalf("frame %d differs when split at %d", i, c)
			}
		}
	})
}

func readAll(t *testing.T, r io.Reader) [][]byte {
	fr := NewFrameReaderSize(r, 4096)
	var frames [][]byte
	for {
		typ, p, err := fr.Next()
		if err != nil {
			if err != io.EOF && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, ErrUDSFrameEmpty) && !errors.Is(err, ErrUDSFrameTooLarge) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return frames
		}
		// Decoders must never panic on peer bytes.
		_, _ = decodeAny(typ, p)
		_, _ = protocol.PeekRequestID(p)
		frames = append(frames, append([]byte{byte(typ)}, p...))
	}
}
