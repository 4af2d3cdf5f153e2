package protocol

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// codec binds one message type to its decoder and encoder so that tables
// and golden files can name messages by their file prefix.
type codec struct {
	prefix string
	fresh  func() any
	into   func(m any, payload []byte) error
	encode func(dst []byte, m any) []byte
}

// decode decodes payload into a fresh message.
func (c codec) decode(payload []byte) (any, error) {
	m := c.fresh()
	return m, c.into(m, payload)
}

// read is what a receiver does with payload: decode it and, for a
// Decision, Normalize it (the codec itself applies no schema rule).
func (c codec) read(payload []byte) (any, error) {
	m, err := c.decode(payload)
	if d, ok := m.(*Decision); ok && err == nil {
		err = d.Normalize()
	}
	return m, err
}

var codecs = []codec{
	{"request_headers", func() any { return new(RequestHeaders) },
		func(m any, p []byte) error { return m.(*RequestHeaders).Decode(p) },
		func(d []byte, m any) []byte { return AppendRequestHeaders(d, m.(*RequestHeaders)) }},
	{"request_body_chunk", func() any { return new(BodyChunk) },
		func(m any, p []byte) error { return m.(*BodyChunk).Decode(p) },
		func(d []byte, m any) []byte { return AppendBodyChunk(d, m.(*BodyChunk), TypeRequestBodyChunk) }},
	{"response_headers", func() any { return new(ResponseHeaders) },
		func(m any, p []byte) error { return m.(*ResponseHeaders).Decode(p) },
		func(d []byte, m any) []byte { return AppendResponseHeaders(d, m.(*ResponseHeaders)) }},
	{"response_body_chunk", func() any { return new(BodyChunk) },
		func(m any, p []byte) error { return m.(*BodyChunk).Decode(p) },
		func(d []byte, m any) []byte { return AppendBodyChunk(d, m.(*BodyChunk), TypeResponseBodyChunk) }},
	{"decision", func() any { return new(Decision) },
		func(m any, p []byte) error { return m.(*Decision).Decode(p) },
		func(d []byte, m any) []byte { return AppendDecision(d, m.(*Decision)) }},
	{"body_mutation", func() any { return new(BodyMutation) },
		func(m any, p []byte) error { return m.(*BodyMutation).Decode(p) },
		func(d []byte, m any) []byte { return AppendBodyMutation(d, m.(*BodyMutation)) }},
	{"cancel_request", func() any { return new(CancelRequest) },
		func(m any, p []byte) error { return m.(*CancelRequest).Decode(p) },
		func(d []byte, m any) []byte { return AppendCancelRequest(d, m.(*CancelRequest)) }},
	{"cancel_all", func() any { return new(CancelAll) },
		func(m any, p []byte) error { return m.(*CancelAll).Decode(p) },
		func(d []byte, m any) []byte { return AppendCancelAll(d, m.(*CancelAll)) }},
	{"ping", func() any { return new(Ping) },
		func(m any, p []byte) error { return m.(*Ping).Decode(p) },
		func(d []byte, m any) []byte { return AppendPing(d, m.(*Ping)) }},
	{"handshake_request", func() any { return new(HandshakeRequest) },
		func(m any, p []byte) error { return DecodeHandshakeRequest(p, m.(*HandshakeRequest)) },
		func(d []byte, m any) []byte { return AppendHandshakeRequest(d, m.(*HandshakeRequest)) }},
	{"handshake_response", func() any { return new(HandshakeResponse) },
		func(m any, p []byte) error { return DecodeHandshakeResponse(p, m.(*HandshakeResponse)) },
		func(d []byte, m any) []byte { return AppendHandshakeResponse(d, m.(*HandshakeResponse)) }},
	{"registration_request", func() any { return new(RegistrationRequest) },
		func(m any, p []byte) error { return DecodeRegistrationRequest(p, m.(*RegistrationRequest)) },
		func(d []byte, m any) []byte { return AppendRegistrationRequest(d, m.(*RegistrationRequest)) }},
	{"registration_response", func() any { return new(RegistrationResponse) },
		func(m any, p []byte) error { return DecodeRegistrationResponse(p, m.(*RegistrationResponse)) },
		func(d []byte, m any) []byte { return AppendRegistrationResponse(d, m.(*RegistrationResponse)) }},
}

// codecFor returns the codec whose prefix is the longest one name starts with.
func codecFor(t testing.TB, name string) codec {
	t.Helper()
	best := -1
	for i, c := range codecs {
		if strings.HasPrefix(name, c.prefix) && (best < 0 || len(c.prefix) > len(codecs[best].prefix)) {
			best = i
		}
	}
	if best < 0 {
		t.Fatalf("no codec for %q", name)
	}
	return codecs[best]
}

const goldenDir = "../testdata/protocol"

type golden struct {
	name    string
	payload []byte
}

var goldenCache []golden

// readGoldens returns the golden payloads (read once; callers must not
// modify them).
func readGoldens(t testing.TB) []golden {
	t.Helper()
	if goldenCache != nil {
		return goldenCache
	}
	paths, err := filepath.Glob(filepath.Join(goldenDir, "*.json"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no golden payloads in %s: %v", goldenDir, err)
	}
	var out []golden
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, golden{strings.TrimSuffix(filepath.Base(p), ".json"), b})
	}
	goldenCache = out
	return out
}

// show renders the exported fields of a message, []byte as quoted strings
// (nil and empty alike), so that messages compare by content.
func show(v any) string {
	var b strings.Builder
	showValue(&b, reflect.ValueOf(v))
	return b.String()
}

func showValue(b *strings.Builder, v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			b.WriteString("nil")
			return
		}
		showValue(b, v.Elem())
	case reflect.Struct:
		b.WriteString("{")
		t := v.Type()
		for i := 0; i < v.NumField(); i++ {
			if !t.Field(i).IsExported() {
				continue
			}
			fmt.Fprintf(b, "%s:", t.Field(i).Name)
			showValue(b, v.Field(i))
			b.WriteString(" ")
		}
		b.WriteString("}")
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			b.WriteString(strconv.Quote(string(v.Bytes())))
			return
		}
		b.WriteString("[")
		for i := 0; i < v.Len(); i++ {
			showValue(b, v.Index(i))
			b.WriteString(" ")
		}
		b.WriteString("]")
	case reflect.String:
		b.WriteString(strconv.Quote(v.String()))
	default:
		fmt.Fprint(b, v.Interface())
	}
}

func hdrs(kv ...string) Headers {
	var h Headers
	for i := 0; i+1 < len(kv); i += 2 {
		h = h.Add([]byte(kv[i]), []byte(kv[i+1]))
	}
	return h
}

func bs(s string) []byte { return []byte(s) }

func TestGoldenPayloadsRoundTripByteForByte(t *testing.T) {
	for _, g := range readGoldens(t) {
		t.Run(g.name, func(t *testing.T) {
			c := codecFor(t, g.name)
			in := bytes.Clone(g.payload)
			m, err := c.read(in) // canonical payloads are normalized already
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !bytes.Equal(in, g.payload) {
				t.Fatal("decode modified its input")
			}
			if out := c.encode(nil, m); !bytes.Equal(out, g.payload) {
				t.Fatalf("re-encoded payload differs\n got: %s\nwant: %s", out, g.payload)
			}
			if !json.Valid(g.payload) {
				t.Fatal("golden payload is not valid JSON")
			}
		})
	}
}

func TestGoldenSeedRequestHeaders(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(goldenDir, "request_headers_seed.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte(`{"request_id":1,"method":"GET","uri":"/api/users"`)) {
		t.Fatalf("seed example does not start like the seed's frame: %s", b)
	}
	var m RequestHeaders
	if err := m.Decode(b); err != nil {
		t.Fatal(err)
	}
	if m.RequestID != 1 || string(m.Method) != "GET" || string(m.URI) != "/api/users" ||
		string(m.Headers.Get("host")) != "example.com" {
		t.Fatalf("decoded %s", show(&m))
	}
}

