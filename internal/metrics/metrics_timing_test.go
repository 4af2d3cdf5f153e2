package metrics

import (
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/observe"
	"github.com/zentinelproxy/sidecar/protocol"
)

// BenchmarkRequest is the metric work of one request through one agent
// that inspects request headers: one agent event and the request summary.
func BenchmarkRequest(b *testing.B) {
	m := newMetrics(b)
	m.Reset([]string{"a", "b", "c"}, []string{"x", "y"})
	s := summary(1, observe.RequestAllowed, -1)
	s.BytesOut = 512
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.AgentEvent(1, 0, protocol.PhaseRequest, false, observe.OutcomeAllow, 37*time.Microsecond)
			m.RecordRequest(s)
		}
	})
}

// BenchmarkNop is the same calls on the no-op observer, for comparison.
func BenchmarkNop(b *testing.B) {
	var o observe.Observer = observe.NopObserver{}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			o.AgentEvent(1, 0, protocol.PhaseRequest, false, observe.OutcomeAllow, 37*time.Microsecond)
			o.Request(1, 200, time.Millisecond)
		}
	})
}
