package protocol

import (
	"bytes"
	"testing"
)

// TestEventTimeout: timeout_ms follows request_id in each event that an
// agent answers, is omitted when 0 (unknown), reads back (null as 0), and
// is never written inside an inline body, where a decoder ignores it.
func TestEventTimeout(t *testing.T) {
	rh := &RequestHeaders{RequestID: 3, TimeoutMs: 1000, Method: bs("POST"), URI: bs("/"), HasBody: true,
		HasInlineBody: true, InlineBody: BodyChunk{TimeoutMs: 77, Data: bs("hi"), IsLast: true, TotalSize: -1, Progress: -1}}
	chunk := &BodyChunk{RequestID: 3, TimeoutMs: 999, ChunkIndex: 1, Data: bs("hi"), TotalSize: -1, Progress: -1}
	resp := &ResponseHeaders{RequestID: 3, TimeoutMs: 250, StatusCode: 200}
	for _, c := range []struct {
		name string
		got  []byte
		want string
	}{
		{"request headers", AppendRequestHeaders(nil, rh),
			`{"request_id":3,"timeout_ms":1000,"method":"POST","uri":"/","has_body":true,"headers":{},"metadata":{},"inline_body":{"chunk_index":0,"data":"aGk=","is_last":true}}`},
		{"request body chunk", AppendBodyChunk(nil, chunk, TypeRequestBodyChunk),
			`{"request_id":3,"timeout_ms":999,"chunk_index":1,"data":"aGk=","is_last":false}`},
		{"response body chunk", AppendBodyChunk(nil, chunk, TypeResponseBodyChunk),
			`{"request_id":3,"timeout_ms":999,"chunk_index":1,"data":"aGk=","is_last":false}`},
		{"response headers", AppendResponseHeaders(nil, resp),
			`{"request_id":3,"timeout_ms":250,"status_code":200,"headers":{},"has_body":false}`},
		{"unknown", AppendResponseHeaders(nil, &ResponseHeaders{RequestID: 3, StatusCode: 200}),
			`{"request_id":3,"status_code":200,"headers":{},"has_body":false}`},
	} {
		if string(c.got) != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, c.got, c.want)
		}
	}

	var m RequestHeaders
	in := `{"timeout_ms":null,"request_id":5,"inline_body":{"timeout_ms":12,"data":""},"timeout_ms":42}`
	if err := m.Decode([]byte(in)); err != nil {
		t.Fatal(err)
	}
	if m.TimeoutMs != 42 || !m.HasInlineBody || m.InlineBody.TimeoutMs != 0 {
		t.Fatalf("decoded timeout %d, inline %v with timeout %d; want 42, true, 0", m.TimeoutMs, m.HasInlineBody, m.InlineBody.TimeoutMs)
	}
	if err := m.Decode([]byte(`{"request_id":5,"timeout_ms":null}`)); err != nil || m.TimeoutMs != 0 {
		t.Fatalf("null timeout_ms: %d, %v; want 0", m.TimeoutMs, err)
	}
	var c BodyChunk
	if err := c.Decode([]byte(`{"request_id":5,"timeout_ms":4294967295}`)); err != nil || c.TimeoutMs != 4294967295 {
		t.Fatalf("largest timeout_ms: %d, %v", c.TimeoutMs, err)
	}
	var r ResponseHeaders
	if err := r.Decode(AppendResponseHeaders(nil, resp)); err != nil || r.TimeoutMs != 250 {
		t.Fatalf("response headers timeout_ms: %d, %v", r.TimeoutMs, err)
	}
	// The fast path of PeekRequestID still finds the id before it.
	if id, ok := PeekRequestID(AppendRequestHeaders(nil, rh)); !ok || id != 3 {
		t.Fatalf("PeekRequestID = %d, %v", id, ok)
	}
	if bytes.Contains(AppendRequestHeaders(nil, rh), []byte(`"timeout_ms":77`)) {
		t.Fatal("inline body's timeout written")
	}
}
