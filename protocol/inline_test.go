package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func inlineSample(data []byte, last bool) *RequestHeaders {
	m := sampleRequestHeaders()
	m.HasInlineBody = true
	m.InlineBody = BodyChunk{Data: data, IsLast: last, TotalSize: int64(len(data)), Progress: int64(len(data))}
	return m
}

func TestRoundTripInlineBody(t *testing.T) {
	binary := make([]byte, 300)
	for i := range binary {
		binary[i] = byte(i)
	}
	tests := []struct {
		name string
		in   *RequestHeaders
	}{
		{"whole body", inlineSample(bs(`{"q":"hi"}`), true)},
		{"binary", inlineSample(binary, true)},
		{"first chunk, sizes unknown", func() *RequestHeaders {
			m := inlineSample(bs("abc"), false)
			m.InlineBody.TotalSize, m.InlineBody.Progress = -1, -1
			return m
		}()},
		{"empty last chunk", inlineSample(nil, true)},
		{"no inline body", sampleRequestHeaders()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			payload := AppendRequestHeaders(nil, tt.in)
			if !json.Valid(payload) {
				t.Fatalf("invalid JSON: %s", payload)
			}
			if got := bytes.Contains(payload, []byte(`"inline_body"`)); got != tt.in.HasInlineBody {
				t.Fatalf("inline_body written = %v, want %v: %s", got, tt.in.HasInlineBody, payload)
			}
			var got RequestHeaders
			if err := got.Decode(payload); err != nil {
				t.Fatalf("decode %s: %v", payload, err)
			}
			want := readBack(tt.in)
			if show(&got) != show(want) {
				t.Fatalf("round trip of %s\n got: %s\nwant: %s", payload, show(&got), show(want))
			}
			// The decoded chunk is exactly what a RequestBodyChunk with the
			// same members decodes to.
			if tt.in.HasInlineBody {
				var c BodyChunk
				if err := c.Decode(AppendBodyChunk(nil, &tt.in.InlineBody, TypeRequestBodyChunk)); err != nil {
					t.Fatal(err)
				}
				if show(&c) != show(&got.InlineBody) {
					t.Fatalf("inline chunk %s, as a chunk event %s", show(&got.InlineBody), show(&c))
				}
			}
		})
	}
}

// The inline object is a RequestBodyChunk's members without request_id,
// after metadata.
func TestInlineBodyCanonicalForm(t *testing.T) {
	m := &RequestHeaders{RequestID: 7, Method: bs("POST"), URI: bs("/"), HasBody: true,
		HasInlineBody: true, InlineBody: BodyChunk{Data: bs("hello"), IsLast: true, TotalSize: 5, Progress: 5}}
	want := `{"request_id":7,"method":"POST","uri":"/","has_body":true,"headers":{},"metadata":{},` +
		`"inline_body":{"chunk_index":0,"data":"aGVsbG8=","is_last":true,"total_size":5,"bytes_received":5}}`
	if got := string(AppendRequestHeaders(nil, m)); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	// A chunk event's payload is the same object with request_id first.
	c := m.InlineBody
	c.RequestID = 7
	chunk := string(AppendBodyChunk(nil, &c, TypeRequestBodyChunk))
	if inner := want[strings.Index(want, `"inline_body":{`)+len(`"inline_body":{`):]; `{"request_id":7,`+inner[:len(inner)-1] != chunk {
		t.Fatalf("inline object %s differs from chunk %s", inner, chunk)
	}
}

func TestDecodeInlineBodyForms(t *testing.T) {
	tests := []struct {
		name, payload string
		has           bool
		data          string
		last          bool
		total, prog   int64
	}{
		{"absent", `{"request_id":1}`, false, "", false, 0, 0},
		{"null", `{"request_id":1,"inline_body":null}`, false, "", false, 0, 0},
		{"later null wins", `{"inline_body":{"data":"eA=="},"inline_body":null}`, false, "", false, 0, 0},
		{"empty object", `{"inline_body":{}}`, true, "", false, -1, -1},
		{"unpadded, unknown keys", `{"inline_body":{"data":"aGVsbG8","x":[1],"is_last":true}}`, true, "hello", true, -1, -1},
		{"null members", `{"inline_body":{"data":null,"total_size":null,"bytes_received":null}}`, true, "", false, -1, -1},
		{"escaped slash", `{"inline_body":{"data":"\/\/8=","total_size":2,"bytes_received":2}}`, true, "\xff\xff", false, 2, 2},
		{"before the rest", `{"inline_body":{"data":"eA==","is_last":true},"request_id":9,"method":"PUT"}`, true, "x", true, -1, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m RequestHeaders
			if err := m.Decode([]byte(tt.payload)); err != nil {
				t.Fatal(err)
			}
			c := &m.InlineBody
			if m.HasInlineBody != tt.has || string(c.Data) != tt.data || c.IsLast != tt.last || c.TotalSize != tt.total || c.Progress != tt.prog {
				t.Fatalf("got has=%v data=%q last=%v total=%d progress=%d", m.HasInlineBody, c.Data, c.IsLast, c.TotalSize, c.Progress)
			}
			if c.RequestID != 0 {
				t.Fatalf("inline chunk request id %d: the decoder sets none", c.RequestID)
			}
		})
	}
}

