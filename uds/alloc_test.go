package uds

import (
	"bytes"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
)

// loopReader replays one byte stream forever, so FrameReader.Next can be
// measured in steady state.
type loopReader struct {
	data []byte
	off  int
}

func (l *loopReader) Read(p []byte) (int, error) {
	if l.off == len(l.data) {
		l.off = 0
	}
	n := copy(p, l.data[l.off:])
	l.off += n
	return n, nil
}

func hotMessages() []struct {
	t   protocol.MsgType
	msg protocol.Message
} {
	rh := &protocol.RequestHeaders{RequestID: 42, Method: []byte("POST"), URI: []byte("/api/users?id=7"), HasBody: true}
	for _, h := range [][2]string{{"host", "example.com"}, {"accept", "*/*"}, {"accept", "text/html"}, {"user-agent", "curl/8"}, {"content-type", "application/json"}} {
		rh.Headers = rh.Headers.Add([]byte(h[0]), []byte(h[1]))
	}
	rh.Metadata = protocol.Metadata{CorrelationID: []byte("b9e2"), ClientIP: []byte("10.0.0.9"), ClientPort: 51234, Protocol: []byte("HTTP/1.1"), RouteID: []byte("default")}
	chunk := &protocol.BodyChunk{RequestID: 42, ChunkIndex: 3, Data: bytes.Repeat([]byte("a"), 4096), TotalSize: -1, Progress: -1}
	dec := &protocol.Decision{RequestID: 42, Kind: protocol.DecisionBlock, Status: 403, Body: []byte("denied"),
		RequestHeaderOps: []protocol.HeaderOp{{Op: protocol.HeaderSet, Name: []byte("x-user"), Value: []byte("42")}}}
	mut := &protocol.BodyMutation{RequestID: 42, ChunkIndex: 3, Action: protocol.MutationReplace, Data: []byte("redacted")}
	return []struct {
		t   protocol.MsgType
		msg protocol.Message
	}{
		{protocol.TypeRequestHeaders, rh},
		{protocol.TypeRequestBodyChunk, chunk.As(protocol.PhaseRequest)},
		{protocol.TypeDecision, dec},
		{protocol.TypeBodyMutation, mut},
	}
}

func TestAllocsFrameEncode(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, hm := range hotMessages() {
		buf := make([]byte, 0, 64<<10)
		allocs := testing.AllocsPerRun(200, func() {
			var err error
			buf, err = AppendFrame(buf[:0], hm.msg)
			if err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("AppendFrame(%s): %.1f allocs per frame, want 0", hm.t, allocs)
		}
	}
}

// deadlineReader is a loopReader that accepts read deadlines (counting
// them) and, with max > 0, hands out at most max bytes per Read, so that
// frames straddle reads and the frame timeout is armed on the way.
type deadlineReader struct {
	loopReader
	max       int
	deadlines int
}

func (d *deadlineReader) Read(p []byte) (int, error) {
	if d.max > 0 && len(p) > d.max {
		p = p[:d.max]
	}
	return d.loopReader.Read(p)
}

func (d *deadlineReader) SetReadDeadline(time.Time) error {
	d.deadlines++
	return nil
}

func TestAllocsFrameReadDecode(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	var stream []byte
	for _, hm := range hotMessages() {
		stream, _ = AppendFrame(stream, hm.msg)
	}
	t.Run("no frame timeout", func(t *testing.T) {
		allocsReadDecode(t, NewFrameReader(&loopReader{data: stream}))
	})
	t.Run("frame timeout, whole frames buffered", func(t *testing.T) {
		dr := &deadlineReader{loopReader: loopReader{data: stream}}
		fr := NewFrameReader(dr)
		fr.SetFrameTimeout(time.Second)
		allocsReadDecode(t, fr)
		if dr.deadlines != 0 {
			t.Fatalf("%d read deadlines set although every frame arrived whole", dr.deadlines)
		}
	})
	t.Run("frame timeout, frames straddling reads", func(t *testing.T) {
		dr := &deadlineReader{loopReader: loopReader{data: stream}, max: 1000}
		fr := NewFrameReader(dr)
		fr.SetFrameTimeout(time.Second)
		allocsReadDecode(t, fr)
		if dr.deadlines == 0 {
			t.Fatal("the frame timeout was never armed")
		}
	})
}

func allocsReadDecode(t *testing.T, fr *FrameReader) {
	var (
		rh  protocol.RequestHeaders
		bc  protocol.BodyChunk
		dec protocol.Decision
		mut protocol.BodyMutation
	)
	step := func() {
		typ, p, err := fr.Next()
		if err != nil {
			t.Fatal(err)
		}
		switch typ {
		case protocol.TypeRequestHeaders:
			err = rh.Decode(p)
		case protocol.TypeRequestBodyChunk:
			err = bc.Decode(p)
		case protocol.TypeDecision:
			err = dec.Decode(p)
		case protocol.TypeBodyMutation:
			err = mut.Decode(p)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 8; i++ {
		step() // warm the reused buffers
	}
	if allocs := testing.AllocsPerRun(400, step); allocs != 0 {
		t.Errorf("read+decode: %.2f allocs per frame, want 0", allocs)
	}
}
