package pbwire_test

import (
	"errors"
	"runtime"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/protocol"
)

// TestHostileDecisionStaysSmall: a Decision of the frame size limit made
// of empty header operations (2 bytes each on the wire, 56 decoded) is
// refused at protocol.MaxListEntries, having allocated a few MB instead of
// the ~0.5 GB the whole list would take.
func TestHostileDecisionStaysSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 16 MiB message")
	}
	body := []byte{0x0a, 0x00} // allow {}
	for len(body) < protocol.MaxFrameSize-64 {
		body = append(body, 0x2a, 0x00) // request_header_ops {}
	}
	msg := protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 7)
	msg = protowire.AppendBytes(protowire.AppendTag(msg, 6, protowire.BytesType), body)

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var f pbwire.Frame
	f.Parse(msg)
	var d protocol.Decision
	err := f.DecodeDecision(&d)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, protocol.ErrProtocolField) {
		t.Fatalf("decoded %d operations (%v), want a field error at %d", len(d.RequestHeaderOps), err, protocol.MaxListEntries)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
		t.Fatalf("decoding allocated %d MB", grew>>20)
	}
}
