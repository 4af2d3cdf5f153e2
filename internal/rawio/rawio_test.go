package rawio_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/rawio"
	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// tcpPair returns a wrapped client connection and the server's end of
// it, on loopback.
func tcpPair(t testing.TB) (*rawio.Conn, net.Conn) {
	t.Helper()
	c, s := testutil.ConnPair(t, "tcp")
	rc, ok := rawio.Wrap(c).(*rawio.Conn)
	if !ok {
		t.Fatalf("Wrap(%T) did not wrap a TCP connection", c)
	}
	return rc, s
}

func TestReadWriteAndEOF(t *testing.T) {
	c, s := tcpPair(t)
	if n, err := c.Write([]byte("ping")); n != 4 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	buf := make([]byte, 16)
	if _, err := io.ReadFull(s, buf[:4]); err != nil || string(buf[:4]) != "ping" {
		t.Fatalf("peer read %q, %v", buf[:4], err)
	}
	// The read waits for data through the poller: the peer writes later.
	go func() {
		time.Sleep(20 * time.Millisecond)
		_, _ = s.Write([]byte("pong"))
		_ = s.Close()
	}()
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "pong" {
		t.Fatalf("Read = %q, %v", buf[:n], err)
	}
	if n, err := c.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("Read at the peer's FIN = %d, %v; want 0, io.EOF", n, err)
	}
	if n, err := c.Read(nil); n != 0 || err != nil {
		t.Fatalf("Read(nil) = %d, %v", n, err)
	}
}

func TestReadDeadline(t *testing.T) {
	c, _ := tcpPair(t)
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	_, err := c.Read(make([]byte, 8))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past the deadline = %v; want a timeout", err)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "read" {
		t.Fatalf("error %v: want a net.OpError for a read", err)
	}
	// Write deadlines reach the poller the same way.
	_ = c.SetReadDeadline(time.Time{})
	_ = c.SetWriteDeadline(time.Now().Add(-time.Second))
	if _, err := c.Write([]byte("x")); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Write past the deadline = %v; want a timeout", err)
	}
}

// TestWriteWaitsForRoom writes far more than the socket buffers hold to a
// peer that reads slowly: every byte arrives, in order.
func TestWriteWaitsForRoom(t *testing.T) {
	c, s := tcpPair(t)
	payload := bytes.Repeat([]byte("0123456789abcdef"), 1<<19) // 8 MiB
	want := sha256.Sum256(payload)
	got := make(chan [32]byte, 1)
	go func() {
		h := sha256.New()
		buf := make([]byte, 64<<10)
		for {
			n, err := s.Read(buf)
			h.Write(buf[:n])
			if err != nil {
				break
			}
			time.Sleep(100 * time.Microsecond) // keep the sender waiting for room
		}
		var sum [32]byte
		copy(sum[:], h.Sum(nil))
		got <- sum
	}()
	n, err := c.Write(payload)
	if n != len(payload) || err != nil {
		t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(payload))
	}
	_ = c.Close()
	if sum := <-got; sum != want {
		t.Fatal("the peer received different bytes")
	}
}

func TestReadWriteConcurrently(t *testing.T) {
	c, s := tcpPair(t)
	go func() { _, _ = io.Copy(s, s) }() // echo
	const rounds = 2000
	msg := []byte("0123456789")
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range rounds {
			if _, err := c.Write(msg); err != nil {
				t.Errorf("Write: %v", err)
				return
			}
		}
	}()
	buf := make([]byte, rounds*len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("read back: %v", err)
	}
	wg.Wait()
	if !bytes.Equal(buf, bytes.Repeat(msg, rounds)) {
		t.Fatal("echoed bytes differ")
	}
}

