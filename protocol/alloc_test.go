package protocol

import (
	"testing"
)

// Realistic hot messages, shared by the allocation gates and the benchmarks.

func sampleRequestHeaders() *RequestHeaders {
	return &RequestHeaders{
		RequestID: 123456789,
		TimeoutMs: 1000,
		Method:    bs("POST"),
		URI:       bs("/api/v1/users/42/orders?expand=items&limit=50"),
		HasBody:   true,
		Headers: hdrs(
			"host", "shop.example.com",
			"user-agent", "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36",
			"accept", "application/json",
			"accept-encoding", "gzip, deflate, br",
			"accept-language", "en-US,en;q=0.9",
			"content-type", "application/json; charset=utf-8",
			"content-length", "4096",
			"cookie", "session=3f6c2a9e8b7d4c1a; theme=dark",
			"x-forwarded-for", "203.0.113.7",
			"accept", "text/html",
			"authorization", "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI0MiJ9.c2lnbmF0dXJl",
		),
		Metadata: Metadata{
			CorrelationID: bs("b9e2c0de-7a4f-4c1e-9d2b-5f8a1e3c6b70"),
			ClientIP:      bs("203.0.113.7"),
			ClientPort:    51234,
			Protocol:      bs("HTTP/1.1"),
			ServerName:    bs("shop.example.com"),
			RouteID:       bs("api"),
			UpstreamID:    bs("orders"),
			Traceparent:   bs("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
			Timestamp:     bs("2026-11-21T10:00:00.123Z"),
		},
	}
}

func sampleBodyChunk() *BodyChunk {
	data := make([]byte, 4096)
	for i := range data {
		data[i] = byte(i * 7)
	}
	return &BodyChunk{RequestID: 123456789, TimeoutMs: 1000, ChunkIndex: 3, Data: data, TotalSize: 65536, Progress: 16384}
}

func sampleResponseHeaders() *ResponseHeaders {
	return &ResponseHeaders{
		RequestID:  123456789,
		TimeoutMs:  1000,
		StatusCode: 200,
		HasBody:    true,
		Headers: hdrs(
			"content-type", "application/json",
			"content-length", "1024",
			"cache-control", "no-store",
			"set-cookie", "a=1; Path=/; HttpOnly",
			"set-cookie", "b=2; Path=/; Secure",
			"x-request-id", "b9e2c0de-7a4f-4c1e-9d2b-5f8a1e3c6b70",
		),
	}
}

func sampleDecision() *Decision {
	return &Decision{
		RequestID:    123456789,
		Kind:         DecisionBlock,
		Status:       403,
		Body:         bs(`{"error":"request blocked by policy","rule":"942100"}`),
		BlockHeaders: hdrs("content-type", "application/json", "x-reason", "sqli"),
		RequestHeaderOps: []HeaderOp{
			{Op: HeaderSet, Name: bs("x-user"), Value: bs("42")},
			{Op: HeaderRemove, Name: bs("cookie")},
			{Op: HeaderAdd, Name: bs("x-tag"), Value: bs("suspicious")},
		},
		ResponseHeaderOps: []HeaderOp{{Op: HeaderSet, Name: bs("x-frame-options"), Value: bs("DENY")}},
		Audit: Audit{
			Tags:        [][]byte{bs("sqli"), bs("owasp-crs")},
			RuleIDs:     [][]byte{bs("942100"), bs("942190")},
			Confidence:  0.93,
			HasConf:     true,
			ReasonCodes: [][]byte{bs("SQLI_DETECTED")},
			Custom:      bs(`{"score":12,"matched":"union select"}`),
		},
	}
}

func sampleBodyMutation() *BodyMutation {
	return &BodyMutation{RequestID: 123456789, Phase: PhaseResponse, ChunkIndex: 3, Action: MutationReplace,
		Data: []byte(`{"card":"****-****-****-1234","name":"redacted"}`)}
}

// allocGate fails when f allocates once warmed up.
func allocGate(t *testing.T, f func()) {
	t.Helper()
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	f()
	if n := testing.AllocsPerRun(200, f); n != 0 {
		t.Fatalf("%v allocations per run, want 0", n)
	}
}

func TestZeroAllocEncode(t *testing.T) {
	dst := make([]byte, 0, 64<<10)
	rh, bc, rs, d, bm := sampleRequestHeaders(), sampleBodyChunk(), sampleResponseHeaders(), sampleDecision(), sampleBodyMutation()
	allowMore := &Decision{RequestID: 1, NeedsMore: true, HasRequestBodyMutation: true,
		RequestBodyMutation: BodyMutation{Action: MutationReplace, Data: bs("xyz")}}
	redirect := &Decision{RequestID: 1, Kind: DecisionRedirect, RedirectURL: bs("https://login.example.com/?next=%2F")}
	cr, ca, p := &CancelRequest{RequestID: 1, Reason: bs("client_disconnect")}, &CancelAll{Reason: bs("shutdown")}, &Ping{Sequence: 7, TimestampMs: 1763719200000}
	many := sampleRequestHeaders()
	for i := 0; i < 100; i++ {
		many.Headers = many.Headers.Add([]byte("x-custom-"+string(rune('a'+i%26))), []byte("v"))
	}
	tests := []struct {
		name string
		f    func()
	}{
		{"RequestHeaders", func() { dst = AppendRequestHeaders(dst[:0], rh) }},
		{"RequestHeaders111", func() { dst = AppendRequestHeaders(dst[:0], many) }},
		{"RequestBodyChunk", func() { dst = AppendBodyChunk(dst[:0], bc, TypeRequestBodyChunk) }},
		{"ResponseBodyChunk", func() { dst = AppendBodyChunk(dst[:0], bc, TypeResponseBodyChunk) }},
		{"ResponseHeaders", func() { dst = AppendResponseHeaders(dst[:0], rs) }},
		{"Decision", func() { dst = AppendDecision(dst[:0], d) }},
		{"DecisionAllowNeedsMore", func() { dst = AppendDecision(dst[:0], allowMore) }},
		{"DecisionRedirect", func() { dst = AppendDecision(dst[:0], redirect) }},
		{"BodyMutation", func() { dst = AppendBodyMutation(dst[:0], bm) }},
		{"CancelRequest", func() { dst = AppendCancelRequest(dst[:0], cr) }},
		{"CancelAll", func() { dst = AppendCancelAll(dst[:0], ca) }},
		{"Ping", func() { dst = AppendPing(dst[:0], p) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { allocGate(t, tt.f) })
	}
}

func TestZeroAllocDecode(t *testing.T) {
	var (
		rh RequestHeaders
		bc BodyChunk
		rs ResponseHeaders
		d  Decision
		bm BodyMutation
		cr CancelRequest
		ca CancelAll
		p  Ping
	)
	decode := func(payload []byte, dec func([]byte) error) func() {
		return func() {
			if err := dec(payload); err != nil {
				panic(err)
			}
		}
	}
	liberal := []byte(`{"request_id":1,"decision":{"Block":{"headers":{"X-A":["1","2"]}}},"request_headers":[{"set":{"name":"a","value":"\u00e9"}}],` +
		`"request_body_mutation":{"data":"eHl6"},"audit":{"rule_ids":[942100],"custom":{"a":[1,{"b":null}]}}}`)
	pairs := []byte(`{"request_id":1,"method":"GET","uri":"/\u00e9","headers":[["Host","a"],["X-B","\ud83d\ude00"]]}`)
	tests := []struct {
		name string
		f    func()
	}{
		{"RequestHeaders", decode(AppendRequestHeaders(nil, sampleRequestHeaders()), rh.Decode)},
		{"RequestHeadersPairList", decode(pairs, rh.Decode)},
		{"BodyChunk", decode(AppendBodyChunk(nil, sampleBodyChunk(), TypeRequestBodyChunk), bc.Decode)},
		{"ResponseHeaders", decode(AppendResponseHeaders(nil, sampleResponseHeaders()), rs.Decode)},
		{"Decision", decode(AppendDecision(nil, sampleDecision()), d.Decode)},
		{"DecisionLiberal", decode(liberal, d.Decode)},
		{"BodyMutation", decode(AppendBodyMutation(nil, sampleBodyMutation()), bm.Decode)},
		{"CancelRequest", decode([]byte(`{"request_id":1,"reason":"client_disconnect"}`), cr.Decode)},
		{"CancelAll", decode([]byte(`{"reason":"shutdown"}`), ca.Decode)},
		{"Ping", decode([]byte(`{"sequence":7,"timestamp_ms":1763719200000,"x":"\u0041"}`), p.Decode)},
		{"PeekRequestIDFast", func() { PeekRequestID([]byte(`{"request_id":42,"decision":"allow"}`)) }},
		{"PeekRequestIDSlow", func() { PeekRequestID([]byte(`{"decision":"allow","requ\u0065st_id":42}`)) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { allocGate(t, tt.f) })
	}
}
