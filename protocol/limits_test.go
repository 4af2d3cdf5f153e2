package protocol

import (
	"errors"
	"testing"
)

// TestListEntriesCapped: every decoded list stops at MaxListEntries with a
// field error, before the entry past it is stored.
func TestListEntriesCapped(t *testing.T) {
	op := HeaderOp{Op: HeaderSet, Name: []byte("a"), Value: []byte("b")}
	hdr := Header{Name: []byte("a"), Value: []byte("b")}
	for _, n := range []int{MaxListEntries, MaxListEntries + 1} {
		d := &Decision{RequestID: 1, Kind: DecisionAllow, RequestHeaderOps: make([]HeaderOp, n)}
		for i := range d.RequestHeaderOps {
			d.RequestHeaderOps[i] = op
		}
		rh := &RequestHeaders{RequestID: 1, Method: []byte("GET"), URI: []byte("/"), Headers: make(Headers, n)}
		for i := range rh.Headers {
			rh.Headers[i] = hdr
		}
		tags := &Decision{RequestID: 1, Kind: DecisionAllow, Audit: Audit{Tags: make([][]byte, n)}}
		for i := range tags.Audit.Tags {
			tags.Audit.Tags[i] = []byte("t")
		}
		for _, c := range []struct {
			name   string
			msg    Message
			decode func([]byte) (int, error)
		}{
			{"header ops", d, func(p []byte) (int, error) { var m Decision; err := m.Decode(p); return len(m.RequestHeaderOps), err }},
			{"headers", rh, func(p []byte) (int, error) { var m RequestHeaders; err := m.Decode(p); return len(m.Headers), err }},
			{"audit tags", tags, func(p []byte) (int, error) { var m Decision; err := m.Decode(p); return len(m.Audit.Tags), err }},
		} {
			p, err := c.msg.AppendJSON(nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := c.decode(p)
			switch {
			case n <= MaxListEntries && (err != nil || got != n):
				t.Errorf("%s: %d entries: decoded %d, %v", c.name, n, got, err)
			case n > MaxListEntries && !errors.Is(err, ErrProtocolField) && !errors.Is(err, ErrProtocolDecision):
				t.Errorf("%s: %d entries: %v, want a field error", c.name, n, err)
			}
		}
	}
}