func TestErrorsOfAClosedOrResetConnection(t *testing.T) {
	c, s := tcpPair(t)
	// The peer resets: SO_LINGER 0 then close.
	_ = s.(*net.TCPConn).SetLinger(0)
	_ = s.Close()
	buf := make([]byte, 8)
	var err error
	for range 100 { // until the RST has arrived
		if _, err = c.Read(buf); err != nil {
			break
		}
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("Read after the peer's reset = %v; want ECONNRESET", err)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "read" {
		t.Fatalf("error %v: want a net.OpError for a read", err)
	}
	_ = c.Close()
	if _, err := c.Read(buf); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Read after Close = %v; want net.ErrClosed", err)
	}
	if _, err := c.Write(buf); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close = %v; want net.ErrClosed", err)
	}
}

func TestWrapUnixAndOthers(t *testing.T) {
	uc, srv := testutil.ConnPair(t, "unix")
	_, _ = srv.Write([]byte("hello"))
	srv.Close()
	c := rawio.Wrap(uc)
	if _, ok := c.(*rawio.Conn); !ok {
		t.Fatalf("Wrap(%T) did not wrap a Unix socket", uc)
	}
	if _, ok := c.(syscall.Conn); !ok {
		t.Fatal("a wrapped connection must still expose its socket")
	}
	b, err := io.ReadAll(c)
	if err != nil || string(b) != "hello" {
		t.Fatalf("ReadAll = %q, %v", b, err)
	}

	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	if rawio.Wrap(p1) != p1 {
		t.Fatal("Wrap must leave a connection without a socket as it is")
	}
}

// TestSocketOrdersMemory: what a goroutine wrote before sending bytes is
// visible to the goroutine that received them. The kernel guarantees it;
// under -race this test also checks that the detector is told so (a
// proxy and an agent in one test process talk exactly like this).
func TestSocketOrdersMemory(t *testing.T) {
	c, s := tcpPair(t)
	peer := rawio.Wrap(s)
	var shared [64]int
	go func() {
		for i := range shared {
			shared[i] = i + 1
		}
		_, _ = c.Write([]byte{1})
	}()
	if _, err := io.ReadFull(peer, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	for i, v := range shared {
		if v != i+1 {
			t.Fatalf("shared[%d] = %d after the byte arrived", i, v)
		}
	}
}

// TestHeldWriteGoesOutWithTheRead: after HoldWrites, the request stays
// in the connection until the Read, which sends it and returns the
// answer; the connection then behaves as before.
func TestHeldWriteGoesOutWithTheRead(t *testing.T) {
	c, s := tcpPair(t)
	serve := make(chan struct{})
	go func() { // an HTTP-like peer: one answer per request, when told to
		buf := make([]byte, 64<<10)
		for range serve {
			n, err := s.Read(buf)
			if err != nil {
				return
			}
			if _, err := s.Write(append([]byte("re:"), buf[:n]...)); err != nil {
				return
			}
		}
	}()
	defer close(serve)
	buf := make([]byte, 64)
	for round := range 3 {
		c.HoldWrites()
		if n, err := c.Write([]byte("GET ")); n != 4 || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
		if n, err := c.Write([]byte("/x")); n != 2 || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
		// The peer is not reading yet: written bytes would wait in its
		// receive queue. There are none: they are held.
		if testutil.HasBytes(t, s) {
			t.Fatalf("round %d: the held bytes reached the peer before the Read", round)
		}
		serve <- struct{}{}
		got := 0
		for got < len("re:GET /x") {
			n, err := c.Read(buf[got:])
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			got += n
		}
		if string(buf[:got]) != "re:GET /x" {
			t.Fatalf("round %d: answer %q", round, buf[:got])
		}
		// Without HoldWrites, a write goes out at once.
		if _, err := c.Write([]byte("now")); err != nil {
			t.Fatal(err)
		}
		for i := 0; !testutil.HasBytes(t, s); i++ {
			if i == 2000 {
				t.Fatalf("round %d: an unheld write did not reach the peer", round)
			}
			time.Sleep(time.Millisecond)
		}
		serve <- struct{}{}
		if _, err := io.ReadFull(c, buf[:6]); err != nil || string(buf[:6]) != "re:now" {
			t.Fatalf("unheld exchange: %q, %v", buf[:6], err)
		}
	}
}

// TestHoldingTooMuchWritesAtOnce: past the bound, the held bytes and the
// new ones go out in order, at once.
func TestHoldingTooMuchWritesAtOnce(t *testing.T) {
	c, s := tcpPair(t)
	head := []byte("head|")
	body := bytes.Repeat([]byte("b"), 64<<10)
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, len(head)+len(body))
		_, _ = io.ReadFull(s, b)
		got <- b
	}()
	c.HoldWrites()
	if _, err := c.Write(head); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(body); err != nil {
		t.Fatal(err)
	}
	if b := <-got; !bytes.Equal(b, append(append([]byte(nil), head...), body...)) {
		t.Fatal("the peer received the bytes out of order or incomplete")
	}
}

