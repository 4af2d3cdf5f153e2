package protocol

import (
	"errors"
	"strings"
	"testing"
)

// TestNormalize: each schema rule, on decisions as a decoder leaves them.
func TestNormalize(t *testing.T) {
	mut := func(id uint64, p Phase) BodyMutation {
		return BodyMutation{RequestID: id, Phase: p, ChunkIndex: 4, Action: MutationReplace, Data: bs("x")}
	}
	tests := []struct {
		name    string
		in      Decision
		want    Decision // when err is nil
		err     error
		errText string
	}{
		{name: "allow as it is", in: Decision{RequestID: 1}, want: Decision{RequestID: 1}},
		{name: "allow keeps the needs_more flag",
			in: Decision{Kind: DecisionAllow, NeedsMore: true}, want: Decision{Kind: DecisionAllow, NeedsMore: true}},
		{name: "needs_more verdict sets NeedsMore",
			in: Decision{Kind: DecisionNeedsMore}, want: Decision{Kind: DecisionNeedsMore, NeedsMore: true}},
		{name: "block status 0 is 403",
			in: Decision{Kind: DecisionBlock}, want: Decision{Kind: DecisionBlock, Status: 403}},
		{name: "block status kept",
			in: Decision{Kind: DecisionBlock, Status: 451}, want: Decision{Kind: DecisionBlock, Status: 451}},
		{name: "block status out of the policy's range is not schema",
			in: Decision{Kind: DecisionBlock, Status: 99}, want: Decision{Kind: DecisionBlock, Status: 99}},
		{name: "block is final",
			in: Decision{Kind: DecisionBlock, Status: 429, NeedsMore: true}, want: Decision{Kind: DecisionBlock, Status: 429}},
		{name: "redirect status 0 is 302",
			in:   Decision{Kind: DecisionRedirect, RedirectURL: bs("/login")},
			want: Decision{Kind: DecisionRedirect, Status: 302, RedirectURL: bs("/login")}},
		{name: "redirect status kept, and final",
			in:   Decision{Kind: DecisionRedirect, Status: 307, RedirectURL: bs("/x"), NeedsMore: true},
			want: Decision{Kind: DecisionRedirect, Status: 307, RedirectURL: bs("/x")}},
		{name: "redirect without url", in: Decision{Kind: DecisionRedirect, Status: 301},
			err: ErrProtocolDecision, errText: "redirect without url"},
		{name: "redirect with an empty url", in: Decision{Kind: DecisionRedirect, RedirectURL: []byte{}},
			err: ErrProtocolDecision, errText: "redirect without url"},
		{name: "no verdict", in: Decision{RequestID: 5, Kind: DecisionUnset},
			err: ErrProtocolDecision, errText: "no verdict"},
		{name: "unknown kind", in: Decision{Kind: DecisionKind(9)},
			err: ErrProtocolDecision, errText: "unknown decision kind"},
		{name: "remove carries no value",
			in: Decision{RequestHeaderOps: []HeaderOp{
				{Op: HeaderSet, Name: bs("a"), Value: bs("1")}, {Op: HeaderRemove, Name: bs("b"), Value: bs("2")}}},
			want: Decision{RequestHeaderOps: []HeaderOp{{Op: HeaderSet, Name: bs("a"), Value: bs("1")}, {Op: HeaderRemove, Name: bs("b")}}}},
		{name: "set with an empty value is fine",
			in:   Decision{ResponseHeaderOps: []HeaderOp{{Op: HeaderAdd, Name: bs("a"), Value: []byte{}}}},
			want: Decision{ResponseHeaderOps: []HeaderOp{{Op: HeaderAdd, Name: bs("a")}}}},
		{name: "request op without operation", in: Decision{RequestHeaderOps: []HeaderOp{{Op: HeaderOpUnset, Name: bs("a")}}},
			err: ErrProtocolField, errText: "request_headers: missing header operation"},
		{name: "response op without operation", in: Decision{ResponseHeaderOps: []HeaderOp{{Op: HeaderOpUnset, Name: bs("a")}}},
			err: ErrProtocolField, errText: "response_headers: missing header operation"},
		{name: "unknown op", in: Decision{RequestHeaderOps: []HeaderOp{{Op: HeaderOpKind(7), Name: bs("a")}}},
			err: ErrProtocolField, errText: "request_headers: unknown header operation"},
		{name: "op without name", in: Decision{RequestHeaderOps: []HeaderOp{{Op: HeaderSet, Value: bs("1")}}},
			err: ErrProtocolField, errText: "request_headers: header operation without a name"},
		{name: "remove with an empty name", in: Decision{ResponseHeaderOps: []HeaderOp{{Op: HeaderRemove, Name: []byte{}}}},
			err: ErrProtocolField, errText: "response_headers: header operation without a name"},
		{name: "ops checked with a block too",
			in:  Decision{Kind: DecisionBlock, ResponseHeaderOps: []HeaderOp{{Op: HeaderSet, Name: bs("ok")}, {Op: HeaderSet}}},
			err: ErrProtocolField, errText: "response_headers"},
		{name: "embedded mutations take their slot's phase and the decision's id",
			in: Decision{RequestID: 8,
				HasRequestBodyMutation: true, RequestBodyMutation: mut(0, PhaseResponse),
				HasResponseBodyMutation: true, ResponseBodyMutation: mut(3, PhaseRequest)},
			want: Decision{RequestID: 8,
				HasRequestBodyMutation: true, RequestBodyMutation: mut(8, PhaseRequest),
				HasResponseBodyMutation: true, ResponseBodyMutation: mut(8, PhaseResponse)}},
		{name: "absent mutations are left alone",
			in:   Decision{RequestID: 8, RequestBodyMutation: mut(0, PhaseResponse)},
			want: Decision{RequestID: 8, RequestBodyMutation: mut(0, PhaseResponse)}},
	}
	sentinels := []error{ErrProtocolSyntax, ErrProtocolField, ErrProtocolDecision}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := tt.in
			err := d.Normalize()
			if tt.err != nil {
				if !errors.Is(err, tt.err) || !strings.Contains(err.Error(), tt.errText) {
					t.Fatalf("err = %v, want %v with %q", err, tt.err, tt.errText)
				}
				for _, s := range sentinels {
					if s != tt.err && errors.Is(err, s) {
						t.Fatalf("%v also wraps %v", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if show(&d) != show(&tt.want) {
				t.Fatalf("\n got: %s\nwant: %s", show(&d), show(&tt.want))
			}
			if err := d.Normalize(); err != nil || show(&d) != show(&tt.want) {
				t.Fatalf("not idempotent: %v %s", err, show(&d))
			}
		})
	}
}

// TestNormalizeRejects: payloads that are well-formed JSON decisions but
// break the schema. The decoder accepts them (it is syntactic); Normalize
// refuses them, with the sentinel the read path has always reported.
func TestNormalizeRejects(t *testing.T) {
	tests := []struct {
		name, in string
		want     error
	}{
		{"missing decision", `{"request_id":1}`, ErrProtocolDecision},
		{"null decision", `{"request_id":1,"decision":null}`, ErrProtocolDecision},
		{"empty decision object", `{"decision":{}}`, ErrProtocolDecision},
		{"a later null decision replaces an earlier one", `{"decision":"allow","decision":null}`, ErrProtocolDecision},
		{"redirect name only", `{"decision":"redirect"}`, ErrProtocolDecision},
		{"redirect without url", `{"decision":{"redirect":{"status":301}}}`, ErrProtocolDecision},
		{"redirect null", `{"decision":{"redirect":null}}`, ErrProtocolDecision},
		{"redirect empty url", `{"decision":{"redirect":{"url":""}}}`, ErrProtocolDecision},
		{"redirect null url", `{"decision":{"Redirect":{"url":null,"status":302}}}`, ErrProtocolDecision},
		{"op missing", `{"decision":"allow","request_headers":[{"name":"a","value":"b"}]}`, ErrProtocolField},
		{"op null", `{"decision":"allow","request_headers":[{"operation":null,"name":"a"}]}`, ErrProtocolField},
		{"op without name", `{"decision":"allow","request_headers":[{"operation":"set","value":"b"}]}`, ErrProtocolField},
		{"op with an empty name", `{"decision":"allow","response_headers":[{"op":"add","name":"","value":"b"}]}`, ErrProtocolField},
		{"tagged op without name", `{"decision":"allow","response_headers":[{"set":{"value":"b"}}]}`, ErrProtocolField},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d Decision
			if err := d.Decode([]byte(tt.in)); err != nil {
				t.Fatalf("decode: %v (the decoder must leave this to Normalize)", err)
			}
			err := d.Normalize()
			if !errors.Is(err, tt.want) {
				t.Fatalf("Normalize: %v, want %v", err, tt.want)
			}
		})
	}
}

