package upstream

import (
	"net"
	"testing"
	"time"
)

// TestExtendDeadlines: a cached deadline is kept while it is between 7/8
// of the timeout and all of it from now, and moved otherwise — also when
// it lies further out than the timeout (a long body stream left it there).
func TestExtendDeadlines(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	c := &upConn{Conn: a}
	ExtendRead(c, time.Minute)
	first := c.readDL
	if d := time.Until(first); d < 59*time.Second || d > time.Minute {
		t.Fatalf("deadline %v from now, want a minute", d)
	}
	ExtendRead(c, time.Minute)
	if !c.readDL.Equal(first) {
		t.Fatal("a fresh deadline was moved")
	}
	ExtendRead(c, 10*time.Second) // shorter timeout: the minute is too far
	if d := time.Until(c.readDL); d > 10*time.Second {
		t.Fatalf("deadline %v from now kept for a 10s timeout", d)
	}
	c.readDL = time.Now().Add(time.Second) // mostly spent
	ExtendRead(c, 10*time.Second)
	if d := time.Until(c.readDL); d < 9*time.Second {
		t.Fatalf("a nearly spent deadline was kept (%v left)", d)
	}
	ExtendWrite(c, time.Minute)
	w := c.writeDL
	ExtendWrite(c, time.Minute)
	if !c.writeDL.Equal(w) || time.Until(w) < 59*time.Second {
		t.Fatalf("write deadline %v", time.Until(c.writeDL))
	}
}
