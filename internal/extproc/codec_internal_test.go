package extproc

import (
	"bytes"
	"math/rand/v2"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/zentinelproxy/sidecar/internal/conformance"
	"github.com/zentinelproxy/sidecar/protocol"
)

// codecStream is a request's state as the link builds its messages, with
// the client's metadata and codec.
func codecStream(t testing.TB, cfg func(*Config)) (*reqStream, *codec) {
	t.Helper()
	c := DefaultConfig("codec", "127.0.0.1:1")
	if cfg != nil {
		cfg(&c)
	}
	md := metadataContext(c.Metadata)
	return &reqStream{l: &link{c: &Client{cfg: c, metadata: md}}, mode: c.Mode}, newCodec(md)
}

// wire is what the codec puts on the wire for m.
func wire(t testing.TB, cd *codec, m proto.Message) ([]byte, error) {
	t.Helper()
	d, err := cd.Marshal(m)
	if err != nil {
		return nil, err
	}
	defer d.Free()
	return d.Materialize(), nil
}

// checkAsProto: the codec's encoding of m is proto.Marshal's, byte for
// byte (deterministic: no map in m but the metadata, whose encoding the
// codec fixed once), and decodes to m.
func checkAsProto(t *testing.T, cd *codec, m *extprocsvc.ProcessingRequest) {
	t.Helper()
	got, err := wire(t, cd, m)
	if err != nil {
		t.Fatalf("codec: %v", err)
	}
	back := new(extprocsvc.ProcessingRequest)
	if err := proto.Unmarshal(got, back); err != nil {
		t.Fatalf("decoding the codec's bytes: %v", err)
	}
	if !proto.Equal(back, m) {
		t.Fatalf("decoded %v\nwant %v", back, m)
	}
	if len(m.GetMetadataContext().GetFilterMetadata()) > 0 {
		return // map order: equal as messages is what holds
	}
	want, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("codec % x\nproto % x", got, want)
	}
}

// TestCodecAsProto: every message the link builds is encoded as
// proto.Marshal encodes it: request and response headers (first and later
// messages, with or without a body, upper-case and odd names, empty
// values), body chunks of every mode, with and without metadata.
func TestCodecAsProto(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  func(*Config)
	}{
		{"default", nil},
		{"metadata", func(c *Config) {
			c.Metadata = map[string]map[string]string{"tenant": {"id": "t1", "zone": "eu"}, "app": {"tier": "gold"}}
		}},
		{"bodies", func(c *Config) {
			c.Mode.RequestBody = extprocfilter.ProcessingMode_STREAMED
			c.Mode.ResponseBody = extprocfilter.ProcessingMode_BUFFERED_PARTIAL
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, cd := codecStream(t, tc.cfg)
			rq := conformance.TypicalRequestHeaders()
			rq.Headers = rq.Headers.Add([]byte("X-Upper-Case"), []byte("v")).Add([]byte("x-empty"), nil).
				Add([]byte("x-ünïcode"), []byte("\xff\x00bytes")).Add([]byte("x-long"), bytes.Repeat([]byte("a"), 300))
			rq.HasBody = true
			checkAsProto(t, cd, st.requestHeaders(rq)) // the stream's first: protocol_config
			rs := &protocol.ResponseHeaders{StatusCode: 404, HasBody: false}
			rs.Headers = rs.Headers.Add([]byte("content-type"), []byte("text/plain"))
			checkAsProto(t, cd, st.responseHeaders(rs))
			for _, last := range []bool{false, true} {
				checkAsProto(t, cd, st.bodyRequest(protocol.PhaseRequest, []byte("chunk"), last))
				checkAsProto(t, cd, st.bodyRequest(protocol.PhaseResponse, nil, last))
			}
			// Above gRPC's pooling threshold: a pooled buffer.
			checkAsProto(t, cd, st.bodyRequest(protocol.PhaseResponse, bytes.Repeat([]byte("b"), 64<<10), true))
		})
	}
}

// TestCodecAsProtoRandom: headers of random names and values (any bytes)
// and random body flags encode as proto.Marshal encodes them; what the
// proto codec refuses (a name that is not UTF-8) the codec refuses too.
func TestCodecAsProtoRandom(t *testing.T) {
	st, cd := codecStream(t, nil)
	r := rand.New(rand.NewPCG(1, 2))
	bytesOf := func(n int) []byte {
		b := make([]byte, r.IntN(n))
		for i := range b {
			b[i] = byte(r.IntN(256))
			if r.IntN(4) > 0 {
				b[i] = 'a' + byte(r.IntN(26))
			}
		}
		return b
	}
	for range 2000 {
		pr := &extprocsvc.ProcessingRequest{MetadataContext: st.l.c.metadata}
		if r.IntN(2) == 0 {
			hm := &corev3.HeaderMap{}
			for range r.IntN(12) {
				hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: string(bytesOf(20)), Value: string(bytesOf(4)), RawValue: bytesOf(200)})
			}
			hh := &extprocsvc.HttpHeaders{Headers: hm, EndOfStream: r.IntN(2) == 0}
			if r.IntN(5) == 0 {
				hh.Headers = nil
			}
			if r.IntN(2) == 0 {
				pr.Request = &extprocsvc.ProcessingRequest_RequestHeaders{RequestHeaders: hh}
			} else {
				pr.Request = &extprocsvc.ProcessingRequest_ResponseHeaders{ResponseHeaders: hh}
			}
		} else {
			hb := &extprocsvc.HttpBody{Body: bytesOf(3000), EndOfStream: r.IntN(2) == 0,
				EndOfStreamWithoutMessage: r.IntN(4) == 0, GrpcMessageCompressed: r.IntN(4) == 0}
			if r.IntN(2) == 0 {
				pr.Request = &extprocsvc.ProcessingRequest_RequestBody{RequestBody: hb}
			} else {
				pr.Request = &extprocsvc.ProcessingRequest_ResponseBody{ResponseBody: hb}
			}
		}
		if r.IntN(3) == 0 {
			pr.ProtocolConfig = &extprocsvc.ProtocolConfiguration{
				RequestBodyMode:                         extprocfilter.ProcessingMode_BodySendMode(r.IntN(5) - 1),
				ResponseBodyMode:                        extprocfilter.ProcessingMode_BodySendMode(r.IntN(5)),
				SendBodyWithoutWaitingForHeaderResponse: r.IntN(2) == 0,
			}
		}
		if r.IntN(4) == 0 {
			pr.MetadataContext = nil
		}
		_, perr := proto.Marshal(pr)
		if perr != nil {
			if _, err := wire(t, cd, pr); err == nil {
				t.Fatalf("the proto codec refuses %v (%v), the codec does not", pr, perr)
			}
			continue
		}
		checkAsProto(t, cd, pr)
	}
}

