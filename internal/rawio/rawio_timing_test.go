package rawio_test

import (
	"io"
	"net"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/rawio"
)

// BenchmarkPingPong: a 100-byte write and the echo's read, through the
// runtime's system calls (net) and through rawio (raw), against an echo
// goroutine on loopback TCP. The gain in a proxy shows on a core shared
// with other processes (docs/performance.md); here it is the calls'
// own cost.
func BenchmarkPingPong(b *testing.B) {
	for _, bc := range []struct {
		name string
		wrap func(net.Conn) net.Conn
	}{
		{"net", func(c net.Conn) net.Conn { return c }},
		{"raw", rawio.Wrap},
	} {
		b.Run(bc.name, func(b *testing.B) {
			rc, s := tcpPair(b)
			c := bc.wrap(rc.Conn)
			go func() { _, _ = io.Copy(s, s) }()
			msg := make([]byte, 100)
			buf := make([]byte, len(msg))
			b.SetBytes(int64(len(msg)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
