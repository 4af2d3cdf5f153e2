//go:build linux

package rawio_test

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zentinelproxy/sidecar/internal/rawio"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/yield"
)

// Yielding on wake-ups exists on Linux only (elsewhere YieldOnWake does
// nothing).

// hookWait polls cond, for a yield hook: the hook runs in the reading
// goroutine, where a test may not stop, so a cond that never holds is
// reported with t.Error and false.
func hookWait(t *testing.T, what string, cond func() bool) bool {
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if cond() {
			return true
		}
	}
	t.Errorf("in the yield: %s never happened", what)
	return false
}

// guard bounds c's Reads, so that a Read that would wait forever fails
// the test instead of hanging it.
func guard(t *testing.T, c *rawio.Conn) {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
}

// setYieldHook makes the OS yields of YieldOnWake call f, with the Conn
// that yields, instead of sched_yield for the rest of the test (other
// yields go on as usual).
func setYieldHook(t *testing.T, f func(c *rawio.Conn)) {
	t.Helper()
	yield.SetHook(func(owner any) bool {
		c, ok := owner.(*rawio.Conn)
		if ok {
			f(c)
		}
		return ok
	})
	t.Cleanup(func() { yield.SetHook(nil) })
}

// sendInYield, called by a yield hook, has the peer s send msg and waits
// until it is in c's receive queue; false (reported) if it never is.
func sendInYield(t *testing.T, c *rawio.Conn, s net.Conn, msg string) bool {
	if _, err := s.Write([]byte(msg)); err != nil {
		t.Error(err)
		return false
	}
	return hookWait(t, "the bytes sent during the yield in c's receive queue", func() bool { return testutil.HasBytes(t, c) })
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
// once and its second read takes what the peer sent during the yield. A
// yield that kept the reader off its CPU for a millisecond or more
// (unrelated busy work took it) does not count as paid, though what came
// meanwhile is read all the same.
func TestYieldOnWakeTakesWhatCameMeanwhile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		quick bool          // the yield measures as instant (rawio.QuickYields)
		long  time.Duration // how much longer the yield lasts
		want  rawio.WakeStats
	}{
		// Sending and peeking in the hook takes well under maxPaidYield
		// on a quiet machine, but a loaded one can preempt the test
		// anywhere in it: the quick yield is measured as instant.
		{"quick yield pays", true, 0, rawio.WakeStats{Yields: 1, Paid: 1}},
		// The long one is measured on the real clock: a sleep never
		// lasts less.
		{"long yield does not pay", false, 2 * time.Millisecond, rawio.WakeStats{Yields: 1, Paid: 0}}, // outlasts maxPaidYield
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := tcpPair(t)
			c.YieldOnWake()
			if tc.quick {
				rawio.QuickYields(c)
			}
			guard(t, c)
			setYieldHook(t, func(*rawio.Conn) {
				if sendInYield(t, c, s, "+second") {
					time.Sleep(tc.long)
				}
			})
			got, err := wakeRead(t, c, s, 64, "first")
			if err != nil || got != "first+second" {
				t.Fatalf("Read = %q, %v; want %q", got, err, "first+second")
			}
			if st := c.WakeYields(); st != tc.want {
				t.Fatalf("WakeYields = %+v; want %+v", st, tc.want)
			}
		})
	}
}

// TestYieldOnWakeOnlyWhenItPays: yields that find nothing more are kept
// to one wake-up in yield.ProbeEvery; once one pays, every wake-up
// yields again.
func TestYieldOnWakeOnlyWhenItPays(t *testing.T) {
	c, s := tcpPair(t)
	c.YieldOnWake()
	// A yield that finds more pays whatever a loaded machine does to the
	// hook's duration (TestYieldOnWakeTakesWhatCameMeanwhile checks the
	// bound on it).
	rawio.QuickYields(c)
	guard(t, c)
	var yields atomic.Int64
	var more atomic.Bool
	setYieldHook(t, func(*rawio.Conn) {
		yields.Add(1)
		if more.Load() {
			sendInYield(t, c, s, "+")
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
	guard(t, c)
	setYieldHook(t, func(*rawio.Conn) {
		_ = s.Close()
		hookWait(t, "the FIN", func() bool { return testutil.PeerClosed(t, c) })
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
	setYieldHook(t, func(*rawio.Conn) { yields.Add(1) })

	c, s := tcpPair(t)
	c.YieldOnWake()
	guard(t, c)
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
	guard(t, plain)
	if got, err := wakeRead(t, plain, ps, 64, "plain"); err != nil || got != "plain" {
		t.Fatalf("Read = %q, %v", got, err)
	}
	if n := yields.Load(); n != 0 {
		t.Fatalf("%d yields; want none", n)
	}
}

// TestYieldOnWakeKeepsAReset: a reset met by the second read, which the
// kernel reports once, reaches the next Read, as it would without the
// yield (the Read before it returns what woke it).
func TestYieldOnWakeKeepsAReset(t *testing.T) {
	for _, network := range []string{"unix", "tcp"} {
		t.Run(network, func(t *testing.T) {
			d, s := testutil.ConnPair(t, network)
			c := rawio.Wrap(d).(*rawio.Conn)
			c.YieldOnWake()
			guard(t, c)
			setYieldHook(t, func(*rawio.Conn) {
				// A peer that closes with data unread resets a Unix
				// socket; a TCP peer with SO_LINGER 0 resets at once.
				if tc, ok := s.(*net.TCPConn); ok {
					_ = tc.SetLinger(0)
				} else if _, err := c.Write([]byte("unread")); err != nil {
					t.Error(err)
					return
				}
				_ = s.Close()
				hookWait(t, "the reset", func() bool { return pollErr(c) })
			})
			if got, err := wakeRead(t, c, s, 64, "last"); err != nil || got != "last" {
				t.Fatalf("Read = %q, %v; want \"last\"", got, err)
			}
			if _, err := c.Read(make([]byte, 8)); !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("next Read = %v; want ECONNRESET", err)
			}
		})
	}
}

// pollErr reports whether c's socket has an error or hang-up pending
// (false when the socket is gone); poll(2) leaves the error for the next
// read.
func pollErr(c *rawio.Conn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	pending := false
	_ = raw.Control(func(fd uintptr) {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, _ := unix.Poll(p, 0)
		pending = n == 1 && p[0].Revents&(unix.POLLERR|unix.POLLHUP) != 0
	})
	return pending
}
