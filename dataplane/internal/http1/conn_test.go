package http1

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/rawio"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/yield"
)

// countYields counts the yields of c's Reads for the rest of the test
// (other connections, still read by other tests' servers, yield as usual).
func countYields(t *testing.T, c *eofConn) *atomic.Int64 {
	var n atomic.Int64
	yield.SetHook(func(owner any) bool {
		if owner != c {
			return false
		}
		n.Add(1)
		return true
	})
	t.Cleanup(func() { yield.SetHook(nil) })
	return &n
}

// TestReadAfterWriteYields: the read that follows a write on a client
// connection (waiting for the next request after a response) yields once
// before it reads; other reads do not.
func TestReadAfterWriteYields(t *testing.T) {
	peer, a := testutil.ConnPair(t, "tcp")
	rc := rawio.Wrap(a)
	c := newEOFConn(rc, rc, 0)
	yields := countYields(t, c)
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

// TestReadAfterWriteStopsYieldingWhenItDoesNotPay: on a real socket, reads
// after a write whose request arrives only later (so they wait in the
// poller) stop yielding; a read whose request is already there counts as
// a yield that paid.
func TestReadAfterWriteStopsYieldingWhenItDoesNotPay(t *testing.T) {
	peer, a := testutil.ConnPair(t, "tcp")
	rc := rawio.Wrap(a)
	c := newEOFConn(rc, rc, 0)
	rw := rc.(*rawio.Conn)
	yields := countYields(t, c)
	buf := make([]byte, 64)
	var ref yield.Policy // fed what the connection saw
	refYields := 0
	round := func(late bool) {
		t.Helper()
		if _, err := c.Write([]byte("HTTP/1.1 200 OK\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(peer, buf[:19]); err != nil {
			t.Fatal(err)
		}
		req := []byte("GET / HTTP/1.1\r\n\r\n")
		done := make(chan error, 1)
		if late {
			go func() {
				time.Sleep(30 * time.Millisecond)
				_, err := peer.Write(req)
				done <- err
			}()
		} else {
			_, err := peer.Write(req)
			done <- err
			testutil.WaitFor(t, "the request readable", func() bool { return testutil.HasBytes(t, rw) })
		}
		y0, w0 := yields.Load(), rw.Waits()
		if _, err := io.ReadFull(c, buf[:len(req)]); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if ref.Before() {
			refYields++
			ref.After(rw.Waits() == w0)
		}
		if got := yields.Load() - y0; got != 0 && got != 1 {
			t.Fatalf("one read yielded %d times", got)
		}
	}
	const late = 40
	for i := 0; i < late; i++ {
		round(true)
	}
	if got := int(yields.Load()); got != refYields {
		t.Fatalf("%d yields, want %d (the policy fed the reads' waits)", got, refYields)
	}
	if refYields >= late {
		t.Fatalf("all %d reads whose request came late yielded", late)
	}
	// Requests already there: within one probe period it yields again,
	// and from then on every time.
	for i := 0; i < yield.ProbeEvery; i++ {
		round(false)
	}
	y0 := yields.Load()
	for i := 0; i < 10; i++ {
		round(false)
	}
	if got := yields.Load() - y0; got != 10 {
		t.Fatalf("requests already there: %d of 10 reads yielded", got)
	}
	if got := int(yields.Load()); got != refYields {
		t.Fatalf("%d yields in all, want %d (the policy fed the reads' waits)", got, refYields)
	}
}

// TestTunnelReadsAndWritesAtOnce: a tunnelled client connection is read
// and written by two goroutines at once; the write mark must not race
// (run with -race) and nothing is lost either way.
func TestTunnelReadsAndWritesAtOnce(t *testing.T) {
	peer, a := testutil.ConnPair(t, "tcp")
	rc := rawio.Wrap(a)
	c := newEOFConn(rc, rc, 0)
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

// TestClientAddrText: the client address prepareRequest forwards, worked
// out once per connection: IPv4-mapped addresses as IPv4, nothing for a
// peer that is not TCP, and a slice an append cannot write through.
func TestClientAddrText(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		ip   string
		port int
	}{
		{&net.TCPAddr{IP: net.ParseIP("192.0.2.7"), Port: 4321}, "192.0.2.7", 4321},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.8"), Port: 1}, "192.0.2.8", 1},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8::1"), Port: 443}, "2001:db8::1", 443},
		{&net.UnixAddr{Name: "/run/x.sock", Net: "unix"}, "", 0},
	} {
		ip, port := tcpAddrText(make([]byte, 0, 64), tc.addr)
		if string(ip) != tc.ip || port != tc.port {
			t.Errorf("%v: got %q port %d, want %q port %d", tc.addr, ip, port, tc.ip, tc.port)
		}
		if tc.ip == "" && ip != nil {
			t.Errorf("%v: got %q, want nil", tc.addr, ip)
		}
		if cap(ip) != len(ip) {
			t.Errorf("%v: capacity %d beyond length %d", tc.addr, cap(ip), len(ip))
		}
	}
	peer, a := testutil.ConnPair(t, "tcp")
	rc := rawio.Wrap(a)
	c := newEOFConn(rc, rc, 0)
	want := peer.LocalAddr().(*net.TCPAddr)
	for i := 0; i < 2; i++ {
		ip, port := c.clientAddr()
		if string(ip) != want.IP.String() || port != want.Port {
			t.Fatalf("call %d: %q port %d, want %v", i, ip, port, want)
		}
	}
}

