package protocol

import (
	"encoding/json"
	"strings"
	"testing"
)

// Benchmarks of the hot codec, and of encoding/json decoding the same
// payloads into equivalent string-typed structs, the obvious alternative.

func benchEncode(b *testing.B, enc func(dst []byte) []byte) {
	dst := enc(nil)
	b.SetBytes(int64(len(dst)))
	b.ReportAllocs()
	for b.Loop() {
		dst = enc(dst[:0])
	}
}

func benchDecode(b *testing.B, payload []byte, dec func([]byte) error) {
	if err := dec(payload); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		if err := dec(payload); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeRequestHeaders(b *testing.B) {
	m := sampleRequestHeaders()
	benchEncode(b, func(dst []byte) []byte { return AppendRequestHeaders(dst, m) })
}

func BenchmarkDecodeRequestHeaders(b *testing.B) {
	var m RequestHeaders
	benchDecode(b, AppendRequestHeaders(nil, sampleRequestHeaders()), m.Decode)
}

func BenchmarkEncodeBodyChunk(b *testing.B) {
	m := sampleBodyChunk()
	benchEncode(b, func(dst []byte) []byte { return AppendBodyChunk(dst, m, TypeRequestBodyChunk) })
}

func BenchmarkDecodeBodyChunk(b *testing.B) {
	var m BodyChunk
	benchDecode(b, AppendBodyChunk(nil, sampleBodyChunk(), TypeRequestBodyChunk), m.Decode)
}

func BenchmarkEncodeResponseHeaders(b *testing.B) {
	m := sampleResponseHeaders()
	benchEncode(b, func(dst []byte) []byte { return AppendResponseHeaders(dst, m) })
}

func BenchmarkDecodeResponseHeaders(b *testing.B) {
	var m ResponseHeaders
	benchDecode(b, AppendResponseHeaders(nil, sampleResponseHeaders()), m.Decode)
}

func BenchmarkEncodeDecision(b *testing.B) {
	m := sampleDecision()
	benchEncode(b, func(dst []byte) []byte { return AppendDecision(dst, m) })
}

func BenchmarkDecodeDecision(b *testing.B) {
	var m Decision
	benchDecode(b, AppendDecision(nil, sampleDecision()), m.Decode)
}

// The most frequent Decision: a bare allow.
func BenchmarkDecodeDecisionAllow(b *testing.B) {
	var m Decision
	benchDecode(b, []byte(`{"request_id":123456789,"decision":"allow","request_headers":[],"response_headers":[]}`), m.Decode)
}

func BenchmarkEncodeBodyMutation(b *testing.B) {
	m := sampleBodyMutation()
	benchEncode(b, func(dst []byte) []byte { return AppendBodyMutation(dst, m) })
}

func BenchmarkDecodeBodyMutation(b *testing.B) {
	var m BodyMutation
	benchDecode(b, AppendBodyMutation(nil, sampleBodyMutation()), m.Decode)
}

func BenchmarkPeekRequestID(b *testing.B) {
	payload := AppendDecision(nil, sampleDecision())
	benchDecode(b, payload, func(p []byte) error {
		if _, ok := PeekRequestID(p); !ok {
			b.Fatal("no request_id")
		}
		return nil
	})
}

// encoding/json equivalents.

type jsonMetadata struct {
	CorrelationID string `json:"correlation_id,omitempty"`
	ClientIP      string `json:"client_ip,omitempty"`
	ClientPort    int    `json:"client_port,omitempty"`
	Protocol      string `json:"protocol,omitempty"`
	ServerName    string `json:"server_name,omitempty"`
	RouteID       string `json:"route_id,omitempty"`
	UpstreamID    string `json:"upstream_id,omitempty"`
	Traceparent   string `json:"traceparent,omitempty"`
	Timestamp     string `json:"timestamp,omitempty"`

	TLSVersion       string `json:"tls_version,omitempty"`
	TLSCipher        string `json:"tls_cipher,omitempty"`
	TLSServerName    string `json:"tls_server_name,omitempty"`
	TLSClientSubject string `json:"tls_client_subject,omitempty"`
	TLSClientSAN     string `json:"tls_client_san,omitempty"`
}

type jsonRequestHeaders struct {
	RequestID uint64              `json:"request_id"`
	Method    string              `json:"method"`
	URI       string              `json:"uri"`
	HasBody   bool                `json:"has_body"`
	Headers   map[string][]string `json:"headers"`
	Metadata  jsonMetadata        `json:"metadata"`
}

type jsonBodyChunk struct {
	RequestID     uint64 `json:"request_id"`
	ChunkIndex    uint32 `json:"chunk_index"`
	Data          []byte `json:"data"`
	IsLast        bool   `json:"is_last"`
	TotalSize     *int64 `json:"total_size,omitempty"`
	BytesReceived *int64 `json:"bytes_received,omitempty"`
}

type jsonHeaderOp struct {
	Operation string  `json:"operation"`
	Name      string  `json:"name"`
	Value     *string `json:"value,omitempty"`
}

type jsonBlock struct {
	Status  int               `json:"status"`
	Body    *string           `json:"body"`
	Headers map[string]string `json:"headers"`
}

type jsonRedirect struct {
	URL    string `json:"url"`
	Status int    `json:"status"`
}

// jsonDecisionKind is the externally tagged decision enum, read the way an
// encoding/json implementation would have to: string or one-key object.
type jsonDecisionKind struct {
	Kind     string
	Block    *jsonBlock
	Redirect *jsonRedirect
}

func (k *jsonDecisionKind) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		return json.Unmarshal(b, &k.Kind)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil {
		return err
	}
	for name, raw := range obj {
		k.Kind = strings.ToLower(name)
		switch k.Kind {
		case "block":
			k.Block = &jsonBlock{Status: 403}
			return json.Unmarshal(raw, k.Block)
		case "redirect":
			k.Redirect = &jsonRedirect{Status: 302}
			return json.Unmarshal(raw, k.Redirect)
		}
	}
	return nil
}

