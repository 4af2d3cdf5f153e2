package pbwire_test

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/protocol"
)

// Benchmarks of the hand decoder on messages of the suite (the wire bytes
// come from the generated encoder).

func benchFrameDecode(b *testing.B, name string, decode func(f *pbwire.Frame) error) {
	var wire []byte
	for _, c := range protocolMessages() {
		if c.name == name {
			var err error
			if wire, err = proto.Marshal(toPB(c.t, c.msg)); err != nil {
				b.Fatal(err)
			}
		}
	}
	if wire == nil {
		b.Fatalf("no message %q", name)
	}
	var f pbwire.Frame
	f.Parse(wire)
	if err := decode(&f); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(wire)))
	b.ReportAllocs()
	for b.Loop() {
		f.Parse(wire)
		if err := decode(&f); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFrameDecodeRequestHeaders(b *testing.B) {
	var m protocol.RequestHeaders
	benchFrameDecode(b, "request headers", func(f *pbwire.Frame) error { return f.DecodeRequestHeaders(&m) })
}

func BenchmarkFrameDecodeDecision(b *testing.B) {
	var m protocol.Decision
	benchFrameDecode(b, "decision allow full", func(f *pbwire.Frame) error { return f.DecodeDecision(&m) })
}

func BenchmarkFrameDecodeDecisionAllow(b *testing.B) {
	var m protocol.Decision
	benchFrameDecode(b, "decision allow", func(f *pbwire.Frame) error { return f.DecodeDecision(&m) })
}

func BenchmarkFrameDecodeBodyMutation(b *testing.B) {
	var m protocol.BodyMutation
	benchFrameDecode(b, "mutation replace", func(f *pbwire.Frame) error { return f.DecodeBodyMutation(&m) })
}