func TestDecodeInlineBodyErrors(t *testing.T) {
	tests := []struct {
		payload string
		want    error
		field   string
	}{
		{`{"inline_body":"aGk="}`, ErrProtocolField, "inline_body"},
		{`{"inline_body":[]}`, ErrProtocolField, "inline_body"},
		{`{"inline_body":{"data":"a-b_"}}`, ErrProtocolField, "inline_body.data"},
		{`{"inline_body":{"data":"aGk=\n"}}`, ErrProtocolField, "inline_body.data"},
		{"{\"inline_body\":{\"data\":\"aGk=\n\"}}", ErrProtocolSyntax, ""},
		{`{"inline_body":{"is_last":1}}`, ErrProtocolField, "inline_body.is_last"},
		{`{"inline_body":{"chunk_index":4294967296}}`, ErrProtocolField, "inline_body.chunk_index"},
		{`{"inline_body":{"total_size":-1}}`, ErrProtocolField, "inline_body.total_size"},
		{`{"inline_body":{"data":"aGk="`, ErrProtocolSyntax, ""},
	}
	for _, tt := range tests {
		var m RequestHeaders
		err := m.Decode([]byte(tt.payload))
		if !errors.Is(err, tt.want) {
			t.Errorf("%s: error %v, want %v", tt.payload, err, tt.want)
			continue
		}
		if tt.field != "" && !strings.Contains(err.Error(), tt.field+":") {
			t.Errorf("%s: error %q does not name %s", tt.payload, err, tt.field)
		}
	}
}

// The inline data is decoded in place in the message's own buffer and is
// capped, like a chunk's: the payload passed in is neither kept nor
// modified.
func TestInlineBodyDecodedInPlace(t *testing.T) {
	payload := AppendRequestHeaders(nil, inlineSample(bytes.Repeat([]byte("z"), 1000), true))
	orig := bytes.Clone(payload)
	var m RequestHeaders
	if err := m.Decode(payload); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(payload, orig) {
		t.Fatal("decode modified its input")
	}
	d := m.InlineBody.Data
	if len(d) != 1000 || cap(d) != len(d) {
		t.Fatalf("data len %d cap %d", len(d), cap(d))
	}
	raw := m.raw[:cap(m.raw)]
	inside := false
	for j := range raw {
		if &raw[j] == &d[0] {
			inside = true
			break
		}
	}
	if !inside {
		t.Fatal("inline data does not point into the message's buffer")
	}
}

func TestZeroAllocInlineBody(t *testing.T) {
	payload := AppendRequestHeaders(nil, inlineSample(sampleBodyChunk().Data, true))
	var m RequestHeaders
	dst := make([]byte, 0, 64<<10)
	src := inlineSample(sampleBodyChunk().Data, true)
	t.Run("decode", func(t *testing.T) {
		allocGate(t, func() {
			if err := m.Decode(payload); err != nil {
				panic(err)
			}
		})
	})
	t.Run("encode", func(t *testing.T) { allocGate(t, func() { dst = AppendRequestHeaders(dst[:0], src) }) })
}

func TestCapabilitiesInlineBodyJSON(t *testing.T) {
	resp := &HandshakeResponse{ProtocolVersion: 2, AgentName: "waf", Accepted: true,
		Capabilities: Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true, SupportsInlineBody: true, MaxConcurrentRequests: 4}}
	b := AppendHandshakeResponse(nil, resp)
	if !bytes.Contains(b, []byte(`"supports_cancellation":false,"supports_inline_body":true,"max_concurrent_requests":4`)) {
		t.Fatalf("capabilities written as %s", b)
	}
	var got HandshakeResponse
	if err := DecodeHandshakeResponse(b, &got); err != nil || got != *resp {
		t.Fatalf("read back %+v, %v", got, err)
	}
	// false is omitted, so the canonical form of agents without the
	// feature is unchanged.
	resp.Capabilities.SupportsInlineBody = false
	if b := AppendHandshakeResponse(nil, resp); bytes.Contains(b, []byte("inline")) {
		t.Fatalf("false capability written: %s", b)
	}
}