type jsonAudit struct {
	Tags        []string        `json:"tags"`
	RuleIDs     []string        `json:"rule_ids"`
	Confidence  *float64        `json:"confidence,omitempty"`
	ReasonCodes []string        `json:"reason_codes"`
	Custom      json.RawMessage `json:"custom,omitempty"`
}

type jsonDecision struct {
	RequestID       uint64           `json:"request_id"`
	Decision        jsonDecisionKind `json:"decision"`
	RequestHeaders  []jsonHeaderOp   `json:"request_headers"`
	ResponseHeaders []jsonHeaderOp   `json:"response_headers"`
	NeedsMore       bool             `json:"needs_more,omitempty"`
	Audit           *jsonAudit       `json:"audit,omitempty"`
}

func BenchmarkEncodingJSONDecodeRequestHeaders(b *testing.B) {
	payload := AppendRequestHeaders(nil, sampleRequestHeaders())
	benchDecode(b, payload, func(p []byte) error {
		var v jsonRequestHeaders
		return json.Unmarshal(p, &v)
	})
}

func BenchmarkEncodingJSONEncodeRequestHeaders(b *testing.B) {
	var v jsonRequestHeaders
	if err := json.Unmarshal(AppendRequestHeaders(nil, sampleRequestHeaders()), &v); err != nil {
		b.Fatal(err)
	}
	benchEncode(b, func(dst []byte) []byte {
		out, _ := json.Marshal(&v)
		return append(dst, out...)
	})
}

func BenchmarkEncodingJSONDecodeBodyChunk(b *testing.B) {
	payload := AppendBodyChunk(nil, sampleBodyChunk(), TypeRequestBodyChunk)
	benchDecode(b, payload, func(p []byte) error {
		var v jsonBodyChunk
		return json.Unmarshal(p, &v)
	})
}

func BenchmarkEncodingJSONDecodeDecision(b *testing.B) {
	payload := AppendDecision(nil, sampleDecision())
	benchDecode(b, payload, func(p []byte) error {
		var v jsonDecision
		if err := json.Unmarshal(p, &v); err != nil {
			return err
		}
		if v.Decision.Block == nil || len(v.RequestHeaders) != 3 {
			b.Fatal("encoding/json decoded the wrong thing")
		}
		return nil
	})
}