// TestDecodeIsSyntactic: the JSON decoder keeps what the payload says and
// applies none of the schema's defaults.
func TestDecodeIsSyntactic(t *testing.T) {
	var d Decision
	in := `{"request_id":4,"decision":{"block":{"status":0}},"needs_more":true,` +
		`"request_headers":[{"operation":"remove","name":"a","value":"v"},{"name":"b"}],` +
		`"response_body_mutation":{"phase":"request","request_id":9,"data":""}}`
	if err := d.Decode([]byte(in)); err != nil {
		t.Fatal(err)
	}
	want := Decision{RequestID: 4, Kind: DecisionBlock, NeedsMore: true,
		RequestHeaderOps:        []HeaderOp{{Op: HeaderRemove, Name: bs("a"), Value: bs("v")}, {Op: HeaderOpUnset, Name: bs("b")}},
		HasResponseBodyMutation: true, ResponseBodyMutation: BodyMutation{RequestID: 9, Phase: PhaseRequest, Action: MutationDrop}}
	if show(&d) != show(&want) {
		t.Fatalf("decoded\n got: %s\nwant: %s", show(&d), show(&want))
	}
	for in, kind := range map[string]DecisionKind{
		`{}`:                             DecisionUnset,
		`{"decision":"redirect"}`:        DecisionRedirect,
		`{"decision":{"needs_more":{}}}`: DecisionNeedsMore,
	} {
		if err := d.Decode([]byte(in)); err != nil || d.Kind != kind || d.Status != 0 || d.NeedsMore {
			t.Fatalf("%s: kind %s status %d needs_more %v err %v", in, d.Kind, d.Status, d.NeedsMore, err)
		}
	}
}

func TestNormalizeDoesNotAllocate(t *testing.T) {
	var d Decision
	ok := AppendDecision(nil, sampleDecision())
	bad := []byte(`{"request_id":1,"decision":"allow","request_headers":[{"operation":"set","value":"x"}]}`)
	allocGate(t, func() {
		if d.Decode(ok) != nil || d.Normalize() != nil {
			panic("sample decision refused")
		}
	})
	allocGate(t, func() {
		if d.Decode(bad) != nil || d.Normalize() == nil {
			panic("bad decision accepted")
		}
	})
}

// BenchmarkDecodeNormalizeDecision is BenchmarkDecodeDecision plus the
// Normalize every receiver runs: the cost of the schema.
func BenchmarkDecodeNormalizeDecision(b *testing.B) {
	var m Decision
	benchDecode(b, AppendDecision(nil, sampleDecision()), func(p []byte) error {
		if err := m.Decode(p); err != nil {
			return err
		}
		return m.Normalize()
	})
}