// TestTLSConnCountsWaits: a TLS listener's connection reads through a
// rawio socket too, so that its yield is kept only while it pays, and the
// disconnect check still reaches the socket.
func TestTLSConnCountsWaits(t *testing.T) {
	l := &eofListener{tls: &listenerTLS{base: &tls.Config{}}}
	_, a := testutil.ConnPair(t, "tcp")
	c := l.wrapTLS(a)
	if c.rw == nil || c.tls == nil {
		t.Fatalf("TLS connection without its counted socket (rw %v) or TLS state", c.rw)
	}
	if _, err := c.SyscallConn(); err != nil {
		t.Fatalf("SyscallConn: %v", err)
	}
}

// TestPeekIgnoresReadDeadline: a client connection whose header-read
// deadline has passed is still connected; the disconnect check must say
// so (it said "gone" and cut slow responses off at read_timeout).
func TestPeekIgnoresReadDeadline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	_ = server.SetReadDeadline(time.Now().Add(-time.Second))
	if peekClosed(server) {
		t.Fatal("a connected client with an expired read deadline was taken for gone")
	}
	client.Close()
	deadline := time.Now().Add(10 * time.Second)
	for !peekClosed(server) {
		if time.Now().After(deadline) {
			t.Fatal("a closed client was not noticed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// flakyListener fails Accept with an error n times before passing on.
type flakyListener struct {
	net.Listener
	fails atomic.Int32
	err   error
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, l.err
	}
	return l.Listener.Accept()
}

// TestAcceptBacksOffOnExhaustion: EMFILE and friends are waited out, not
// taken for a dead listener; a closed listener still ends Accept.
func TestAcceptBacksOffOnExhaustion(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	var st Counters
	fl := &flakyListener{Listener: inner, err: &net.OpError{Op: "accept", Err: syscall.EMFILE}}
	fl.fails.Store(4)
	ln := &eofListener{Listener: fl, log: zerolog.New(&logs), stats: &st}
	go func() {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err == nil {
			defer c.Close()
			time.Sleep(time.Second)
		}
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatalf("accept gave up on EMFILE: %v", err)
	}
	c.Close()
	if n := st.acceptErrors.Load(); n != 4 {
		t.Errorf("accept errors counted %d, want 4", n)
	}
	if n := strings.Count(logs.String(), "accept failed"); n != 1 {
		t.Errorf("%d log lines for 4 failures, want 1 (rate-limited)", n)
	}
	_ = ln.Close()
	if _, err := ln.Accept(); err == nil {
		t.Fatal("accept on a closed listener succeeded")
	}
	// A permanent error is returned at once.
	fl2 := &flakyListener{Listener: inner, err: &net.OpError{Op: "accept", Err: syscall.EINVAL}}
	fl2.fails.Store(1)
	if _, err := (&eofListener{Listener: fl2, log: zerolog.Nop(), stats: &st}).Accept(); err == nil {
		t.Fatal("EINVAL retried")
	}
}

// TestRequestLineTooLong: the 414/431 tell-apart.
func TestRequestLineTooLong(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	c := &eofConn{Conn: a, hdrBuf: 16}
	go func() {
		_, _ = b.Write([]byte("GET /aaaaaaaaaaaaaaaaaaaaaaaaaaa"))
		_, _ = b.Write([]byte("GET / HTTP/1.1\r\nX: aaaaaaaaaaaaaaaaaaaaaaaa"))
	}()
	buf := make([]byte, 16)
	for n := 0; n < 32; {
		m, _ := c.Read(buf)
		n += m
	}
	if !c.requestLineTooLong() {
		t.Error("32 bytes without a line feed: not too long")
	}
	for n := 0; n < 16; {
		m, _ := c.Read(buf)
		n += m
	}
	if c.requestLineTooLong() {
		t.Error("a line feed was read: the request line ended")
	}
}