// TestHeldWriteToAResetPeer: the Read reports the failed write with its
// errno, as a write.
func TestHeldWriteToAResetPeer(t *testing.T) {
	c, s := tcpPair(t)
	_ = s.(*net.TCPConn).SetLinger(0)
	_ = s.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 8)
	var err error
	for range 100 { // until the reset has arrived and a held write meets it
		c.HoldWrites()
		if _, err = c.Write([]byte("GET")); err != nil {
			break
		}
		if _, err = c.Read(buf); err != nil {
			break
		}
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("exchange with a reset peer = %v; want ECONNRESET or EPIPE", err)
	}
}

// TestNoAllocations: a Write and the Read of its echo, under a fresh
// read deadline, allocate nothing on a warm connection, plain (the
// callbacks are bound once, in Wrap) or held (the held bytes are copied
// into a buffer kept with the connection).
func TestNoAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, mode := range []string{"plain", "held", "yield on wake"} {
		held := mode == "held"
		c, s := tcpPair(t)
		if mode == "yield on wake" {
			c.YieldOnWake()
		}
		go func() { _, _ = io.Copy(s, s) }()
		msg := []byte("0123456789")
		// Room to spare: a Read woken by the echo yields only when its
		// first read leaves room for a second.
		buf := make([]byte, 4*len(msg))
		exchange := func() {
			if held {
				c.HoldWrites()
			}
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(time.Minute))
			if _, err := io.ReadAtLeast(c, buf, len(msg)); err != nil {
				t.Fatal(err)
			}
		}
		exchange()
		if allocs := testing.AllocsPerRun(1000, exchange); allocs != 0 {
			t.Fatalf("%s: %v allocations per exchange; want 0", mode, allocs)
		}
		if mode == "yield on wake" && runtime.GOOS == "linux" && c.WakeYields().Yields == 0 {
			t.Fatalf("%s: no Read yielded; the gate did not run the yield", mode)
		}
	}
}