// Every strict prefix of a valid payload is a truncated object: a syntax
// error, never a field error, never a panic.
func TestTruncatedPayloadsAreSyntaxErrors(t *testing.T) {
	for _, g := range readGoldens(t) {
		c := codecFor(t, g.name)
		for n := 0; n < len(g.payload); n++ {
			_, err := c.decode(bytes.Clone(g.payload[:n]))
			if !errors.Is(err, ErrProtocolSyntax) {
				t.Fatalf("%s[:%d] = %q: got %v, want ErrProtocolSyntax", g.name, n, g.payload[:n], err)
			}
		}
	}
}

// Single-byte corruptions of every golden payload must never panic, and
// whatever still decodes must re-encode to something that decodes.
func TestCorruptedPayloadsNeverPanic(t *testing.T) {
	subst := []byte{'"', '\\', '{', '}', '[', ']', ',', ':', '0', '9', '-', 'n', 't', 'e', '.', ' ', 0x00, 0x1f, 0x80, 0xff, 'A'}
	for _, g := range readGoldens(t) {
		c := codecFor(t, g.name)
		for i := range g.payload {
			for _, b := range subst {
				p := bytes.Clone(g.payload)
				p[i] = b
				m, err := c.read(p)
				if err != nil {
					if !errors.Is(err, ErrProtocolSyntax) && !errors.Is(err, ErrProtocolField) && !errors.Is(err, ErrProtocolDecision) {
						t.Fatalf("%s with [%d]=%q: error %v wraps no sentinel", g.name, i, b, err)
					}
					continue
				}
				out := c.encode(nil, m)
				if _, err := c.read(out); err != nil {
					t.Fatalf("%s with [%d]=%q: re-encoded %s does not decode: %v", g.name, i, b, out, err)
				}
			}
		}
	}
}

func TestRoundTripRequestHeaders(t *testing.T) {
	full := Metadata{
		CorrelationID: bs("b9e2c0de"), ClientIP: bs("2001:db8::1"), ClientPort: 65535,
		Protocol: bs("HTTP/2"), ServerName: bs("example.com"), RouteID: bs("r1"),
		UpstreamID: bs("u1"), Traceparent: bs("00-abc-def-01"), Timestamp: bs("2026-11-21T10:00:00Z"),
		TLSVersion: bs("TLS1.3"), TLSCipher: bs("TLS_AES_128_GCM_SHA256"), TLSServerName: bs("example.com"),
		TLSClientSubject: bs("CN=client,O=Example"), TLSClientSAN: bs("DNS:client.internal,URI:spiffe://example.org/c"),
		ServerIP: bs("10.0.0.2"), ServerPort: 1, ListenerID: bs("public"),
		UpstreamHost: bs("app.internal:9000"), ForwardedFor: bs("203.0.113.9, 192.0.2.7"),
		ForwardedProto: bs("https"), ForwardedHost: bs("example.com"), Path: bs("/api/v1"),
	}
	tests := []struct {
		name string
		in   RequestHeaders
		want RequestHeaders // zero: same as in
	}{
		{name: "minimal", in: RequestHeaders{RequestID: 0, Method: bs("GET"), URI: bs("/")}},
		{name: "full metadata", in: RequestHeaders{
			RequestID: math.MaxUint64, Method: bs("POST"), URI: bs("/a?b=c&d=%20"), HasBody: true,
			Headers: hdrs("host", "example.com", "accept", "*/*", "accept", "text/html"), Metadata: full}},
		{name: "partial metadata", in: RequestHeaders{Method: bs("GET"), URI: bs("/"),
			Metadata: Metadata{ClientIP: bs("10.0.0.1"), Timestamp: bs("t")}}},
		{name: "non-consecutive duplicates are grouped",
			in: RequestHeaders{Method: bs("GET"), URI: bs("/"),
				Headers: hdrs("a", "1", "b", "2", "a", "3", "c", "4", "b", "5")},
			want: RequestHeaders{Method: bs("GET"), URI: bs("/"),
				Headers: hdrs("a", "1", "a", "3", "b", "2", "b", "5", "c", "4")}},
		{name: "escapes and unicode",
			in: RequestHeaders{Method: bs("GET"), URI: bs("/\"q\"\\\n\r\t\b\f\x00\x1f\x7f/é/日本/😀"),
				Headers: hdrs("x-json", `{"k":"v"}`, "x-uni", "ü\u2028\u2029\ufffd", "x-empty", "")}},
		{name: "invalid UTF-8 becomes U+FFFD",
			in: RequestHeaders{Method: bs("GET"), URI: bs("/\xff"),
				Headers: hdrs("x-bad", "a\xffb\xc3", "x-trunc", "\xe6\x97", "x-surrogate", "\xed\xa0\x80")},
			want: RequestHeaders{Method: bs("GET"), URI: bs("/\ufffd"),
				Headers: hdrs("x-bad", "a\ufffdb\ufffd", "x-trunc", "\ufffd\ufffd", "x-surrogate", "\ufffd\ufffd\ufffd")}},
		{name: "timeout", in: RequestHeaders{RequestID: 9, TimeoutMs: 1000, Method: bs("GET"), URI: bs("/")}},
		{name: "largest timeout", in: RequestHeaders{RequestID: 9, TimeoutMs: math.MaxUint32, Method: bs("GET"), URI: bs("/"), HasBody: true,
			HasInlineBody: true, InlineBody: BodyChunk{Data: bs("x"), IsLast: true, TotalSize: 1, Progress: 1}}},
		{name: "port out of range omitted",
			in:   RequestHeaders{Method: bs("GET"), URI: bs("/"), Metadata: Metadata{ClientPort: 70000}},
			want: RequestHeaders{Method: bs("GET"), URI: bs("/")}},
		{name: "server port out of range omitted",
			in:   RequestHeaders{Method: bs("GET"), URI: bs("/"), Metadata: Metadata{ServerPort: 65536, ServerIP: bs("::1")}},
			want: RequestHeaders{Method: bs("GET"), URI: bs("/"), Metadata: Metadata{ServerIP: bs("::1")}}},
		{name: "client request: request_target and the client's framing headers",
			in: RequestHeaders{Method: bs("GET"), URI: bs("/"), RequestTarget: bs("http://localhost"),
				Headers:  hdrs("host", "localhost", "transfer-encoding", "chunked", "connection", "keep-alive,keep-alive", "content-length", "0"),
				Metadata: Metadata{Protocol: bs("HTTP/1.0"), UpstreamHost: bs("app:80"), ForwardedFor: bs("192.0.2.7")}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := tt.want
			if want.Method == nil {
				want = tt.in
			}
			payload := AppendRequestHeaders(nil, &tt.in)
			if !json.Valid(payload) {
				t.Fatalf("invalid JSON: %s", payload)
			}
			var got RequestHeaders
			if err := got.Decode(payload); err != nil {
				t.Fatalf("decode %s: %v", payload, err)
			}
			if show(&got) != show(&want) {
				t.Fatalf("round trip of %s\n got: %s\nwant: %s", payload, show(&got), show(&want))
			}
		})
	}
}

func TestRoundTripBodyChunk(t *testing.T) {
	large := make([]byte, 1<<20+1)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range large {
		large[i] = byte(r.Uint32())
	}
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	tests := []struct {
		name string
		t    MsgType
		in   BodyChunk
	}{
		{"empty", TypeRequestBodyChunk, BodyChunk{RequestID: 1, Data: bs(""), TotalSize: -1, Progress: -1}},
		{"one byte", TypeRequestBodyChunk, BodyChunk{RequestID: 1, Data: bs("a"), TotalSize: -1, Progress: -1}},
		{"two bytes", TypeRequestBodyChunk, BodyChunk{RequestID: 1, Data: bs("ab"), TotalSize: 0, Progress: 0}},
		{"three bytes", TypeResponseBodyChunk, BodyChunk{RequestID: 1, Data: bs("abc"), TotalSize: 3, Progress: 3, IsLast: true}},
		{"all byte values", TypeResponseBodyChunk, BodyChunk{RequestID: 7, ChunkIndex: math.MaxUint32, Data: all, TotalSize: math.MaxInt64, Progress: -1}},
		{"large", TypeRequestBodyChunk, BodyChunk{RequestID: 2, ChunkIndex: 3, Data: large, TotalSize: -1, Progress: 12345}},
		{"timeout", TypeRequestBodyChunk, BodyChunk{RequestID: 2, TimeoutMs: 850, ChunkIndex: 1, Data: bs("ab"), TotalSize: -1, Progress: -1}},
		{"response timeout", TypeResponseBodyChunk, BodyChunk{RequestID: 2, TimeoutMs: math.MaxUint32, Data: bs("ab"), IsLast: true, TotalSize: 2, Progress: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			payload := AppendBodyChunk(nil, &tt.in, tt.t)
			var ref struct {
				Data          []byte `json:"data"`
				BytesReceived *int64 `json:"bytes_received"`
				BytesSent     *int64 `json:"bytes_sent"`
			}
			if err := json.Unmarshal(payload, &ref); err != nil || !bytes.Equal(ref.Data, tt.in.Data) {
				t.Fatalf("encoding/json disagrees with the encoding (%v)", err)
			}
			if tt.in.Progress >= 0 && (tt.t == TypeRequestBodyChunk) != (ref.BytesReceived != nil) {
				t.Fatalf("wrong progress key in %s", payload)
			}
			var got BodyChunk
			if err := got.Decode(payload); err != nil {
				t.Fatalf("decode: %v", err)
			}
			if show(&got) != show(&tt.in) {
				t.Fatalf("round trip\n got: %.300s\nwant: %.300s", show(&got), show(&tt.in))
			}
		})
	}
}

