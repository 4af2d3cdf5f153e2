package agentmux

import (
	"errors"
	"testing"

	"github.com/zentinelproxy/sidecar/protocol"
)

func memberPool(name string, limit, queue int) (*Pool, *Session) {
	p := NewPool(name, "test")
	s := NewSession(&nopLink{}, protocol.Capabilities{HandlesRequestHeaders: true}, SessionConfig{Name: name, MaxInFlight: limit, MaxQueue: queue})
	p.Add(s)
	return p, s
}

// Members take new exchanges in turn; one without a live connection is
// passed over; an overloaded one hands the exchange to the next (counted)
// unless failover is off.
func TestMultiBegin(t *testing.T) {
	a, sa := memberPool("a", 1, 0)
	b, sb := memberPool("b", 10, 0)
	m := NewMulti("pair", "test", []Agent{a, b}, true)
	if gen := m.Generation(); gen != 2 {
		t.Fatalf("generation %d, want 2 (one session each)", gen)
	}
	e1, err := m.Begin(Wait{})
	if err != nil || e1.s != sa {
		t.Fatalf("first exchange on %v (%v), want a", e1, err)
	}
	e2, err := m.Begin(Wait{})
	if err != nil || e2.s != sb {
		t.Fatalf("second exchange not on b (%v)", err)
	}
	// a is full (limit 1, no queue): its turn goes to b.
	e3, err := m.Begin(Wait{})
	if err != nil || e3.s != sb || m.Failovers() != 1 {
		t.Fatalf("overloaded a: exchange on b %v, failovers %d (%v)", e3 != nil && e3.s == sb, m.Failovers(), err)
	}
	if st := m.Snapshot(); !st.Ready || st.Connections != 2 || st.InFlight != 3 {
		t.Fatalf("snapshot %+v", st)
	}
	for _, e := range []*Exchange{e1, e2, e3} {
		e.Finish()
	}
	// a's connection dies: b takes every exchange, without a failover.
	sa.Fail(errors.New("gone"))
	a.Remove(sa)
	for i := 0; i < 3; i++ {
		e, err := m.Begin(Wait{})
		if err != nil || e.s != sb {
			t.Fatalf("a down: %v", err)
		}
		e.Finish()
	}
	if m.Failovers() != 1 {
		t.Fatalf("failovers %d, want still 1", m.Failovers())
	}
	// Without failover an overloaded member's error is the answer.
	c, _ := memberPool("c", 1, 0)
	d, _ := memberPool("d", 1, 0)
	off := NewMulti("pair", "test", []Agent{c, d}, false)
	ec, err := off.Begin(Wait{})
	if err != nil {
		t.Fatal(err)
	}
	ed, err := off.Begin(Wait{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := off.Begin(Wait{}); !errors.Is(err, ErrAgentOverloaded) || off.Failovers() != 0 {
		t.Fatalf("failover off: %v, failovers %d", err, off.Failovers())
	}
	ec.Finish()
	ed.Finish()
	// No live member: the error says unavailable.
	e := NewMulti("none", "test", []Agent{NewPool("x", "test"), NewPool("y", "test")}, true)
	if _, err := e.Begin(Wait{}); !errors.Is(err, ErrAgentUnavailable) {
		t.Fatalf("no member: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}
