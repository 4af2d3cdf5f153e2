package h2conn

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

const testGuard = 10 * time.Second

// tcpPair is a loopback TCP connection's two ends: s (the server's,
// its reads and writes counted) and c.
func tcpPair(t *testing.T) (*countConn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(); _ = s.Close() })
	_ = c.SetDeadline(time.Now().Add(testGuard))
	_ = s.SetDeadline(time.Now().Add(testGuard))
	return &countConn{Conn: s}, c
}

// countConn counts the reads and writes made on a connection.
type countConn struct {
	net.Conn
	reads, writes atomic.Int64
}

func (c *countConn) Read(p []byte) (int, error)  { c.reads.Add(1); return c.Conn.Read(p) }
func (c *countConn) Write(p []byte) (int, error) { c.writes.Add(1); return c.Conn.Write(p) }

// TestConnReadsBurstAtOnce: frames that arrived together are read from
// the socket together, not two reads per frame as x/net's Framer reads
// them.
func TestConnReadsBurstAtOnce(t *testing.T) {
	s, c := tcpPair(t)
	const n = 10
	var burst bytes.Buffer
	fr := http2.NewFramer(&burst, nil)
	for i := range n {
		if err := fr.WritePing(false, [8]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Write(burst.Bytes()); err != nil {
		t.Fatal(err)
	}
	w, _ := New(s)
	rf := http2.NewFramer(nil, w)
	for i := range n {
		f, err := rf.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if p, ok := f.(*http2.PingFrame); !ok || p.Data[0] != byte(i) {
			t.Fatalf("frame %d: %v", i, f)
		}
	}
	// One read takes the burst; allow a second for a burst split in
	// the socket's receive queue.
	if r := s.reads.Load(); r > 2 {
		t.Errorf("%d frames read in %d reads, want 1 or 2", n, r)
	}
}

// TestConnCoalescesWrites: what is written while the drain has not run
// goes out in one write, in order; and Close sends what is held.
func TestConnCoalescesWrites(t *testing.T) {
	// One P: the drain runs once this goroutine blocks (in the read
	// below), after every write.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	s, c := tcpPair(t)
	w, _ := New(s)
	var want bytes.Buffer
	const n = 8
	for i := range n {
		p := bytes.Repeat([]byte{byte('a' + i)}, 100+i)
		want.Write(p)
		if k, err := w.Write(p); err != nil || k != len(p) {
			t.Fatalf("write %d: %d, %v", i, k, err)
		}
	}
	// And a large write after them, sent directly (but after them).
	big := bytes.Repeat([]byte{'z'}, directWrite)
	want.Write(big)
	if _, err := w.Write(big); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("peer read %d bytes, not the %d written in order", len(got), want.Len())
	}
	if k := s.writes.Load(); k > 2 {
		t.Errorf("%d writes made %d write calls, want 1 or 2", n+1, k)
	}
}

// TestConnStalledPeer: a peer that does not read makes the connection
// hold at most maxPending bytes and one small write (Write waits past
// it, and a large write waits for the held bytes to go out instead of
// joining them), and Close gives up on it, failing the waiting Write.
func TestConnStalledPeer(t *testing.T) {
	s, c := tcpPair(t)
	_ = c.(*net.TCPConn).SetReadBuffer(4 << 10)
	_ = s.Conn.(*net.TCPConn).SetWriteBuffer(4 << 10)
	_ = s.SetWriteDeadline(time.Time{})
	w, _ := New(s)
	small, large := make([]byte, 4<<10), make([]byte, 100<<10)
	failed := make(chan error, 1)
	var most, larges atomic.Int64
	go func() {
		for i := 0; ; i++ {
			p := small
			if i%4 == 3 {
				p = large
			}
			if _, err := w.Write(p); err != nil {
				failed <- err
				return
			}
			if len(p) == len(large) {
				larges.Add(1)
			}
			w.mu.Lock()
			most.Store(max(most.Load(), int64(w.held())))
			w.mu.Unlock()
		}
	}()
	// Wait until the socket is full and the writes stop: a second with
	// no large write done, or the held bytes at their bound.
	deadline := time.Now().Add(testGuard)
	for n, quiet := larges.Load(), 0; quiet < 1000 && most.Load() < maxPending; quiet++ {
		if time.Now().After(deadline) {
			t.Fatal("the writes never stopped")
		}
		time.Sleep(time.Millisecond)
		if m := larges.Load(); m != n {
			n, quiet = m, 0
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- w.Close() }()
	for _, ch := range []chan error{closed, failed} {
		select {
		case <-ch:
		case <-time.After(testGuard):
			t.Fatal("Close or the waiting Write did not return")
		}
	}
	if m := most.Load(); m > maxPending+int64(len(small)) {
		t.Errorf("held %d bytes, bound %d", m, maxPending+len(small))
	}
	if _, err := w.Write(small); err == nil {
		t.Error("Write after Close succeeded")
	}
}

// TestConnWriteTimeout: with SetWriteTimeout, writes to a peer that
// stopped reading fail once the drain sent nothing for that long, though
// Write itself only copies (and the caller's deadlines are ignored).
func TestConnWriteTimeout(t *testing.T) {
	s, c := tcpPair(t)
	_ = c.(*net.TCPConn).SetReadBuffer(4 << 10)
	_ = s.Conn.(*net.TCPConn).SetWriteBuffer(4 << 10)
	_ = s.SetWriteDeadline(time.Time{})
	w, _ := New(s)
	w.SetWriteTimeout(50 * time.Millisecond)
	failed := make(chan error, 1)
	go func() {
		p := make([]byte, 4<<10)
		for {
			// As x/net's client with WriteByteTimeout: a deadline around
			// each Write, which would bound only the copy.
			_ = w.SetWriteDeadline(time.Now().Add(time.Hour))
			_, err := w.Write(p)
			_ = w.SetWriteDeadline(time.Time{})
			if err != nil {
				failed <- err
				return
			}
		}
	}()
	select {
	case err := <-failed:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("write failed with %v, want a deadline error", err)
		}
	case <-time.After(testGuard):
		t.Fatal("writes to a peer that does not read never failed")
	}
}