func TestRoundTripResponseHeaders(t *testing.T) {
	tests := []ResponseHeaders{
		{RequestID: 1, StatusCode: 200, HasBody: true, Headers: hdrs("content-type", "text/html", "set-cookie", "a=1", "set-cookie", "b=2")},
		{RequestID: 2, StatusCode: 599},
		{RequestID: 3, StatusCode: -1, Headers: hdrs("x", "\x00")},
		{RequestID: 4, TimeoutMs: 1, StatusCode: 204},
	}
	for i, in := range tests {
		payload := AppendResponseHeaders(nil, &in)
		var got ResponseHeaders
		if err := got.Decode(payload); err != nil {
			t.Fatalf("%d: decode %s: %v", i, payload, err)
		}
		if show(&got) != show(&in) {
			t.Fatalf("%d: round trip\n got: %s\nwant: %s", i, show(&got), show(&in))
		}
	}
}

func TestRoundTripDecision(t *testing.T) {
	ops := []HeaderOp{
		{Op: HeaderSet, Name: bs("x-user"), Value: bs("42")},
		{Op: HeaderAdd, Name: bs("x-tag"), Value: bs("\"q\"")},
		{Op: HeaderRemove, Name: bs("cookie")},
		{Op: HeaderSet, Name: bs("x-empty"), Value: bs("")},
	}
	audit := Audit{
		Tags: [][]byte{bs("sqli"), bs("xss")}, RuleIDs: [][]byte{bs("942100")}, Confidence: 0.9, HasConf: true,
		ReasonCodes: [][]byte{bs("r\u00e9")}, Custom: bs(`{"a":[1,{"b":null}],"s":"\u00e9\n"}`),
	}
	tests := []struct {
		name string
		in   Decision
		want *Decision
	}{
		{name: "allow", in: Decision{RequestID: 1}},
		{name: "allow with ops and audit", in: Decision{RequestID: 1, RequestHeaderOps: ops, ResponseHeaderOps: ops[:1], Audit: audit}},
		{name: "allow needs more", in: Decision{RequestID: 1, NeedsMore: true}},
		{name: "needs more kind", in: Decision{RequestID: 1, Kind: DecisionNeedsMore, NeedsMore: true}},
		{name: "block", in: Decision{RequestID: 2, Kind: DecisionBlock, Status: 451, Body: bs("<h1>denied</h1>"),
			BlockHeaders: hdrs("x-reason", "policy", "content-type", "text/html")}},
		{name: "block default status", in: Decision{Kind: DecisionBlock},
			want: &Decision{Kind: DecisionBlock, Status: 403}},
		{name: "block duplicate headers: last wins", in: Decision{Kind: DecisionBlock, Status: 403,
			BlockHeaders: hdrs("a", "1", "b", "2", "a", "3")},
			want: &Decision{Kind: DecisionBlock, Status: 403, BlockHeaders: hdrs("a", "3", "b", "2")}},
		{name: "redirect", in: Decision{Kind: DecisionRedirect, Status: 307, RedirectURL: bs("https://x.example/?a=b&c=\"d\"")}},
		{name: "redirect default status", in: Decision{Kind: DecisionRedirect, RedirectURL: bs("/login")},
			want: &Decision{Kind: DecisionRedirect, Status: 302, RedirectURL: bs("/login")}},
		{name: "confidence zero and extremes", in: Decision{Audit: Audit{HasConf: true, Confidence: 0}}},
		{name: "confidence tiny", in: Decision{Audit: Audit{HasConf: true, Confidence: 5e-324}}},
		{name: "confidence huge", in: Decision{Audit: Audit{HasConf: true, Confidence: -math.MaxFloat64}}},
		{name: "NaN confidence omitted", in: Decision{Audit: Audit{HasConf: true, Confidence: math.NaN(), Tags: [][]byte{bs("t")}}},
			want: &Decision{Audit: Audit{Tags: [][]byte{bs("t")}}}},
		{name: "invalid custom omitted", in: Decision{Audit: Audit{Custom: bs(`{"a":`), Tags: [][]byte{bs("t")}}},
			want: &Decision{Audit: Audit{Tags: [][]byte{bs("t")}}}},
		{name: "embedded mutations", in: Decision{RequestID: 9,
			HasRequestBodyMutation: true, RequestBodyMutation: BodyMutation{RequestID: 9, ChunkIndex: 1, Action: MutationReplace, Data: bs("new")},
			HasResponseBodyMutation: true, ResponseBodyMutation: BodyMutation{RequestID: 9, Phase: PhaseResponse, Action: MutationDrop}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := tt.want
			if want == nil {
				want = &tt.in
			}
			payload := AppendDecision(nil, &tt.in)
			if !json.Valid(payload) {
				t.Fatalf("invalid JSON: %s", payload)
			}
			var got Decision
			if err := got.Decode(payload); err != nil {
				t.Fatalf("decode %s: %v", payload, err)
			}
			if show(&got) != show(want) {
				t.Fatalf("round trip of %s\n got: %s\nwant: %s", payload, show(&got), show(want))
			}
		})
	}
}

func TestDecisionBlockBodyNullVersusEmpty(t *testing.T) {
	for _, body := range [][]byte{nil, {}} {
		in := Decision{Kind: DecisionBlock, Status: 403, Body: body}
		payload := AppendDecision(nil, &in)
		var got Decision
		if err := got.Decode(payload); err != nil {
			t.Fatal(err)
		}
		if (got.Body == nil) != (body == nil) {
			t.Fatalf("%s: body nil=%v, want nil=%v", payload, got.Body == nil, body == nil)
		}
	}
}

func TestRoundTripBodyMutation(t *testing.T) {
	tests := []BodyMutation{
		{RequestID: 1, ChunkIndex: 3, Action: MutationReplace, Data: bs("redacted")},
		{RequestID: 1, Phase: PhaseResponse, Action: MutationDrop},
		{RequestID: math.MaxUint64, ChunkIndex: math.MaxUint32, Action: MutationPass},
		{RequestID: 2, Action: MutationReplace, Data: bytes.Repeat([]byte{0, 0xff}, 5000)},
	}
	for i, in := range tests {
		payload := AppendBodyMutation(nil, &in)
		var got BodyMutation
		if err := got.Decode(payload); err != nil {
			t.Fatalf("%d: decode %s: %v", i, payload, err)
		}
		if show(&got) != show(&in) {
			t.Fatalf("%d: round trip\n got: %s\nwant: %s", i, show(&got), show(&in))
		}
	}
}

