package rawio_test

import (
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/rawio"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/yield"
)

// setYieldHook makes the yields of YieldOnWake call f for the rest of the
// test.
func setYieldHook(t *testing.T, f func()) {
	t.Helper()
	rawio.SetYieldHook(f)
	t.Cleanup(func() { rawio.SetYieldHook(nil) })
}

// wakeRead has the peer s send msg once a Read of up to size bytes on c
// waits for the poller, and returns what that Read got.
func wakeRead(t *testing.T, c *rawio.Conn, s net.Conn, size int, msg string) (string, error) {
	t.Helper()
	return sendWhenWaiting(t, c, s, msg, func() ([]byte, error) {
		b := make([]byte, size)
		n, err := c.Read(b)
		return b[:n], err
	})
}

// TestYieldOnWakeTakesWhatCameMeanwhile: a Read woken by data yields
// once and its second read takes what the peer sent during the yield.
func TestYieldOnWakeTakesWhatCameMeanwhile(t *testing.T) {
	c, s := tcpPair(t)
	c.YieldOnWake()
	setYieldHook(t, func() {
		if _, err := s.Write([]byte("+second")); err != nil {
			t.Error(err)
			return
		}
		testutil.WaitFor(t, "the second bytes in c's receive queue", func() bool { return testutil.HasBytes(t, c) })
	})
	got, err := wakeRead(t, c, s, 64, "first")
	if err != nil || got != "first+second" {
		t.Fatalf("Read = %q, %v; want %q", got, err, "first+second")
	}
	if st := c.WakeYields(); st != (rawio.WakeStats{Yields: 1, Paid: 1}) {
		t.Fatalf("WakeYields = %+v; want 1 yield, paid", st)
	}
}

// TestYieldOnWakeOnlyWhenItPays: yields that find nothing more are kept
// to one wake-up in yield.ProbeEvery; once one pays, every wake-up
// yields again.
func TestYieldOnWakeOnlyWhenItPays(t *testing.T) {
	c, s := tcpPair(t)
	c.YieldOnWake()
	var yields atomic.Int64
	var more atomic.Bool
	setYieldHook(t, func() {
		yields.Add(1)
		if more.Load() {
			if _, err := s.Write([]byte("+")); err != nil {
				t.Error(err)
				return
			}
			testutil.WaitFor(t, "the byte in c's receive queue", func() bool { return testutil.HasBytes(t, c) })
		}
	})
	const wakes = 2*yield.ProbeEvery + 8
	for i := range wakes {
		if got, err := wakeRead(t, c, s, 64, "x"); err != nil || got != "x" {
			t.Fatalf("wake-up %d: Read = %q, %v", i, got, err)
		}
	}
	// The first wake-up probes, then one in ProbeEvery.
	if got, want := yields.Load(), int64(1+(wakes-1)/yield.ProbeEvery); got != want {
		t.Fatalf("%d wake-ups with nothing more to read yielded %d times; want %d", wakes, got, want)
	}
	// A probe that pays brings the yields back on every wake-up.
	more.Store(true)
	paid := false
	for i := 0; i < 4*yield.ProbeEvery; i++ {
		y0 := yields.Load()
		got, err := wakeRead(t, c, s, 64, "x")
		if err != nil {
			t.Fatal(err)
		}
		if !paid {
			paid = got == "x+"
			continue
		}
		if got != "x+" || yields.Load() != y0+1 {
			t.Fatalf("wake-up %d after a yield paid: Read = %q, %d yields; want \"x+\" after 1", i, got, yields.Load()-y0)
		}
	}
	if !paid {
		t.Fatalf("no probe in %d wake-ups", 4*yield.ProbeEvery)
	}
	if st := c.WakeYields(); st.Paid == 0 || st.Yields != uint64(yields.Load()) {
		t.Fatalf("WakeYields = %+v after %d yields", st, yields.Load())
	}
}

// TestYieldOnWakeLeavesTheEndToTheNextRead: a peer that closes during the
// yield loses nothing: the Read returns what woke it, the next one the
// end of the stream.
func TestYieldOnWakeLeavesTheEndToTheNextRead(t *testing.T) {
	c, s := tcpPair(t)
	c.YieldOnWake()
	setYieldHook(t, func() {
		_ = s.Close()
		testutil.WaitFor(t, "the FIN", func() bool { return readableEOF(c) })
	})
	got, err := wakeRead(t, c, s, 64, "last")
	if err != nil || got != "last" {
		t.Fatalf("Read = %q, %v; want \"last\"", got, err)
	}
	if n, err := c.Read(make([]byte, 8)); n != 0 || err != io.EOF {
		t.Fatalf("next Read = %d, %v; want 0, io.EOF", n, err)
	}
}

// TestNoYieldWithoutAWakeOrRoom: a Read whose data was already there, one
// whose first read filled the buffer, and one on a Conn that was not
// asked to yield do not yield.
func TestNoYieldWithoutAWakeOrRoom(t *testing.T) {
	var yields atomic.Int64
	setYieldHook(t, func() { yields.Add(1) })

	c, s := tcpPair(t)
	c.YieldOnWake()
	if _, err := s.Write([]byte("ready")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the bytes in c's receive queue", func() bool { return testutil.HasBytes(t, c) })
	if n, err := c.Read(make([]byte, 64)); err != nil || n != 5 {
		t.Fatalf("Read = %d, %v; want the 5 bytes there", n, err)
	}
	if got, err := wakeRead(t, c, s, 4, "full"); err != nil || got != "full" {
		t.Fatalf("Read = %q, %v", got, err)
	}

	plain, ps := tcpPair(t)
	if got, err := wakeRead(t, plain, ps, 64, "plain"); err != nil || got != "plain" {
		t.Fatalf("Read = %q, %v", got, err)
	}
	if n := yields.Load(); n != 0 {
		t.Fatalf("%d yields; want none", n)
	}
}

// readableEOF reports whether c's peer has closed: a peek finds the end
// of the stream.
func readableEOF(c *rawio.Conn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	eof := false
	_ = raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		eof = err == nil && n == 0
	})
	return eof
}
