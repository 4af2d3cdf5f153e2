package pbwire_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/zentinelproxy/sidecar/grpcagent/pb"
	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/protocol"
)

func payloadOf(t protocol.MsgType) pbwire.Payload {
	return map[protocol.MsgType]pbwire.Payload{
		protocol.TypeRequestHeaders: pbwire.PayloadRequestHeaders, protocol.TypeRequestBodyChunk: pbwire.PayloadRequestBodyChunk,
		protocol.TypeResponseHeaders: pbwire.PayloadResponseHeaders, protocol.TypeResponseBodyChunk: pbwire.PayloadResponseBodyChunk,
		protocol.TypeDecision: pbwire.PayloadDecision, protocol.TypeBodyMutation: pbwire.PayloadBodyMutation,
		protocol.TypeCancelRequest: pbwire.PayloadCancel, protocol.TypeCancelAll: pbwire.PayloadCancelAll,
		protocol.TypePing: pbwire.PayloadPing, protocol.TypePong: pbwire.PayloadPong,
	}[t]
}

// checkWire holds the hand codec to the generated one for msg, both ways.
func checkWire(t *testing.T, name string, mt protocol.MsgType, msg any) {
	t.Helper()
	want := toPB(mt, msg)
	// Hand encoder → generated decoder.
	wire, err := pbwire.AppendMessage(nil, asMessage(mt, msg))
	if err != nil {
		t.Fatalf("%s: encode: %v", name, err)
	}
	w, _ := pbwire.Resolve(asMessage(mt, msg))
	if w.Size() != len(wire) {
		t.Fatalf("%s: size %d, encoded %d bytes", name, w.Size(), len(wire))
	}
	var got pb.AgentMessage
	if err := proto.Unmarshal(wire, &got); err != nil {
		t.Fatalf("%s: generated decoder refused hand-encoded bytes: %v", name, err)
	}
	if !proto.Equal(&got, want) {
		t.Fatalf("%s: hand encoding decodes to\n%v\nwant\n%v", name, &got, want)
	}
	// Generated encoder → hand decoder.
	gwire, err := proto.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	var f pbwire.Frame
	f.Parse(gwire)
	if f.Payload != payloadOf(mt) {
		t.Fatalf("%s: payload %d, want %d", name, f.Payload, payloadOf(mt))
	}
	dec, err := decodeFrame(mt, gwire)
	if err != nil {
		t.Fatalf("%s: hand decoder: %v", name, err)
	}
	// The reference: the generated decoder plus the …FromPB conversions.
	ref, err := fromPB(mt, want)
	if err != nil {
		t.Fatal(err)
	}
	if g, w := canon(dec), canon(ref); g != w {
		t.Fatalf("%s: hand decoding\n got %s\nwant %s", name, g, w)
	}
}

// TestWireMatchesGenerated: the hand codec and the generated code agree on
// every message of the suite, both ways.
func TestWireMatchesGenerated(t *testing.T) {
	for _, c := range protocolMessages() {
		checkWire(t, c.name, c.t, c.msg)
	}
}

func randBytes(r *rand.Rand, max int) []byte {
	n := r.IntN(max + 1)
	if n == 0 && r.IntN(2) == 0 {
		return nil
	}
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.UintN(256))
	}
	return b
}

func randHeaders(r *rand.Rand) protocol.Headers {
	var h protocol.Headers
	for i := r.IntN(5); i > 0; i-- {
		h = h.Add(randBytes(r, 8), randBytes(r, 12))
	}
	return h
}

func randOps(r *rand.Rand) []protocol.HeaderOp {
	var ops []protocol.HeaderOp
	for i := r.IntN(4); i > 0; i-- {
		op := protocol.HeaderOp{Op: protocol.HeaderOpKind(r.IntN(3)), Name: append([]byte("x-"), randBytes(r, 5)...), Value: randBytes(r, 6)}
		if op.Op == protocol.HeaderRemove {
			op.Value = nil
		}
		ops = append(ops, op)
	}
	return ops
}

func randSize(r *rand.Rand) int64 {
	if r.IntN(3) == 0 {
		return -1
	}
	return int64(r.IntN(1 << 20))
}