func TestRoundTripSmallMessages(t *testing.T) {
	for _, in := range []CancelRequest{{RequestID: 1, Reason: bs("client_disconnect")}, {RequestID: 2}, {Reason: bs("\"é\"")}} {
		var got CancelRequest
		if err := got.Decode(AppendCancelRequest(nil, &in)); err != nil || show(&got) != show(&in) {
			t.Fatalf("CancelRequest: got %s, %v; want %s", show(&got), err, show(&in))
		}
	}
	for _, in := range []CancelAll{{Reason: bs("shutdown")}, {}} {
		var got CancelAll
		if err := got.Decode(AppendCancelAll(nil, &in)); err != nil || show(&got) != show(&in) {
			t.Fatalf("CancelAll: got %s, %v; want %s", show(&got), err, show(&in))
		}
	}
	for _, in := range []Ping{{}, {Sequence: math.MaxUint64, TimestampMs: math.MinInt64}, {Sequence: 7, TimestampMs: math.MaxInt64}} {
		var got Ping
		if err := got.Decode(AppendPing(nil, &in)); err != nil || got != in {
			t.Fatalf("Ping: got %+v, %v; want %+v", got, err, in)
		}
	}
}

func TestRoundTripHandshake(t *testing.T) {
	caps := Capabilities{HandlesRequestHeaders: true, HandlesResponseBody: true, SupportsCancellation: true, MaxConcurrentRequests: 4294967295}
	hreq := HandshakeRequest{ProtocolVersion: 2, ClientName: "sidecar <&> \"x\"", SupportedFeatures: []string{FeatureCancellation}}
	var hreq2 HandshakeRequest
	if err := DecodeHandshakeRequest(AppendHandshakeRequest(nil, &hreq), &hreq2); err != nil || !reflect.DeepEqual(hreq, hreq2) {
		t.Fatalf("HandshakeRequest: %+v %v", hreq2, err)
	}
	if got := AppendHandshakeRequest(nil, &HandshakeRequest{ProtocolVersion: 2}); !bytes.Contains(got, []byte(`"supported_features":[]`)) {
		t.Fatalf("nil features must be written as []: %s", got)
	}
	hres := HandshakeResponse{ProtocolVersion: 2, AgentName: "waf", Accepted: true, Capabilities: caps}
	var hres2 HandshakeResponse
	if err := DecodeHandshakeResponse(AppendHandshakeResponse(nil, &hres), &hres2); err != nil || hres != hres2 {
		t.Fatalf("HandshakeResponse: %+v %v", hres2, err)
	}
	rreq := RegistrationRequest{ProtocolVersion: 2, AgentID: "a", Capabilities: caps, AuthToken: "t", Metadata: bs(`{"k":["v",1]}`)}
	var rreq2 RegistrationRequest
	if err := DecodeRegistrationRequest(AppendRegistrationRequest(nil, &rreq), &rreq2); err != nil || show(&rreq) != show(&rreq2) {
		t.Fatalf("RegistrationRequest: %s %v", show(&rreq2), err)
	}
	bad := RegistrationRequest{ProtocolVersion: 2, Metadata: bs(`{`)}
	if got := AppendRegistrationRequest(nil, &bad); !json.Valid(got) || bytes.Contains(got, []byte("metadata")) {
		t.Fatalf("invalid metadata must be omitted: %s", got)
	}
	rres := RegistrationResponse{Accepted: true, AssignedID: "conn-1", Config: bs(`{"x":true}`)}
	var rres2 RegistrationResponse
	if err := DecodeRegistrationResponse(AppendRegistrationResponse(nil, &rres), &rres2); err != nil || show(&rres) != show(&rres2) {
		t.Fatalf("RegistrationResponse: %s %v", show(&rres2), err)
	}
}

// TestRegistrationResponsePayloadEncoding: payload_encoding is written only
// for protobuf (a JSON answer keeps the seed's shape), read back, "json"
// and absent both mean JSON, and an unknown value is undecodable.
func TestRegistrationResponsePayloadEncoding(t *testing.T) {
	for _, enc := range []string{"", EncodingJSON, EncodingProtobuf} {
		b := AppendRegistrationResponse(nil, &RegistrationResponse{Accepted: true, AssignedID: "conn-1", PayloadEncoding: enc})
		if (enc == EncodingProtobuf) != bytes.Contains(b, []byte(`"payload_encoding":"protobuf"`)) || (enc != EncodingProtobuf && bytes.Contains(b, []byte("payload_encoding"))) {
			t.Errorf("%q encoded as %s", enc, b)
		}
		var m RegistrationResponse
		want := enc
		if enc == EncodingJSON {
			want = ""
		}
		if err := DecodeRegistrationResponse(b, &m); err != nil || m.PayloadEncoding != want {
			t.Errorf("%q: decoded %q, %v", enc, m.PayloadEncoding, err)
		}
	}
	var m RegistrationResponse
	if err := DecodeRegistrationResponse([]byte(`{"accepted":true,"payload_encoding":"json"}`), &m); err != nil || m.PayloadEncoding != "" {
		t.Errorf(`"json": %q, %v`, m.PayloadEncoding, err)
	}
	if err := DecodeRegistrationResponse([]byte(`{"accepted":true,"payload_encoding":"xml"}`), &m); !errors.Is(err, ErrProtocolField) {
		t.Errorf(`"xml": %v, want ErrProtocolField`, err)
	}
}

func TestDecodeHandshakeResponseAcceptance(t *testing.T) {
	tests := []struct {
		payload  string
		accepted bool
		max      uint32
	}{
		{`{"protocol_version":2,"agent_name":"waf","capabilities":{"max_concurrent_requests":null}}`, true, 0},
		{`{"protocol_version":2,"accepted":true,"capabilities":{"max_concurrent_requests":7}}`, true, 7},
		{`{"protocol_version":2,"accepted":null}`, true, 0},
		{`{"protocol_version":2,"accepted":false}`, false, 0},
		{`{"protocol_version":2,"accepted":true,"error":"nope"}`, false, 0},
		{`{"protocol_version":2,"error":""}`, true, 0},
		{`{"protocol_version":3}`, true, 0}, // version checks are the caller's
	}
	for _, tt := range tests {
		var m HandshakeResponse
		if err := DecodeHandshakeResponse([]byte(tt.payload), &m); err != nil {
			t.Fatalf("%s: %v", tt.payload, err)
		}
		if m.Accepted != tt.accepted || m.Capabilities.MaxConcurrentRequests != tt.max {
			t.Fatalf("%s: accepted=%v max=%d", tt.payload, m.Accepted, m.Capabilities.MaxConcurrentRequests)
		}
	}
	var r RegistrationResponse
	if err := DecodeRegistrationResponse([]byte(`{"assigned_id":"x"}`), &r); err != nil || r.Accepted {
		t.Fatalf("registration without accepted must be a refusal: %+v %v", r, err)
	}
	if err := DecodeRegistrationResponse([]byte(`{"accepted":true,"error":"x"}`), &r); err != nil || r.Accepted {
		t.Fatalf("registration with an error must be a refusal: %+v %v", r, err)
	}
	if err := DecodeRegistrationResponse([]byte(`{"accepted":true,"config":null}`), &r); err != nil || !r.Accepted || r.Config != nil {
		t.Fatalf("null config: %+v %v", r, err)
	}
}

