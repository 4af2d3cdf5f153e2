package rawio

import (
	"io"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// TestReadDeadlineReachesThePollerOnlyToWait: a keep-alive server's two
// read deadlines per request cost nothing when the request is already
// there; a Read that waits gives the poller the latest one, once.
func TestReadDeadlineReachesThePollerOnlyToWait(t *testing.T) {
	nc, s := testutil.ConnPair(t, "tcp")
	c := Wrap(nc).(*Conn)
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
	if n := c.rdProgs.Load(); n != 0 {
		t.Fatalf("%d deadlines reached the poller for reads that found their data", n)
	}
	w0 := c.Waits()
	done := make(chan error, 1)
	go func() {
		_, err := io.ReadFull(c, buf[:4])
		done <- err
	}()
	testutil.WaitFor(t, "the Read to wait", func() bool { return c.Waits() != w0 })
	if _, err := s.Write([]byte("late")); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := c.rdProgs.Load(); n != 1 {
		t.Fatalf("%d deadlines reached the poller for one Read that waited; want 1", n)
	}
}