// randTimeout is an event's timeout_ms: often unknown (0), else any u32.
func randTimeout(r *rand.Rand) uint32 {
	if r.IntN(3) == 0 {
		return 0
	}
	return r.Uint32()
}

func randList(r *rand.Rand) [][]byte {
	var l [][]byte
	for i := r.IntN(3); i > 0; i-- {
		l = append(l, bytes.Clone(randBytes(r, 6)))
	}
	return l
}

func randMutation(r *rand.Rand, id uint64) protocol.BodyMutation {
	m := protocol.BodyMutation{RequestID: id, Phase: protocol.Phase(r.IntN(2)), ChunkIndex: r.Uint32(), Action: protocol.MutationAction(r.IntN(3))}
	if m.Action == protocol.MutationReplace {
		m.Data = append([]byte{1}, randBytes(r, 10)...)
	}
	return m
}

// randMessage builds a random message in decoder-normal form.
func randMessage(r *rand.Rand) (protocol.MsgType, any) {
	id := r.Uint64()
	switch r.IntN(8) {
	case 0:
		m := &protocol.RequestHeaders{RequestID: id, TimeoutMs: randTimeout(r), Method: randBytes(r, 7), URI: randBytes(r, 40), HasBody: r.IntN(2) == 0, Headers: randHeaders(r)}
		m.Metadata = protocol.Metadata{CorrelationID: randBytes(r, 8), ClientIP: randBytes(r, 8), ClientPort: r.IntN(65536),
			Protocol: randBytes(r, 8), ServerName: randBytes(r, 8), RouteID: randBytes(r, 8), UpstreamID: randBytes(r, 8),
			Traceparent: randBytes(r, 8), Timestamp: randBytes(r, 8)}
		if r.IntN(2) == 0 {
			m.Metadata.TLSVersion, m.Metadata.TLSCipher, m.Metadata.TLSServerName = randBytes(r, 6), randBytes(r, 20), randBytes(r, 8)
			m.Metadata.TLSClientSubject, m.Metadata.TLSClientSAN = randBytes(r, 30), randBytes(r, 30)
		}
		if r.IntN(2) == 0 {
			m.Metadata.ServerIP, m.Metadata.ServerPort, m.Metadata.ListenerID = randBytes(r, 8), r.IntN(65536), randBytes(r, 8)
		}
		if r.IntN(2) == 0 {
			m.RequestTarget = randBytes(r, 40)
			m.Metadata.UpstreamHost, m.Metadata.ForwardedFor = randBytes(r, 8), randBytes(r, 20)
			m.Metadata.ForwardedProto, m.Metadata.ForwardedHost = randBytes(r, 5), randBytes(r, 8)
		}
		if r.IntN(2) == 0 {
			m.HasInlineBody = true
			m.InlineBody = protocol.BodyChunk{Data: randBytes(r, 300), IsLast: r.IntN(2) == 0, TotalSize: randSize(r), Progress: randSize(r)}
		}
		return protocol.TypeRequestHeaders, m
	case 1, 2:
		t := protocol.TypeRequestBodyChunk
		if r.IntN(2) == 0 {
			t = protocol.TypeResponseBodyChunk
		}
		return t, &protocol.BodyChunk{RequestID: id, TimeoutMs: randTimeout(r), ChunkIndex: r.Uint32(), Data: randBytes(r, 300), IsLast: r.IntN(2) == 0, TotalSize: randSize(r), Progress: randSize(r)}
	case 3:
		return protocol.TypeResponseHeaders, &protocol.ResponseHeaders{RequestID: id, TimeoutMs: randTimeout(r), StatusCode: r.IntN(600), Headers: randHeaders(r), HasBody: r.IntN(2) == 0}
	case 4, 5:
		d := &protocol.Decision{RequestID: id, Kind: protocol.DecisionKind(r.IntN(4)), RequestHeaderOps: randOps(r), ResponseHeaderOps: randOps(r)}
		switch d.Kind {
		case protocol.DecisionBlock:
			d.Status, d.Body, d.BlockHeaders = 100+r.IntN(500), randBytes(r, 20), randHeaders(r)
		case protocol.DecisionRedirect:
			d.Status, d.RedirectURL = []int{301, 302, 303, 307, 308}[r.IntN(5)], append([]byte("/"), randBytes(r, 20)...)
		case protocol.DecisionNeedsMore:
			d.NeedsMore = true
		default:
			d.NeedsMore = r.IntN(3) == 0
		}
		if r.IntN(3) == 0 {
			d.HasRequestBodyMutation, d.RequestBodyMutation = true, randMutation(r, id)
			d.RequestBodyMutation.Phase = protocol.PhaseRequest
		}
		if r.IntN(3) == 0 {
			d.HasResponseBodyMutation, d.ResponseBodyMutation = true, randMutation(r, id)
			d.ResponseBodyMutation.Phase = protocol.PhaseResponse
		}
		if r.IntN(2) == 0 {
			d.Audit = protocol.Audit{Tags: randList(r), RuleIDs: randList(r), ReasonCodes: randList(r), HasConf: r.IntN(2) == 0}
			if d.Audit.HasConf {
				d.Audit.Confidence = r.Float64()
			}
			if r.IntN(2) == 0 {
				d.Audit.Custom = []byte(`{"n":1}`)
			}
		}
		switch r.IntN(3) {
		case 0:
			d.Cache.NoStore = true
		case 1:
			d.Cache.TTLMs = r.Uint32()
		}
		return protocol.TypeDecision, d
	case 6:
		m := randMutation(r, id)
		return protocol.TypeBodyMutation, &m
	default:
		return protocol.TypeCancelRequest, &protocol.CancelRequest{RequestID: id, Reason: []byte("reason-" + strings.Repeat("x", r.IntN(5)))}
	}
}