// Liberal forms are read (decoded and, for a Decision, normalized), and
// re-encode to the canonical form.
func TestDecodeLiberalForms(t *testing.T) {
	tests := []struct {
		name, kind, in, want string
	}{
		{"pair-list headers", "request_headers",
			`{"request_id":1,"method":"GET","uri":"/","headers":[["Host","example.com"],["accept","*/*"],["ACCEPT","text/html"]],"metadata":{}}`,
			`{"request_id":1,"method":"GET","uri":"/","has_body":false,"headers":{"host":["example.com"],"accept":["*/*","text/html"]},"metadata":{}}`},
		{"name/value object headers", "request_headers",
			`{"method":"GET","uri":"/","headers":[{"name":"X-A","value":"1"},{"value":"2","name":"x-a"}]}`,
			`{"request_id":0,"method":"GET","uri":"/","has_body":false,"headers":{"x-a":["1","2"]},"metadata":{}}`},
		{"single-string header values, numbers, nulls, upper-case names", "request_headers",
			`{"method":"GET","uri":"/","headers":{"Host":"example.com","X-N":[1,null,"b"],"x-null":null,"x-empty":[]},"metadata":null}`,
			`{"request_id":0,"method":"GET","uri":"/","has_body":false,"headers":{"host":["example.com"],"x-n":["1","b"]},"metadata":{}}`},
		{"escaped keys and whitespace", "request_headers",
			" \t\r\n{ \"request\\u005fid\" : 5 , \"method\":\"G\\u0045T\" ,\"uri\":\"\\/x\\ud83d\\ude00\\ud800\", \"metadata\":{\"client_port\":8080} } \n",
			`{"request_id":5,"method":"GET","uri":"/x😀` + "\ufffd" + `","has_body":false,"headers":{},"metadata":{"client_port":8080}}`},
		{"unknown keys skipped", "response_headers",
			`{"x":{"a":[1,2,{"b":[]}],"c":"\"}"},"request_id":1,"status_code":204,"y":[true,false,null,-1.5e+3],"has_body":false}`,
			`{"request_id":1,"status_code":204,"headers":{},"has_body":false}`},
		{"duplicate keys: last wins", "response_headers",
			`{"request_id":1,"request_id":2,"headers":{"a":["1"]},"headers":{"b":["2"]}}`,
			`{"request_id":2,"status_code":0,"headers":{"b":["2"]},"has_body":false}`},
		{"chunk data null and absent", "request_body_chunk",
			`{"request_id":1,"chunk_index":0,"data":null,"is_last":true,"total_size":null}`,
			`{"request_id":1,"chunk_index":0,"data":"","is_last":true}`},
		{"chunk data unpadded and escaped slash", "request_body_chunk",
			`{"request_id":1,"data":"aGVsbG8\/Pz8","bytes_sent":3}`,
			`{"request_id":1,"chunk_index":0,"data":"aGVsbG8/Pz8=","is_last":false,"bytes_received":3}`},
		{"Allow in letter case", "decision",
			`{"request_id":1,"decision":"Allow"}`,
			`{"request_id":1,"decision":"allow","request_headers":[],"response_headers":[]}`},
		{"ALLOW with null lists", "decision",
			`{"request_id":1,"decision":"ALLOW","request_headers":null,"response_headers":null,"audit":null,"needs_more":null}`,
			`{"request_id":1,"decision":"allow","request_headers":[],"response_headers":[]}`},
		{"allow as object", "decision",
			`{"request_id":1,"decision":{"Allow":null}}`,
			`{"request_id":1,"decision":"allow","request_headers":[],"response_headers":[]}`},
		{"Block object, default status, null body", "decision",
			`{"request_id":1,"decision":{"Block":{"body":null}}}`,
			`{"request_id":1,"decision":{"block":{"status":403,"body":null,"headers":{}}},"request_headers":[],"response_headers":[]}`},
		{"block status 0 is the default", "decision",
			`{"request_id":1,"decision":{"block":{"status":0}}}`,
			`{"request_id":1,"decision":{"block":{"status":403,"body":null,"headers":{}}},"request_headers":[],"response_headers":[]}`},
		{"block as a bare name", "decision",
			`{"request_id":1,"decision":"BLOCK"}`,
			`{"request_id":1,"decision":{"block":{"status":403,"body":null,"headers":{}}},"request_headers":[],"response_headers":[]}`},
		{"block headers as lists and pairs", "decision",
			`{"request_id":1,"decision":{"block":{"status":429,"headers":{"Retry-After":["1","2"],"X-A":"b"}}}}`,
			`{"request_id":1,"decision":{"block":{"status":429,"body":null,"headers":{"Retry-After":"2","X-A":"b"}}},"request_headers":[],"response_headers":[]}`},
		{"block with null params", "decision",
			`{"request_id":1,"decision":{"block":null}}`,
			`{"request_id":1,"decision":{"block":{"status":403,"body":null,"headers":{}}},"request_headers":[],"response_headers":[]}`},
		{"Redirect default status", "decision",
			`{"request_id":1,"decision":{"REDIRECT":{"url":"/login"}}}`,
			`{"request_id":1,"decision":{"redirect":{"url":"/login","status":302}},"request_headers":[],"response_headers":[]}`},
		{"needs_more as the decision", "decision",
			`{"request_id":1,"decision":{"needs_more":true}}`,
			`{"request_id":1,"decision":{"needs_more":true},"request_headers":[],"response_headers":[],"needs_more":true}`},
		{"NeedsMore as a name", "decision",
			`{"request_id":1,"decision":"NeedsMore"}`,
			`{"request_id":1,"decision":{"needs_more":true},"request_headers":[],"response_headers":[],"needs_more":true}`},
		{"allow with top-level needs_more", "decision",
			`{"needs_more":true,"request_id":1,"decision":"allow"}`,
			`{"request_id":1,"decision":"allow","request_headers":[],"response_headers":[],"needs_more":true}`},
		{"block ignores top-level needs_more", "decision",
			`{"request_id":1,"decision":{"block":{}},"needs_more":true}`,
			`{"request_id":1,"decision":{"block":{"status":403,"body":null,"headers":{}}},"request_headers":[],"response_headers":[]}`},
		{"both header op shapes and synonyms", "decision",
			`{"request_id":1,"decision":"allow","request_headers":[{"set":{"name":"x-a","value":"1"}},{"Operation":"x","operation":"APPEND","name":"x-b","value":2},{"op":"delete","name":"cookie","value":"ignored"},{"Remove":{"name":"x-c"}}],"response_headers":[{"value":"v","name":"n","operation":"Add"}]}`,
			`{"request_id":1,"decision":"allow","request_headers":[{"operation":"set","name":"x-a","value":"1"},{"operation":"add","name":"x-b","value":"2"},{"operation":"remove","name":"cookie"},{"operation":"remove","name":"x-c"}],"response_headers":[{"operation":"add","name":"n","value":"v"}]}`},
		{"mutation in decision with default phases", "decision",
			`{"request_id":3,"decision":"allow","response_body_mutation":{"chunk_index":2,"data":"eA=="},"request_body_mutation":null}`,
			`{"request_id":3,"decision":"allow","request_headers":[],"response_headers":[],"response_body_mutation":{"request_id":3,"phase":"response","chunk_index":2,"data":"eA=="}}`},
		{"audit with numbers, nulls and raw custom", "decision",
			`{"request_id":1,"decision":"allow","audit":{"tags":[null,"a"],"rule_ids":[942100,"x"],"confidence":1E2,"reason_codes":null,"custom":{ "k" : [ 1 , "\u00e9" ] }}}`,
			`{"request_id":1,"decision":"allow","request_headers":[],"response_headers":[],"audit":{"tags":["a"],"rule_ids":["942100","x"],"confidence":100,"reason_codes":[],"custom":{ "k" : [ 1 , "\u00e9" ] }}}`},
		{"audit custom null is absent", "decision",
			`{"request_id":1,"decision":"allow","audit":{"custom":null,"confidence":null}}`,
			`{"request_id":1,"decision":"allow","request_headers":[],"response_headers":[]}`},
		{"body mutation phase case, data null", "body_mutation",
			`{"request_id":1,"phase":"Response","data":null}`,
			`{"request_id":1,"phase":"response","chunk_index":0}`},
		{"body mutation phase default", "body_mutation",
			`{"request_id":1,"data":"eHk="}`,
			`{"request_id":1,"phase":"request","chunk_index":0,"data":"eHk="}`},
		{"cancel with null reason", "cancel_request",
			`{"request_id":1,"reason":null}`,
			`{"request_id":1}`},
		{"ping with escaped keys", "ping",
			`{"seq\u0075ence":1,"timestamp_ms":-5,"x":"\u0000"}`,
			`{"sequence":1,"timestamp_ms":-5}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := codecFor(t, tt.kind)
			m, err := c.read([]byte(tt.in))
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if got := c.encode(nil, m); string(got) != tt.want {
				t.Fatalf("canonical form\n got: %s\nwant: %s", got, tt.want)
			}
		})
	}
}

func TestDecisionNeedsMoreFlags(t *testing.T) {
	tests := []struct {
		in        string
		kind      DecisionKind
		needsMore bool
	}{
		{`{"decision":{"needs_more":true}}`, DecisionNeedsMore, true},
		{`{"decision":{"NeedsMore":{}}}`, DecisionNeedsMore, true},
		{`{"decision":"allow","needs_more":true}`, DecisionAllow, true},
		{`{"decision":"allow","needs_more":false}`, DecisionAllow, false},
		{`{"decision":"allow"}`, DecisionAllow, false},
		{`{"decision":{"redirect":{"url":"/"}},"needs_more":true}`, DecisionRedirect, false},
	}
	for _, tt := range tests {
		var m Decision
		if err := m.Decode([]byte(tt.in)); err != nil {
			t.Fatalf("%s: %v", tt.in, err)
		}
		if err := m.Normalize(); err != nil {
			t.Fatalf("%s: %v", tt.in, err)
		}
		if m.Kind != tt.kind || m.NeedsMore != tt.needsMore || m.Final() == tt.needsMore {
			t.Fatalf("%s: kind=%v needsMore=%v final=%v", tt.in, m.Kind, m.NeedsMore, m.Final())
		}
	}
}

// TestDecodeErrors: what a receiver refuses, and with which sentinel. The
// schema cases (no verdict, redirect without url, header operation
// without operation or name) are refused by Normalize, not by the decoder:
// TestNormalizeRejects checks that split.
func TestDecodeErrors(t *testing.T) {
	deep := strings.Repeat(`{"a":`, 70) + "1" + strings.Repeat("}", 70)
	deepArr := `{"x":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + "}"
	tests := []struct {
		name, kind, in string
		want           error
	}{
		{"empty", "request_headers", ``, ErrProtocolSyntax},
		{"whitespace", "request_headers", " \n", ErrProtocolSyntax},
		{"array", "request_headers", `[]`, ErrProtocolSyntax},
		{"string", "decision", `"allow"`, ErrProtocolSyntax},
		{"null", "body_mutation", `null`, ErrProtocolSyntax},
		{"number", "ping", `1`, ErrProtocolSyntax},
		{"trailing garbage", "request_headers", `{"request_id":1} x`, ErrProtocolSyntax},
		{"two objects", "cancel_all", `{}{}`, ErrProtocolSyntax},
		{"trailing comma in object", "cancel_request", `{"request_id":1,}`, ErrProtocolSyntax},
		{"trailing comma in array", "decision", `{"decision":"allow","request_headers":[{"set":{"name":"a"}},]}`, ErrProtocolSyntax},
		{"missing colon", "ping", `{"sequence" 1}`, ErrProtocolSyntax},
		{"missing comma", "ping", `{"sequence":1 "timestamp_ms":2}`, ErrProtocolSyntax},
		{"single quotes", "ping", `{'sequence':1}`, ErrProtocolSyntax},
		{"unquoted key", "ping", `{sequence:1}`, ErrProtocolSyntax},
		{"invalid UTF-8 in string", "request_headers", "{\"method\":\"G\xffT\"}", ErrProtocolSyntax},
		{"invalid UTF-8 in skipped value", "request_headers", "{\"x\":[\"\xc3\"]}", ErrProtocolSyntax},
		{"invalid UTF-8 outside strings", "request_headers", "{\xc3\xa9:1}", ErrProtocolSyntax},
		{"control character in string", "request_headers", "{\"method\":\"a\nb\"}", ErrProtocolSyntax},
		{"bad escape", "request_headers", `{"method":"\x41"}`, ErrProtocolSyntax},
		{"short unicode escape", "request_headers", `{"method":"\u12"}`, ErrProtocolSyntax},
		{"bad unicode escape", "request_headers", `{"method":"\u12g4"}`, ErrProtocolSyntax},
		{"bad escape in key", "ping", `{"\q":1}`, ErrProtocolSyntax},
		{"bad escape in skipped value", "ping", `{"x":"\q"}`, ErrProtocolSyntax},
		{"leading zero", "ping", `{"sequence":01}`, ErrProtocolSyntax},
		{"bare minus", "ping", `{"sequence":-}`, ErrProtocolSyntax},
		{"bad fraction", "ping", `{"x":1.}`, ErrProtocolSyntax},
		{"bad exponent", "ping", `{"x":1e}`, ErrProtocolSyntax},
		{"plus sign", "ping", `{"x":+1}`, ErrProtocolSyntax},
		{"bad literal", "request_headers", `{"has_body":tru}`, ErrProtocolSyntax},
		{"bad literal in skipped value", "request_headers", `{"x":nul}`, ErrProtocolSyntax},
		{"NaN", "ping", `{"x":NaN}`, ErrProtocolSyntax},
		{"deep nesting in unknown key", "decision", deep, ErrProtocolSyntax},
		{"very deep arrays", "request_headers", deepArr, ErrProtocolSyntax},
		{"deep custom", "decision", `{"decision":"allow","audit":{"custom":` + strings.Repeat("[", 65) + strings.Repeat("]", 65) + `}}`, ErrProtocolSyntax},
		{"truncated string", "request_headers", `{"method":"GET`, ErrProtocolSyntax},
		{"truncated escape", "request_headers", `{"method":"GET\`, ErrProtocolSyntax},
		{"BOM", "ping", "\xef\xbb\xbf{}", ErrProtocolSyntax},
		{"garbled where a string is expected", "request_headers", `{"method":}`, ErrProtocolSyntax},

		{"request_id string", "request_headers", `{"request_id":"1"}`, ErrProtocolField},
		{"request_id negative", "request_headers", `{"request_id":-1}`, ErrProtocolField},
		{"request_id fraction", "request_headers", `{"request_id":1.0}`, ErrProtocolField},
		{"request_id exponent", "request_headers", `{"request_id":1e3}`, ErrProtocolField},
		{"request_id overflow", "request_headers", `{"request_id":18446744073709551616}`, ErrProtocolField},
		{"request_id huge", "decision", `{"request_id":99999999999999999999999,"decision":"allow"}`, ErrProtocolField},
		{"chunk_index overflow", "request_body_chunk", `{"chunk_index":4294967296}`, ErrProtocolField},
		{"timeout_ms overflow", "request_headers", `{"timeout_ms":4294967296}`, ErrProtocolField},
		{"timeout_ms negative", "response_headers", `{"timeout_ms":-1}`, ErrProtocolField},
		{"timeout_ms fraction", "request_body_chunk", `{"timeout_ms":1.5}`, ErrProtocolField},
		{"timeout_ms string", "response_body_chunk", `{"timeout_ms":"1000"}`, ErrProtocolField},
		{"chunk_index negative", "body_mutation", `{"chunk_index":-1}`, ErrProtocolField},
		{"total_size negative", "request_body_chunk", `{"total_size":-2}`, ErrProtocolField},
		{"total_size overflow", "request_body_chunk", `{"total_size":9223372036854775808}`, ErrProtocolField},
		{"status_code overflow", "response_headers", `{"status_code":2147483648}`, ErrProtocolField},
		{"status_code fraction", "response_headers", `{"status_code":200.5}`, ErrProtocolField},
		{"client_port out of range", "request_headers", `{"metadata":{"client_port":65536}}`, ErrProtocolField},
		{"server_port out of range", "request_headers", `{"metadata":{"server_port":65536}}`, ErrProtocolField},
		{"server_port negative", "request_headers", `{"metadata":{"server_port":-1}}`, ErrProtocolField},
		{"request_target not a string", "request_headers", `{"request_target":7}`, ErrProtocolField},
		{"timestamp_ms overflow", "ping", `{"timestamp_ms":-9223372036854775809}`, ErrProtocolField},
		{"method number", "request_headers", `{"method":1}`, ErrProtocolField},
		{"has_body string", "request_headers", `{"has_body":"true"}`, ErrProtocolField},
		{"headers string", "request_headers", `{"headers":"host: x"}`, ErrProtocolField},
		{"header value object", "request_headers", `{"headers":{"a":{"b":1}}}`, ErrProtocolField},
		{"header pair too short", "request_headers", `{"headers":[["a"]]}`, ErrProtocolField},
		{"header pair too long", "response_headers", `{"headers":[["a","b","c"]]}`, ErrProtocolField},
		{"header pair name number", "response_headers", `{"headers":[[1,"b"]]}`, ErrProtocolField},
		{"header pair not a pair", "response_headers", `{"headers":["a"]}`, ErrProtocolField},
		{"metadata array", "request_headers", `{"metadata":[]}`, ErrProtocolField},
		{"data not base64", "request_body_chunk", `{"data":"a$b="}`, ErrProtocolField},
		{"data bad length", "request_body_chunk", `{"data":"aGVsb"}`, ErrProtocolField},
		{"data misplaced padding", "request_body_chunk", `{"data":"aG=sbG8="}`, ErrProtocolField},
		{"data only padding", "request_body_chunk", `{"data":"===="}`, ErrProtocolField},
		{"data url alphabet", "body_mutation", `{"data":"a-_b"}`, ErrProtocolField},
		{"data with newline", "body_mutation", `{"data":"aGVs\nbG8="}`, ErrProtocolField},
		{"data number", "body_mutation", `{"data":5}`, ErrProtocolField},
		{"data bad symbol late", "request_body_chunk", `{"data":"` + strings.Repeat("QUJD", 10) + `$AAA"}`, ErrProtocolField},
		{"data control character late", "request_body_chunk", `{"data":"` + strings.Repeat("QUJD", 10) + "\x01AAA\"}", ErrProtocolSyntax},
		{"data invalid UTF-8 late", "body_mutation", `{"data":"` + strings.Repeat("QUJD", 10) + "A\xffAA\"}", ErrProtocolSyntax},
		{"data unterminated", "body_mutation", `{"data":"` + strings.Repeat("QUJD", 10), ErrProtocolSyntax},
		{"data escaped bad base64", "body_mutation", `{"data":"QU\/$"}`, ErrProtocolField},
		{"unknown phase", "body_mutation", `{"phase":"trailers"}`, ErrProtocolField},
		{"is_last number", "request_body_chunk", `{"is_last":1}`, ErrProtocolField},
		{"ops not a list", "decision", `{"decision":"allow","request_headers":{}}`, ErrProtocolField},
		{"op not an object", "decision", `{"decision":"allow","request_headers":["set"]}`, ErrProtocolField},
		{"op unknown", "decision", `{"decision":"allow","request_headers":[{"operation":"rename","name":"a"}]}`, ErrProtocolField},
		{"op missing", "decision", `{"decision":"allow","request_headers":[{"name":"a","value":"b"}]}`, ErrProtocolField},
		{"op without name", "decision", `{"decision":"allow","request_headers":[{"operation":"set","value":"b"}]}`, ErrProtocolField},
		{"tagged op without name", "decision", `{"decision":"allow","response_headers":[{"set":{"value":"b"}}]}`, ErrProtocolField},
		{"audit tags object", "decision", `{"decision":"allow","audit":{"tags":{}}}`, ErrProtocolField},
		{"audit tag object", "decision", `{"decision":"allow","audit":{"tags":[{}]}}`, ErrProtocolField},
		{"confidence string", "decision", `{"decision":"allow","audit":{"confidence":"high"}}`, ErrProtocolField},
		{"confidence overflow", "decision", `{"decision":"allow","audit":{"confidence":1e400}}`, ErrProtocolField},
		{"embedded mutation bad data", "decision", `{"decision":"allow","request_body_mutation":{"data":"%"}}`, ErrProtocolField},
		{"needs_more string", "decision", `{"decision":"allow","needs_more":"yes"}`, ErrProtocolField},

		{"missing decision", "decision", `{"request_id":1}`, ErrProtocolDecision},
		{"null decision", "decision", `{"request_id":1,"decision":null}`, ErrProtocolDecision},
		{"unknown decision", "decision", `{"decision":"maybe"}`, ErrProtocolDecision},
		{"unknown decision object", "decision", `{"decision":{"challenge":{}}}`, ErrProtocolDecision},
		{"empty decision object", "decision", `{"decision":{}}`, ErrProtocolDecision},
		{"two kinds", "decision", `{"decision":{"allow":null,"block":{}}}`, ErrProtocolDecision},
		{"decision number", "decision", `{"decision":1}`, ErrProtocolDecision},
		{"redirect name only", "decision", `{"decision":"redirect"}`, ErrProtocolDecision},
		{"redirect without url", "decision", `{"decision":{"redirect":{"status":301}}}`, ErrProtocolDecision},
		{"redirect null", "decision", `{"decision":{"redirect":null}}`, ErrProtocolDecision},
		{"block status string", "decision", `{"decision":{"block":{"status":"403"}}}`, ErrProtocolDecision},
		{"block status overflow", "decision", `{"decision":{"block":{"status":1e3}}}`, ErrProtocolDecision},
		{"block body number", "decision", `{"decision":{"block":{"body":1}}}`, ErrProtocolDecision},
		{"block headers string", "decision", `{"decision":{"block":{"headers":"x"}}}`, ErrProtocolDecision},
		{"block params list", "decision", `{"decision":{"block":[]}}`, ErrProtocolDecision},
		{"needs_more false", "decision", `{"decision":{"needs_more":false}}`, ErrProtocolDecision},
		{"needs_more number", "decision", `{"decision":{"needs_more":1}}`, ErrProtocolDecision},

		{"handshake not an object", "handshake_response", `[]`, ErrProtocolSyntax},
		{"handshake trailing garbage", "handshake_response", `{}x`, ErrProtocolSyntax},
		{"handshake invalid UTF-8", "handshake_request", "{\"client_name\":\"\xff\"}", ErrProtocolSyntax},
		{"handshake deep", "registration_request", `{"metadata":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}`, ErrProtocolSyntax},
		{"handshake wrong type", "handshake_response", `{"accepted":"yes"}`, ErrProtocolField},
		{"handshake max overflow", "handshake_response", `{"capabilities":{"max_concurrent_requests":4294967296}}`, ErrProtocolField},
		{"registration version string", "registration_request", `{"protocol_version":"2"}`, ErrProtocolField},
		{"registration response wrong type", "registration_response", `{"accepted":1}`, ErrProtocolField},
	}
	sentinels := []error{ErrProtocolSyntax, ErrProtocolField, ErrProtocolDecision}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := codecFor(t, tt.kind)
			_, err := c.read([]byte(tt.in))
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
			for _, s := range sentinels {
				if s != tt.want && errors.Is(err, s) {
					t.Fatalf("%v also wraps %v", err, s)
				}
			}
		})
	}
}

func TestErrorsNameTheFieldNotTheContent(t *testing.T) {
	var m Decision
	err := m.Decode([]byte(`{"decision":{"block":{"status":"SECRET"}}}`))
	if err == nil || !strings.Contains(err.Error(), "decision.block.status") || strings.Contains(err.Error(), "SECRET") {
		t.Fatalf("error %q", err)
	}
	var r RequestHeaders
	err = r.Decode([]byte(`{"metadata":{"client_port":"SECRET"}}`))
	if err == nil || !strings.Contains(err.Error(), "metadata.client_port") || strings.Contains(err.Error(), "SECRET") {
		t.Fatalf("error %q", err)
	}
}

func TestPeekRequestID(t *testing.T) {
	tests := []struct {
		in   string
		id   uint64
		want bool
	}{
		{`{"request_id":42,"x":1}`, 42, true},
		{`{"request_id":0}`, 0, true},
		{`{"request_id":18446744073709551615}`, math.MaxUint64, true},
		{`{"request_id":18446744073709551616}`, 0, false},
		{`{"request_id":9999999999999999999,"a":1}`, 9999999999999999999, true},
		{` { "a" : {"request_id":1} , "b":[1,"request_id"], "request_id" : 7 }`, 7, true},
		{`{"data":"aGVsbG8=","request_\u0069d":8}`, 8, true},
		{`{"request_id":01}`, 0, false},
		{`{"request_id":1.5}`, 0, false},
		{`{"request_id":-1}`, 0, false},
		{`{"request_id":"1"}`, 0, false},
		{`{"request_id":null}`, 0, false},
		{`{"request_id":1`, 0, false},
		{`{"request_id":1x}`, 0, false},
		{`{"a":1}`, 0, false},
		{`{"a":[}`, 0, false},
		{`[{"request_id":1}]`, 0, false},
		{``, 0, false},
	}
	for _, tt := range tests {
		in := []byte(tt.in)
		orig := bytes.Clone(in)
		id, ok := PeekRequestID(in)
		if id != tt.id || ok != tt.want {
			t.Errorf("PeekRequestID(%s) = %d, %v; want %d, %v", tt.in, id, ok, tt.id, tt.want)
		}
		if !bytes.Equal(in, orig) {
			t.Errorf("PeekRequestID modified %s", tt.in)
		}
	}
	for _, g := range readGoldens(t) {
		var ref struct {
			RequestID *uint64 `json:"request_id"`
		}
		if err := json.Unmarshal(g.payload, &ref); err != nil {
			t.Fatal(err)
		}
		id, ok := PeekRequestID(g.payload)
		if ok != (ref.RequestID != nil) || (ok && id != *ref.RequestID) {
			t.Errorf("%s: PeekRequestID = %d, %v", g.name, id, ok)
		}
	}
}

func TestDecodeDoesNotModifyOrRetainPayload(t *testing.T) {
	in := []byte(`{"request_id":1,"method":"G\u0045T","uri":"/\"x\"","headers":{"X-\u0041":["\ud83d\ude00"]},"metadata":{}}`)
	orig := bytes.Clone(in)
	var m RequestHeaders
	if err := m.Decode(in); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(in, orig) {
		t.Fatalf("payload modified: %s", in)
	}
	for i := range in {
		in[i] = 'X'
	}
	if string(m.Method) != "GET" || string(m.URI) != `/"x"` || string(m.Headers[0].Name) != "x-a" || string(m.Headers[0].Value) != "😀" {
		t.Fatalf("decoded message depends on the caller's buffer: %s", show(&m))
	}
}

func TestDecodedSlicesAreCapped(t *testing.T) {
	var m RequestHeaders
	if err := m.Decode([]byte(`{"method":"GET","uri":"/x","headers":{"a":["1"]}}`)); err != nil {
		t.Fatal(err)
	}
	_ = append(m.Method, "XXXXXXXX"...)
	_ = append(m.Headers[0].Value, "XXXXXXXX"...)
	if string(m.URI) != "/x" || string(m.Headers[0].Name) != "a" {
		t.Fatalf("appending to a decoded field overwrote its neighbours: %s", show(&m))
	}
}

func TestReuseAcrossDecodes(t *testing.T) {
	var m Decision
	big := `{"request_id":1,"decision":{"block":{"status":500,"body":"x","headers":{"a":"b"}}},"request_headers":[{"operation":"set","name":"a","value":"b"}],"audit":{"tags":["t"],"custom":{}},"request_body_mutation":{"data":"eA=="}}`
	if err := m.Decode([]byte(big)); err != nil {
		t.Fatal(err)
	}
	if err := m.Decode([]byte(`{"request_id":2,"decision":"allow"}`)); err != nil {
		t.Fatal(err)
	}
	want := Decision{RequestID: 2}
	if show(&m) != show(&want) {
		t.Fatalf("state leaked across decodes: %s", show(&m))
	}
}

func TestLargeBufferIsNotRetained(t *testing.T) {
	var m BodyChunk
	big := AppendBodyChunk(nil, &BodyChunk{Data: make([]byte, 2*maxRetainedRaw), TotalSize: -1, Progress: -1}, TypeRequestBodyChunk)
	if err := m.Decode(big); err != nil {
		t.Fatal(err)
	}
	if err := m.Decode([]byte(`{"data":"eA=="}`)); err != nil {
		t.Fatal(err)
	}
	if cap(m.raw) > maxRetainedRaw {
		t.Fatalf("kept a %d-byte buffer after a small payload", cap(m.raw))
	}
}

// appendString must produce what encoding/json reads back as the same text
// encoding/json itself would produce (invalid UTF-8 → U+FFFD per byte).
func TestAppendStringAgreesWithEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	alphabet := []string{"a", "Z", " ", "\"", "\\", "/", "\n", "\t", "\x00", "\x1f", "\x7f", "é", "日", "😀", "\xff", "\xc3", "\xed\xa0\x80", "\u2028", "<", "&"}
	for i := 0; i < 5000; i++ {
		var b strings.Builder
		for n := r.IntN(40); n > 0; n-- {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		s := b.String()
		enc := appendString(nil, []byte(s))
		var got, want string
		if err := json.Unmarshal(enc, &got); err != nil {
			t.Fatalf("%q encodes to invalid JSON %s: %v", s, enc, err)
		}
		ref, _ := json.Marshal(s)
		if err := json.Unmarshal(ref, &want); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("%q: encoding/json reads back %q, want %q", s, got, want)
		}
		// And the scanner reads it back the same way.
		var m CancelAll
		if err := m.Decode(append(append([]byte(`{"reason":`), enc...), '}')); err != nil || string(m.Reason) != want {
			t.Fatalf("%q: decoded %q, %v; want %q", s, m.Reason, err, want)
		}
	}
}

// The scanner's unescaping must agree with encoding/json on arbitrary
// escape sequences, including broken surrogate pairs.
func TestUnescapeAgreesWithEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	pieces := []string{`a`, `\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`, `\u0000`, `\u00e9`, `\uD83D`, `\uDE00`, `\ud83d\ude00`, `\uDBFF\uDFFF`, `\uffff`, `é`, `\u0041`}
	for i := 0; i < 5000; i++ {
		var b strings.Builder
		b.WriteString(`{"reason":"`)
		for n := r.IntN(12); n > 0; n-- {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		b.WriteString(`"}`)
		var want struct{ Reason string }
		if err := json.Unmarshal([]byte(b.String()), &want); err != nil {
			t.Fatal(err)
		}
		var m CancelAll
		if err := m.Decode([]byte(b.String())); err != nil || string(m.Reason) != want.Reason {
			t.Fatalf("%s: got %q, %v; want %q", b.String(), m.Reason, err, want.Reason)
		}
	}
}

func TestBase64InPlaceAgreesWithEncodingBase64(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for n := 0; n < 300; n++ {
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding} {
			buf := []byte(enc.EncodeToString(data))
			k, ok, _ := decodeBase64InPlace(buf)
			if !ok || !bytes.Equal(buf[:k], data) {
				t.Fatalf("len %d: got %x, %v", n, buf[:k], ok)
			}
		}
	}
	// Invalid input: anything encoding/base64 rejects in both padded and
	// unpadded form is rejected too.
	for i := 0; i < 20000; i++ {
		in := make([]byte, r.IntN(14))
		for j := range in {
			in[j] = "AQ+/=z$\n"[r.IntN(8)]
		}
		_, errStd := base64.StdEncoding.DecodeString(string(in))
		_, errRaw := base64.RawStdEncoding.DecodeString(string(in))
		_, ok, _ := decodeBase64InPlace(bytes.Clone(in))
		if ok && errStd != nil && errRaw != nil {
			t.Fatalf("%q accepted but rejected by encoding/base64", in)
		}
		if !ok && !bytes.ContainsAny(in, "\n") && (errStd == nil || errRaw == nil) {
			t.Fatalf("%q rejected but accepted by encoding/base64", in)
		}
	}
}

