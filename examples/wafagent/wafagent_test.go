package wafagent

import (
	"context"
	"testing"

	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

func TestQuery(t *testing.T) {
	h := New()
	tests := []struct {
		uri   string
		block bool
	}{
		{"/search?q=shoes", false},
		{"/search?q=%3Cscript%3Ealert(1)", true},
		{"/search?q=%253Cscript", true},
		{"/login?user=admin'+OR+1=1--", true},
		{"/x?a=%zz%3CScRiPt", true},
		{"/<script", false}, // only the query and body are inspected
	}
	for _, tc := range tests {
		var d protocol.Decision
		m := &protocol.RequestHeaders{RequestID: 1, URI: []byte(tc.uri)}
		if err := h.OnRequestHeaders(context.Background(), m, &d); err != nil {
			t.Fatal(err)
		}
		if got := d.Kind == protocol.DecisionBlock; got != tc.block {
			t.Errorf("%s: block = %v, want %v", tc.uri, got, tc.block)
		}
	}
}

func TestBodySplitPattern(t *testing.T) {
	h := New()
	chunks := []string{"name=x&comment=hello+%3Csc", "ript%3Ealert(1)", ""}
	for i, c := range chunks {
		var r sdk.BodyReply
		m := &protocol.BodyChunk{RequestID: 9, ChunkIndex: uint32(i), Data: []byte(c), IsLast: i == len(chunks)-1}
		if err := h.OnRequestBody(context.Background(), m, &r); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			if !r.Decision.NeedsMore {
				t.Fatal("first chunk: want needs_more")
			}
			continue
		}
		if r.Decision.Kind != protocol.DecisionBlock {
			t.Fatalf("chunk %d: kind %v, want block", i, r.Decision.Kind)
		}
		if string(r.Decision.Audit.RuleIDs[0]) != "xss-1" {
			t.Fatalf("rule %q", r.Decision.Audit.RuleIDs[0])
		}
		break
	}
	if len(h.bodies) != 0 {
		t.Fatal("body state left behind")
	}
}
