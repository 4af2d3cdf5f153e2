package dataplane

import (
	"io"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/rawio"
	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// countYields counts the yields of Read for the rest of the test.
func countYields(t *testing.T) *atomic.Int64 {
	var n atomic.Int64
	f := func() { n.Add(1) }
	yieldHook.Store(&f)
	t.Cleanup(func() { yieldHook.Store(nil) })
	return &n
}

// TestReadAfterWriteYields: the read that follows a write on a client
// connection (waiting for the next request after a response) yields once
// before it reads; other reads do not.
func TestReadAfterWriteYields(t *testing.T) {
	yields := countYields(t)
	peer, a := testutil.ConnPair(t, "tcp")
	c := &eofConn{Conn: rawio.Wrap(a)}
	buf := make([]byte, 64)
	exchange := func(send string) {
		t.Helper()
		if _, err := peer.Write([]byte(send)); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf[:len(send)]); err != nil {
			t.Fatal(err)
		}
		if got := string(buf[:len(send)]); got != send {
			t.Fatalf("read %q, want %q", got, send)
		}
	}

	exchange("GET / HTTP/1.1\r\n\r\n")
	if n := yields.Load(); n != 0 {
		t.Fatalf("a first read yielded %d times", n)
	}
	if _, err := c.Write([]byte("HTTP/1.1 200 OK\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(peer, buf[:19]); err != nil {
		t.Fatal(err)
	}
	exchange("GET /2 HTTP/1.1\r\n\r\n")
	if n := yields.Load(); n != 1 {
		t.Fatalf("the read after a write yielded %d times, want 1", n)
	}
	exchange("x")
	if n := yields.Load(); n != 1 {
		t.Fatalf("a second read without a write between yielded: %d yields, want 1", n)
	}
}

// TestTunnelReadsAndWritesAtOnce: a tunnelled client connection is read
// and written by two goroutines at once; the write mark must not race
// (run with -race) and nothing is lost either way.
func TestTunnelReadsAndWritesAtOnce(t *testing.T) {
	peer, a := testutil.ConnPair(t, "tcp")
	c := &eofConn{Conn: rawio.Wrap(a)}
	const n = 2000
	var wg sync.WaitGroup
	wg.Add(4)
	go func() { defer wg.Done(); writeSeq(t, c, n) }() // c → peer
	go func() { defer wg.Done(); readSeq(t, peer, n) }()
	go func() { defer wg.Done(); writeSeq(t, peer, n) }() // peer → c
	go func() { defer wg.Done(); readSeq(t, c, n) }()
	wg.Wait()
}

// writeSeq writes the bytes 0, 1, 2, … (mod 256), n of them, one per Write.
func writeSeq(t *testing.T, w io.Writer, n int) {
	for i := 0; i < n; i++ {
		if _, err := w.Write([]byte{byte(i)}); err != nil {
			t.Error(err)
			return
		}
	}
}

// readSeq reads n bytes and checks they are writeSeq's.
func readSeq(t *testing.T, r io.Reader, n int) {
	got := make([]byte, n)
	if _, err := io.ReadFull(r, got); err != nil {
		t.Error(err)
		return
	}
	for i := range got {
		if got[i] != byte(i) {
			t.Errorf("byte %d: %d", i, got[i])
			return
		}
	}
}
