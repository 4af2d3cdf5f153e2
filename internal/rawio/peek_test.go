package rawio_test

import (
	"io"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// Pending tells an idle connection from one with bytes waiting and from
// one the peer closed, without consuming anything.
func TestPending(t *testing.T) {
	c, s := tcpPair(t)
	if data, err := c.Pending(); data || err != nil {
		t.Fatalf("idle: Pending = %v, %v; want false, nil", data, err)
	}
	if _, err := s.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the byte to arrive", func() bool { return testutil.HasBytes(t, c) })
	if data, err := c.Pending(); !data || err != nil {
		t.Fatalf("with a byte waiting: Pending = %v, %v; want true, nil", data, err)
	}
	buf := make([]byte, 4)
	if n, err := c.Read(buf); n != 1 || err != nil || buf[0] != 'x' {
		t.Fatalf("Read after Pending = %q, %v; the peeked byte must still be there", buf[:n], err)
	}
	_ = s.Close()
	testutil.WaitFor(t, "the FIN", func() bool { return testutil.PeerClosed(t, c) })
	if data, err := c.Pending(); data || err != io.EOF {
		t.Fatalf("after the peer's FIN: Pending = %v, %v; want false, io.EOF", data, err)
	}
	_ = c.Close()
	if _, err := c.Pending(); err == nil {
		t.Fatal("Pending on a closed connection: no error")
	}
}
