package agentmux

import (
	"testing"

	"github.com/zentinelproxy/sidecar/protocol"
)

// finishLink records the request ids Finished is called with.
type finishLink struct {
	nopLink
	finished []uint64
}

func (l *finishLink) Finished(id uint64) { l.finished = append(l.finished, id) }

// TestFinisher: Finish tells a link that keeps per-request state, once
// per exchange, whether or not the exchange was canceled.
func TestFinisher(t *testing.T) {
	l := &finishLink{}
	s := NewSession(l, protocol.Capabilities{HandlesRequestHeaders: true, SupportsCancellation: true}, SessionConfig{Name: "f", MaxInFlight: 4})
	a, err := s.Begin(Wait{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Begin(Wait{})
	if err != nil {
		t.Fatal(err)
	}
	ida, idb := a.RequestID(), b.RequestID()
	b.Cancel("decided")
	a.Finish()
	b.Finish()
	if len(l.finished) != 2 || l.finished[0] != ida || l.finished[1] != idb {
		t.Errorf("Finished with %v, want [%d %d]", l.finished, ida, idb)
	}
}