// TestConcurrentWrites: Writes from several goroutines each go out
// whole, as on any net.Conn.
func TestConcurrentWrites(t *testing.T) {
	c, s := tcpPair(t)
	const writers, each, size = 4, 500, 100
	got := make(chan int, 1)
	go func() {
		n, _ := io.Copy(io.Discard, s)
		got <- int(n)
	}()
	var wg sync.WaitGroup
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := bytes.Repeat([]byte("x"), size)
			for range each {
				if n, err := c.Write(msg); n != size || err != nil {
					t.Errorf("Write = %d, %v", n, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	_ = c.Close()
	if n := <-got; n != writers*each*size {
		t.Fatalf("the peer received %d bytes; want %d", n, writers*each*size)
	}
}

// TestBlockingSocketIsLeftAlone: a socket made blocking (os.File.Fd on
// its File does that, for the descriptor they share) keeps the runtime's
// calls: a raw read on it would block its thread without the runtime
// knowing.
func TestBlockingSocketIsLeftAlone(t *testing.T) {
	c, _ := tcpPair(t)
	tc := c.Conn.(*net.TCPConn)
	f, err := tc.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_ = f.Fd()
	if w := rawio.Wrap(tc); w != net.Conn(tc) {
		t.Fatalf("Wrap of a blocking socket = %T; want the connection itself", w)
	}
}

// TestWaitsCountsReadsThatWaited: a read whose data is already there does
// not count; one that finds nothing and waits for the poller does.
func TestWaitsCountsReadsThatWaited(t *testing.T) {
	c, s := tcpPair(t)
	buf := make([]byte, 16)
	if _, err := s.Write([]byte("now")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the bytes in c's receive queue", func() bool { return testutil.HasBytes(t, c) })
	w0 := c.Waits()
	if _, err := io.ReadFull(c, buf[:3]); err != nil {
		t.Fatal(err)
	}
	if got := c.Waits() - w0; got != 0 {
		t.Fatalf("a read of data already there counted %d waits", got)
	}
	// Nothing sent: the read waits for the poller until its deadline.
	if err := c.SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read with nothing sent: %v, want a deadline error", err)
	}
	if got := c.Waits() - w0; got < 1 {
		t.Fatalf("a read that waited for the poller counted %d waits", got)
	}
}

// readWhenWaiting reads len(msg) bytes from c and has the peer s send msg
// once that Read waits for the poller (so the Read's deadline has reached
// it), and checks what the Read got.
func readWhenWaiting(t *testing.T, c *rawio.Conn, s net.Conn, msg string) {
	t.Helper()
	got, err := sendWhenWaiting(t, c, s, msg, func() ([]byte, error) {
		b := make([]byte, len(msg))
		_, err := io.ReadFull(c, b)
		return b, err
	})
	if err != nil || got != msg {
		t.Fatalf("Read = %q, %v; want %q", got, err, msg)
	}
}

// sendWhenWaiting runs read, a Read of c, in a goroutine, has the peer s
// send msg once it waits for the poller, and returns what it got.
func sendWhenWaiting(t *testing.T, c *rawio.Conn, s net.Conn, msg string, read func() ([]byte, error)) (string, error) {
	t.Helper()
	w0 := c.Waits()
	type got struct {
		b   []byte
		err error
	}
	done := make(chan got, 1)
	go func() {
		b, err := read()
		done <- got{b, err}
	}()
	testutil.WaitFor(t, "the Read to wait", func() bool { return c.Waits() != w0 })
	if _, err := s.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	g := <-done
	return string(g.b), g.err
}

// TestReadDeadlineReachesThePollerOnlyToWait: a keep-alive server's two
// read deadlines per request cost nothing when the request is already
// there; a Read that waits gives the poller the latest one, once.
func TestReadDeadlineReachesThePollerOnlyToWait(t *testing.T) {
	c, s := tcpPair(t)
	buf := make([]byte, 8)
	for range 10 {
		if _, err := s.Write([]byte("req")); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, "the request in c's receive queue", func() bool { return testutil.HasBytes(t, c) })
		_ = c.SetReadDeadline(time.Now().Add(time.Minute)) // idle
		if _, err := io.ReadFull(c, buf[:3]); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Hour)) // read timeout
	}
	if n := rawio.DeadlinesGiven(c); n != 0 {
		t.Fatalf("%d deadlines reached the poller for reads that found their data", n)
	}
	readWhenWaiting(t, c, s, "late")
	if n := rawio.DeadlinesGiven(c); n != 1 {
		t.Fatalf("%d deadlines reached the poller for one Read that waited; want 1", n)
	}
}

