package grpcwire

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

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/zentinelproxy/sidecar/grpcagent/pb"
	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/protocol"
)

// decodeFrame decodes wire bytes with the hand decoder into the protocol
// message a frame of type t carries.
func decodeFrame(t protocol.MsgType, wire []byte) (any, error) {
	var f Frame
	f.Parse(bytes.Clone(wire))
	if f.Err != nil {
		return nil, f.Err
	}
	var err error
	switch f.Payload {
	case PayloadRequestHeaders:
		var m protocol.RequestHeaders
		err = f.DecodeRequestHeaders(&m)
		return &m, err
	case PayloadRequestBodyChunk, PayloadResponseBodyChunk:
		var m protocol.BodyChunk
		err = f.DecodeBodyChunk(&m)
		return &m, err
	case PayloadResponseHeaders:
		var m protocol.ResponseHeaders
		err = f.DecodeResponseHeaders(&m)
		return &m, err
	case PayloadDecision:
		var m protocol.Decision
		err = f.DecodeDecision(&m)
		return &m, err
	case PayloadBodyMutation:
		var m protocol.BodyMutation
		err = f.DecodeBodyMutation(&m)
		return &m, err
	case PayloadCancel:
		var m protocol.CancelRequest
		err = f.DecodeCancel(&m)
		return &m, err
	case PayloadCancelAll:
		var m protocol.CancelAll
		err = f.DecodeCancelAll(&m)
		return &m, err
	case PayloadPing, PayloadPong:
		var m protocol.Ping
		err = f.DecodePing(&m)
		return &m, err
	}
	return nil, errors.New("no payload")
}

func payloadOf(t protocol.MsgType) Payload {
	return map[protocol.MsgType]Payload{
		protocol.TypeRequestHeaders: PayloadRequestHeaders, protocol.TypeRequestBodyChunk: PayloadRequestBodyChunk,
		protocol.TypeResponseHeaders: PayloadResponseHeaders, protocol.TypeResponseBodyChunk: PayloadResponseBodyChunk,
		protocol.TypeDecision: PayloadDecision, protocol.TypeBodyMutation: PayloadBodyMutation,
		protocol.TypeCancelRequest: PayloadCancel, protocol.TypeCancelAll: PayloadCancelAll,
		protocol.TypePing: PayloadPing, protocol.TypePong: PayloadPong,
	}[t]
}