// TestWireRandom: the hand codec and the generated one agree on random
// messages.
func TestWireRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 3000; i++ {
		mt, msg := randMessage(r)
		checkWire(t, mt.String(), mt, msg)
	}
}

// FuzzFrame: arbitrary bytes never panic the hand decoder, and whatever
// the generated decoder and conversions accept, it decodes the same way,
// before and after protocol.Decision.Normalize.
func FuzzFrame(f *testing.F) {
	for _, c := range protocolMessages() {
		wire, _ := pbwire.AppendMessage(nil, asMessage(c.t, c.msg))
		f.Add(wire)
	}
	f.Add([]byte{0x08, 42, 0x32, 100, 1, 2})
	f.Add([]byte{0x32, 0x02, 0x2a, 0x00})
	f.Fuzz(func(t *testing.T, wire []byte) {
		var fr pbwire.Frame
		fr.Parse(wire)
		var ref pb.AgentMessage
		if proto.Unmarshal(wire, &ref) != nil || fr.Err != nil {
			return
		}
		types := map[pbwire.Payload]protocol.MsgType{
			pbwire.PayloadRequestHeaders: protocol.TypeRequestHeaders, pbwire.PayloadRequestBodyChunk: protocol.TypeRequestBodyChunk,
			pbwire.PayloadResponseHeaders: protocol.TypeResponseHeaders, pbwire.PayloadResponseBodyChunk: protocol.TypeResponseBodyChunk,
			pbwire.PayloadDecision: protocol.TypeDecision, pbwire.PayloadBodyMutation: protocol.TypeBodyMutation,
			pbwire.PayloadPing: protocol.TypePing, pbwire.PayloadPong: protocol.TypePong,
		}
		mt, ok := types[fr.Payload]
		if !ok || duplicateFields(wire) {
			return // protobuf merges repeated occurrences; the hand decoder need not
		}
		want, werr := fromPB(mt, &ref)
		got, gerr := decodeFrame(mt, wire)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("generated err %v, hand err %v", werr, gerr)
		}
		if werr == nil && canon(got) != canon(want) {
			t.Fatalf("hand %s\ngenerated %s", canon(got), canon(want))
		}
		// What decodes also survives Normalize, alike both ways.
		if gd, ok := got.(*protocol.Decision); ok && gerr == nil {
			wd := want.(*protocol.Decision)
			gn, wn := gd.Normalize(), wd.Normalize()
			if (gn == nil) != (wn == nil) || canon(gd) != canon(wd) {
				t.Fatalf("normalized: hand %v %s\ngenerated %v %s", gn, canon(gd), wn, canon(wd))
			}
			if gn != nil && !errors.Is(gn, protocol.ErrProtocolDecision) && !errors.Is(gn, protocol.ErrProtocolField) {
				t.Fatalf("Normalize error %v wraps no sentinel", gn)
			}
		}
	})
}