// TestReadDeadlineContract: the read deadline, though it reaches the
// poller only when a Read waits, keeps net.Conn's contract.
func TestReadDeadlineContract(t *testing.T) {
	buf := make([]byte, 8)
	isTimeout := func(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

	t.Run("past deadline fails with data waiting", func(t *testing.T) {
		c, s := tcpPair(t)
		if _, err := s.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, "the byte in c's receive queue", func() bool { return testutil.HasBytes(t, c) })
		_ = c.SetReadDeadline(time.Now().Add(-time.Second))
		if n, err := c.Read(buf); !isTimeout(err) {
			t.Fatalf("Read past the deadline = %d, %v; want a timeout", n, err)
		}
		_ = c.SetReadDeadline(time.Time{})
		if n, err := c.Read(buf); n != 1 || err != nil {
			t.Fatalf("Read after clearing the deadline = %d, %v", n, err)
		}
	})

	t.Run("a lapsed deadline does not outlive a later one", func(t *testing.T) {
		c, s := tcpPair(t)
		// A Read that waits gives the poller its deadline; the peer
		// answers once it waits, and the deadline then lapses unused.
		const lapse = 300 * time.Millisecond
		_ = c.SetReadDeadline(time.Now().Add(lapse))
		readWhenWaiting(t, c, s, "a")
		time.Sleep(lapse + 100*time.Millisecond)
		_ = c.SetReadDeadline(time.Now().Add(time.Hour))
		readWhenWaiting(t, c, s, "b")
		// The same through a held write: nothing goes out until the
		// later deadline is in force, and the answer is read under it.
		_ = c.SetReadDeadline(time.Now().Add(lapse))
		readWhenWaiting(t, c, s, "c")
		time.Sleep(lapse + 100*time.Millisecond)
		_ = c.SetReadDeadline(time.Now().Add(time.Hour))
		got := make(chan []byte, 1)
		go func() {
			b := make([]byte, 8)
			n, _ := io.ReadAtLeast(s, b, 4)
			got <- b[:n]
			_, _ = s.Write([]byte("d"))
		}()
		c.HoldWrites()
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		if n, err := c.Read(buf); n != 1 || err != nil || buf[0] != 'd' {
			t.Fatalf("held write's Read under the later deadline = %q, %v", buf[:n], err)
		}
		if b := <-got; string(b) != "ping" {
			t.Fatalf("the peer got %q; want the held bytes once", b)
		}
	})

	t.Run("a deadline set before Wrap can be cleared", func(t *testing.T) {
		nc, s := testutil.ConnPair(t, "tcp")
		_ = nc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		c := rawio.Wrap(nc)
		_ = c.SetReadDeadline(time.Time{})
		time.Sleep(100 * time.Millisecond)
		if _, err := s.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if n, err := c.Read(buf); n != 1 || err != nil {
			t.Fatalf("Read after clearing = %d, %v", n, err)
		}
	})

	t.Run("deadlines without a monotonic reading", func(t *testing.T) {
		c, s := tcpPair(t)
		if _, err := s.Write([]byte("xy")); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, "the bytes in c's receive queue", func() bool { return testutil.HasBytes(t, c) })
		_ = c.SetReadDeadline(time.Now().UTC().Add(time.Hour)) // UTC drops the monotonic reading
		if n, err := c.Read(buf[:1]); n != 1 || err != nil {
			t.Fatalf("Read before a wall-clock deadline = %d, %v", n, err)
		}
		_ = c.SetReadDeadline(time.Unix(1, 0))
		if n, err := c.Read(buf); !isTimeout(err) {
			t.Fatalf("Read past time.Unix(1, 0) = %d, %v; want a timeout", n, err)
		}
	})

	for _, tc := range []struct {
		name string
		dl   func() time.Time
	}{
		{"a deadline set during a wait ends it", time.Now},
		{"a deadline set during a wait bounds it", func() time.Time { return time.Now().Add(20 * time.Millisecond) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := tcpPair(t)
			done := make(chan error, 1)
			go func() {
				_, err := c.Read(make([]byte, 8))
				done <- err
			}()
			testutil.WaitFor(t, "the Read to wait", func() bool { return c.Waits() > 0 })
			_ = c.SetReadDeadline(tc.dl())
			select {
			case err := <-done:
				if !isTimeout(err) {
					t.Fatalf("Read = %v; want a timeout", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the waiting Read ignored the deadline")
			}
		})
	}

	t.Run("SetDeadline sets both", func(t *testing.T) {
		c, _ := tcpPair(t)
		_ = c.SetDeadline(time.Now().Add(-time.Second))
		if _, err := c.Read(buf); !isTimeout(err) {
			t.Fatalf("Read = %v; want a timeout", err)
		}
		if _, err := c.Write([]byte("x")); !isTimeout(err) {
			t.Fatalf("Write = %v; want a timeout", err)
		}
	})
}