// Long header lists take the hashed grouping path (on the stack, then on
// the heap past groupStack fields); both must group like the short path.
func TestHeaderGroupingLongLists(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, n := range []int{3, groupDirect, groupDirect + 1, 100, groupStack, groupStack + 1, 2000} {
		for _, names := range []int{1, 7, n} {
			var h Headers
			for i := 0; i < n; i++ {
				h = h.Add([]byte("x-"+strconv.Itoa(r.IntN(names))), []byte(strconv.Itoa(i)))
			}
			in := RequestHeaders{Method: bs("GET"), URI: bs("/"), Headers: h}
			var got RequestHeaders
			if err := got.Decode(AppendRequestHeaders(nil, &in)); err != nil {
				t.Fatal(err)
			}
			if want := groupHeaders(h); show(got.Headers) != show(want) {
				t.Fatalf("n=%d names=%d: grouped\n got: %s\nwant: %s", n, names, show(got.Headers), show(want))
			}
			d := Decision{Kind: DecisionBlock, Status: 403, BlockHeaders: h}
			var gotD Decision
			if err := gotD.Decode(AppendDecision(nil, &d)); err != nil {
				t.Fatal(err)
			}
			if want := lastWins(h); show(gotD.BlockHeaders) != show(want) {
				t.Fatalf("n=%d names=%d: block headers\n got: %s\nwant: %s", n, names, show(gotD.BlockHeaders), show(want))
			}
		}
	}
}