// checkWire holds the hand codec to the generated one for msg, both ways.
func checkWire(t *testing.T, name string, mt protocol.MsgType, msg any) {
	t.Helper()
	want := toPB(mt, msg)
	// Hand encoder → generated decoder.
	wire, err := AppendMessage(nil, asMessage(mt, msg))
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
	var f Frame
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
		wire, _ := AppendMessage(nil, asMessage(c.t, c.msg))
		f.Add(wire)
	}
	f.Add([]byte{0x08, 42, 0x32, 100, 1, 2})
	f.Add([]byte{0x32, 0x02, 0x2a, 0x00})
	f.Fuzz(func(t *testing.T, wire []byte) {
		var fr Frame
		fr.Parse(wire)
		var ref pb.AgentMessage
		if proto.Unmarshal(wire, &ref) != nil || fr.Err != nil {
			return
		}
		types := map[Payload]protocol.MsgType{
			PayloadRequestHeaders: protocol.TypeRequestHeaders, PayloadRequestBodyChunk: protocol.TypeRequestBodyChunk,
			PayloadResponseHeaders: protocol.TypeResponseHeaders, PayloadResponseBodyChunk: protocol.TypeResponseBodyChunk,
			PayloadDecision: protocol.TypeDecision, PayloadBodyMutation: protocol.TypeBodyMutation,
			PayloadPing: protocol.TypePing, PayloadPong: protocol.TypePong,
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

func TestEncodeErrors(t *testing.T) {
	var o Outgoing
	big := &protocol.BodyChunk{RequestID: 1, Data: make([]byte, MaxMessageSize), TotalSize: -1, Progress: -1}
	err := o.Encode(big.As(protocol.PhaseRequest), 0)
	if !errors.Is(err, ErrGRPCMessageTooLarge) || !strings.Contains(err.Error(), "10485760") {
		t.Fatalf("oversized: %v", err)
	}
	if err := o.Encode(big.As(protocol.PhaseRequest), 1024); !errors.Is(err, ErrGRPCMessageTooLarge) {
		t.Fatalf("over a lower limit: %v", err)
	}
	if err := o.Encode(nil, 0); !errors.Is(err, ErrGRPCMessageType) {
		t.Fatalf("no message: %v", err)
	}
	if err := o.Encode(&protocol.HandshakeRequest{}, 0); !errors.Is(err, ErrGRPCMessageType) {
		t.Fatalf("handshake on the stream: %v", err)
	}
	if err := o.Encode(&protocol.CancelRequest{RequestID: 1, Reason: b("\xff")}, 0); !errors.Is(err, ErrGRPCMessageType) {
		t.Fatalf("invalid UTF-8 in a string field: %v", err)
	}
	if o.Len() != 0 {
		t.Fatal("a failed Encode left a message behind")
	}
	if err := o.Encode(&protocol.CancelRequest{RequestID: 1, Reason: b("timeout")}, 0); err != nil || o.Len() == 0 {
		t.Fatal(err)
	}
	o.Free()
	// A large message goes through gRPC's buffer pool and decodes.
	chunk := &protocol.BodyChunk{RequestID: 9, Data: bytes.Repeat([]byte("z"), 64<<10), TotalSize: -1, Progress: -1}
	if err := o.Encode(chunk.As(protocol.PhaseRequest), 0); err != nil {
		t.Fatal(err)
	}
	got, err := decodeFrame(protocol.TypeRequestBodyChunk, o.buf.ReadOnlyData())
	o.Free()
	if err != nil || canon(got) != canon(chunk) {
		t.Fatalf("large chunk: %v", err)
	}
}

func TestAgentErrorWire(t *testing.T) {
	for _, reason := range []string{"handler error", "", "bad \xff utf-8", strings.Repeat("r", 5000)} {
		wire := AppendAgentError(nil, 77, reason)
		var m pb.AgentMessage
		if err := proto.Unmarshal(wire, &m); err != nil {
			t.Fatalf("%q: %v", reason, err)
		}
		if m.RequestId != 77 || m.GetAgentError() == nil || len(m.GetAgentError().Message) > 1024 {
			t.Fatalf("%q: %v", reason, &m)
		}
		var f Frame
		f.Parse(wire)
		msg, err := f.AgentError()
		if f.Payload != PayloadAgentError || err != nil || msg != m.GetAgentError().Message {
			t.Fatalf("%q: hand decoder %d %q %v", reason, f.Payload, msg, err)
		}
	}
}

// TestCodecFrame: a malformed message yields its request id and an error
// instead of failing the stream; unknown payloads are recognized.
func TestCodecFrame(t *testing.T) {
	good, _ := proto.Marshal(&pb.AgentMessage{RequestId: 9, Payload: &pb.AgentMessage_Decision{Decision: &pb.AgentDecision{Decision: &pb.AgentDecision_Allow{Allow: &pb.Allow{}}}}})
	for _, c := range []struct {
		name    string
		wire    []byte
		id      uint64
		ok      bool
		payload Payload
	}{
		{"good", good, 9, true, PayloadDecision},
		{"truncated payload", []byte{0x08, 42, 0x32, 100, 1, 2}, 42, false, PayloadNone},
		{"bad tag", []byte{0x08, 7, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 7, false, PayloadNone},
		{"unknown payload field", []byte{0x08, 5, 0xaa, 0x01, 0x00}, 5, true, PayloadUnknown}, // field 21, empty message
		{"unknown scalar ignored", []byte{0x08, 5, 0xa8, 0x01, 0x01, 0x32, 0x02, 0x0a, 0x00}, 5, true, PayloadDecision},
		{"empty", nil, 0, true, PayloadNone},
	} {
		t.Run(c.name, func(t *testing.T) {
			var f Frame
			if err := Codec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(c.wire)}, &f); err != nil {
				t.Fatalf("codec failed the stream: %v", err)
			}
			if (f.Err == nil) != c.ok {
				t.Fatalf("Err = %v, want ok=%v", f.Err, c.ok)
			}
			if !c.ok && !errors.Is(f.Err, ErrGRPCMalformed) {
				t.Fatalf("Err = %v, want ErrGRPCMalformed", f.Err)
			}
			if f.RequestID != c.id || (c.ok && f.Payload != c.payload) {
				t.Fatalf("request id %d payload %d, want %d %d", f.RequestID, f.Payload, c.id, c.payload)
			}
		})
	}
	// A decision payload that is garbage inside fails to decode, with the id.
	var f Frame
	f.Parse([]byte{0x08, 3, 0x32, 0x02, 0xff, 0xff})
	var d protocol.Decision
	if err := f.DecodeDecision(&d); !errors.Is(err, ErrGRPCMalformed) || d.RequestID != 3 {
		t.Fatalf("garbage decision: %v id %d", err, d.RequestID)
	}
	// Plain protobuf messages still go through the standard codec.
	data, err := Codec().Marshal(&pb.HealthResponse{Status: pb.HealthResponse_SERVING})
	if err != nil {
		t.Fatal(err)
	}
	var h pb.HealthResponse
	if err := Codec().Unmarshal(data, &h); err != nil || h.Status != pb.HealthResponse_SERVING {
		t.Fatalf("standard path: %v %v", err, h.Status)
	}
}

func TestAllocsWire(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, c := range protocolMessages() {
		var o Outgoing
		msg := asMessage(c.t, c.msg)
		allocs := testing.AllocsPerRun(100, func() {
			if err := o.Encode(msg, 0); err != nil {
				t.Fatal(err)
			}
			o.Free()
		})
		// The output buffer and its mem.Buffer wrapper, no more.
		if allocs > 2 {
			t.Errorf("encode %s: %.1f allocs, want <= 2", c.name, allocs)
		}
		wire, _ := AppendMessage(nil, msg)
		var f Frame
		var rh protocol.RequestHeaders
		var ch protocol.BodyChunk
		var rs protocol.ResponseHeaders
		var d protocol.Decision
		var m protocol.BodyMutation
		decode := func() {
			f.Parse(wire)
			switch f.Payload {
			case PayloadRequestHeaders:
				_ = f.DecodeRequestHeaders(&rh)
			case PayloadRequestBodyChunk, PayloadResponseBodyChunk:
				_ = f.DecodeBodyChunk(&ch)
			case PayloadResponseHeaders:
				_ = f.DecodeResponseHeaders(&rs)
			case PayloadDecision:
				_ = f.DecodeDecision(&d)
			case PayloadBodyMutation:
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
// deliberate: go test ./grpcagent -run Golden -update rewrites the files.
func TestWireGolden(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "grpcagent", "wire")
	for _, c := range protocolMessages() {
		wire, err := AppendMessage(nil, asMessage(c.t, c.msg))
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
