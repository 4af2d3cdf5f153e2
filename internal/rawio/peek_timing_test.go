package rawio_test

import "testing"

// BenchmarkPending is the look at an idle pooled connection before a
// request is written on it (one recvfrom(2) with MSG_PEEK|MSG_DONTWAIT
// that finds nothing): what reusing an upstream connection costs.
func BenchmarkPending(b *testing.B) {
	c, _ := tcpPair(b)
	b.ReportAllocs()
	for b.Loop() {
		if data, err := c.Pending(); data || err != nil {
			b.Fatalf("Pending = %v, %v", data, err)
		}
	}
}
