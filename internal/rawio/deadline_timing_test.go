package rawio

import (
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// BenchmarkKeepAliveDeadlines: the read deadlines a keep-alive server
// sets per request on its client connection (one for the idle wait, one
// for the rest of the request) and the check of a Read that finds the
// request already there, given to the runtime's poller at once (net) or
// only when a Read waits (lazy, SetReadDeadline). The read(2) itself,
// the same in both, is left out.
func BenchmarkKeepAliveDeadlines(b *testing.B) {
	nc, _ := testutil.ConnPair(b, "tcp")
	c := Wrap(nc).(*Conn)
	idle, read := time.Now().Add(time.Minute), time.Now().Add(time.Hour)
	b.Run("net", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = c.Conn.SetReadDeadline(idle)
			_ = c.Conn.SetReadDeadline(read)
		}
	})
	b.Run("lazy", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = c.SetReadDeadline(idle)
			if c.rdDirty.Load() { // as Read does
				c.deadlineDue()
			}
			_ = c.SetReadDeadline(read)
		}
	})
}