// duplicateFields reports whether a non-repeated payload field appears
// twice at the top level (protobuf merges such messages).
func duplicateFields(b []byte) bool {
	seen := map[int]bool{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return false
		}
		b = b[n:]
		if num >= 2 && num <= 12 {
			if seen[int(num)] || len(seen) > 0 {
				return true
			}
			seen[int(num)] = true
		}
	}
	return false
}

func TestAgentErrorWire(t *testing.T) {
	for _, reason := range []string{"handler error", "", "bad \xff utf-8", strings.Repeat("r", 5000)} {
		wire := pbwire.AppendAgentError(nil, 77, reason)
		var m pb.AgentMessage
		if err := proto.Unmarshal(wire, &m); err != nil {
			t.Fatalf("%q: %v", reason, err)
		}
		if m.RequestId != 77 || m.GetAgentError() == nil || len(m.GetAgentError().Message) > 1024 {
			t.Fatalf("%q: %v", reason, &m)
		}
		var f pbwire.Frame
		f.Parse(wire)
		msg, err := f.AgentError()
		if f.Payload != pbwire.PayloadAgentError || err != nil || msg != m.GetAgentError().Message {
			t.Fatalf("%q: hand decoder %d %q %v", reason, f.Payload, msg, err)
		}
	}
}

// TestAllocsWire: the hand decoder reads any message of the suite without
// allocating, once the slices it reuses are sized.
func TestAllocsWire(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, c := range protocolMessages() {
		msg := asMessage(c.t, c.msg)
		wire, _ := pbwire.AppendMessage(nil, msg)
		var f pbwire.Frame
		var rh protocol.RequestHeaders
		var ch protocol.BodyChunk
		var rs protocol.ResponseHeaders
		var d protocol.Decision
		var m protocol.BodyMutation
		decode := func() {
			f.Parse(wire)
			switch f.Payload {
			case pbwire.PayloadRequestHeaders:
				_ = f.DecodeRequestHeaders(&rh)
			case pbwire.PayloadRequestBodyChunk, pbwire.PayloadResponseBodyChunk:
				_ = f.DecodeBodyChunk(&ch)
			case pbwire.PayloadResponseHeaders:
				_ = f.DecodeResponseHeaders(&rs)
			case pbwire.PayloadDecision:
				_ = f.DecodeDecision(&d)
			case pbwire.PayloadBodyMutation:
				_ = f.DecodeBodyMutation(&m)
			}
		}
		decode() // size the reused slices
		if allocs := testing.AllocsPerRun(100, decode); allocs > 0 {
			t.Errorf("decode %s: %.1f allocs, want 0", c.name, allocs)
		}
	}
}

var updateGolden = flag.Bool("update", false, "rewrite the golden wire files in testdata/grpcagent")

// TestWireGolden pins the bytes of every message kind, so that a change of
// the wire format (which agents in other languages depend on) is always
// deliberate: go test ./internal/pbwire -run Golden -update rewrites the files.
func TestWireGolden(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "grpcagent", "wire")
	for _, c := range protocolMessages() {
		wire, err := pbwire.AppendMessage(nil, asMessage(c.t, c.msg))
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "_")+".hex")
		got := hex.Dump(wire)
		if *updateGolden {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(name, []byte(got), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(name)
		if err != nil {
			t.Fatalf("%v (run with -update to create it)", err)
		}
		if got != string(want) {
			t.Errorf("%s: wire bytes changed\n got:\n%s\nwant:\n%s", c.name, got, want)
		}
	}
}