// TestCodecFallback: messages the codec does not write itself (attributes,
// a metadata other than the client's, another message type) are the proto
// codec's.
func TestCodecFallback(t *testing.T) {
	st, cd := codecStream(t, func(c *Config) { c.RequestAttrs = []string{"request.path"} })
	rq := conformance.TypicalRequestHeaders()
	pr := st.requestHeaders(rq)
	if len(pr.Attributes) == 0 {
		t.Fatal("no attributes")
	}
	other := &extprocsvc.ProcessingRequest{
		Request:         &extprocsvc.ProcessingRequest_RequestBody{RequestBody: &extprocsvc.HttpBody{Body: []byte("x")}},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"a": {}}},
	}
	for _, m := range []proto.Message{pr, other, &extprocsvc.ProcessingResponse{}, &extprocsvc.ProcessingRequest{}} {
		got, err := wire(t, cd, m)
		if err != nil {
			t.Fatal(err)
		}
		back := m.ProtoReflect().New().Interface()
		if err := proto.Unmarshal(got, back); err != nil || !proto.Equal(back, m) {
			t.Fatalf("%T: decoded %v (%v), want %v", m, back, err, m)
		}
	}
}

// TestCodecUnmarshalAsProto: a response decodes as proto.Unmarshal
// decodes it, the bare CONTINUEs of each phase (decoded by the codec) and
// others (by the proto codec), and what the proto codec refuses is refused.
func TestCodecUnmarshalAsProto(t *testing.T) {
	_, cd := codecStream(t, nil)
	cases := [][]byte{
		{0x0a, 0x00}, {0x12, 0x00}, {0x1a, 0x00}, {0x22, 0x00}, // CONTINUE of each phase
		{0x2a, 0x00}, {0x32, 0x00}, {0x3a, 0x00}, // trailers, immediate response
		{0x0a, 0x01}, {0x0a}, {}, {0x08, 0x00}, {0x60, 0x01}, {0xff, 0x00}, // other or broken
	}
	for _, resp := range []*extprocsvc.ProcessingResponse{
		{Response: &extprocsvc.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocsvc.HeadersResponse{
			Response: &extprocsvc.CommonResponse{Status: extprocsvc.CommonResponse_CONTINUE_AND_REPLACE}}}},
		{Response: &extprocsvc.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocsvc.ImmediateResponse{Body: []byte("no")}}},
	} {
		b, err := proto.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		cases = append(cases, b)
	}
	for _, b := range cases {
		want := new(extprocsvc.ProcessingResponse)
		werr := proto.Unmarshal(b, want)
		got := new(extprocsvc.ProcessingResponse)
		got.DynamicMetadata = &structpb.Struct{} // decoding replaces what was there
		// The bytes as gRPC hands them over: one buffer, or split.
		for _, data := range []mem.BufferSlice{{mem.SliceBuffer(bytes.Clone(b))}, split(b)} {
			err := cd.Unmarshal(data, got)
			if (err != nil) != (werr != nil) {
				t.Fatalf("% x: codec %v, proto %v", b, err, werr)
			}
			if err == nil && !proto.Equal(got, want) {
				t.Fatalf("% x: codec %v, proto %v", b, got, want)
			}
		}
	}
	if got := cd.Name(); got != "" {
		t.Errorf("name %q: the content-type would change", got)
	}
}

// split is b as gRPC may hand it over: in one-byte buffers.
func split(b []byte) mem.BufferSlice {
	var out mem.BufferSlice
	for i := range b {
		out = append(out, mem.SliceBuffer(b[i:i+1]))
	}
	return out
}

// BenchmarkCodecRequestHeaders: encoding a typical request headers
// message, the codec against the proto codec.
func BenchmarkCodecRequestHeaders(b *testing.B) {
	st, cd := codecStream(b, nil)
	pr := st.requestHeaders(conformance.TypicalRequestHeaders())
	for _, c := range []struct {
		name string
		c    interface {
			Marshal(any) (mem.BufferSlice, error)
		}
	}{{"codec", cd}, {"proto", protoCodec}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				d, err := c.c.Marshal(pr)
				if err != nil {
					b.Fatal(err)
				}
				d.Free()
			}
		})
	}
}
