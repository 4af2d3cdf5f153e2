package upstream

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/rawio"
	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// TestExtendDeadlines: a cached deadline is kept while it is between 7/8
// of the timeout and all of it from now, and moved otherwise — also when
// it lies further out than the timeout (a long body stream left it there).
func TestExtendDeadlines(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	c := &upConn{Conn: a}
	extendRead(c, time.Minute)
	first := c.readDL
	if d := time.Until(first); d < 59*time.Second || d > time.Minute {
		t.Fatalf("deadline %v from now, want a minute", d)
	}
	extendRead(c, time.Minute)
	if !c.readDL.Equal(first) {
		t.Fatal("a fresh deadline was moved")
	}
	extendRead(c, 10*time.Second) // shorter timeout: the minute is too far
	if d := time.Until(c.readDL); d > 10*time.Second {
		t.Fatalf("deadline %v from now kept for a 10s timeout", d)
	}
	c.readDL = time.Now().Add(time.Second) // mostly spent
	extendRead(c, 10*time.Second)
	if d := time.Until(c.readDL); d < 9*time.Second {
		t.Fatalf("a nearly spent deadline was kept (%v left)", d)
	}
	extendWrite(c, time.Minute)
	w := c.writeDL
	extendWrite(c, time.Minute)
	if !c.writeDL.Equal(w) || time.Until(w) < 59*time.Second {
		t.Fatalf("write deadline %v", time.Until(c.writeDL))
	}
}

// TestBufferedBodyLeavesTheDeadline is the upstream's half of the rule
// (the exchange's reader is the other): the response body's source says
// a rest it already holds needs no deadline, so reading the rest of a
// body in the connection's buffer leaves the deadline alone (the head's
// and the body's timeouts differ, and moving it between them cost two
// deadline changes per request); a body whose rest is still on the wire
// has its deadline pushed to the idle timeout before it is read.
func TestBufferedBodyLeavesTheDeadline(t *testing.T) {
	read := func(t *testing.T, body string, want int64, buffered int) (moved bool) {
		t.Helper()
		peer, a := testutil.ConnPair(t, "tcp")
		uc := &upConn{Conn: rawio.Wrap(a)}
		if _, err := peer.Write([]byte(body[:buffered])); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReaderSize(uc, 64)
		if _, err := br.Peek(buffered); err != nil {
			t.Fatal(err)
		}
		if _, err := peer.Write([]byte(body[buffered:])); err != nil {
			t.Fatal(err)
		}
		dl := time.Now().Add(30 * time.Second)
		if err := uc.SetReadDeadline(dl); err != nil {
			t.Fatal(err)
		}
		c := &call{callState: callState{up: &Upstream{cfg: config.Upstream{IdleTimeout: time.Minute}}, conn: uc, br: br, body: io.LimitReader(br, want)}}
		// What the exchange's reader does before it reads: the deadline
		// is moved only when the source does not hold the rest.
		if !c.Buffered(want) {
			c.ExtendRead()
		}
		p := make([]byte, want)
		if n, err := io.ReadFull(c, p); err != nil || int64(n) != want || string(p) != body[:want] {
			t.Fatalf("read %d bytes %q, %v", n, p[:n], err)
		}
		return !uc.readDL.Equal(dl)
	}
	if read(t, "hello", 5, 5) {
		t.Error("a body already buffered moved the read deadline")
	}
	if !read(t, "hello, world", 12, 5) {
		t.Error("a body still on the wire did not push the read deadline")
	}
}
