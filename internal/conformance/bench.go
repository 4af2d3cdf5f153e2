package conformance

import (
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/protocol"
)

// TypicalRequestHeaders is the request every transport benchmark sends: a
// browser-like set of headers and full metadata (about 1 KB as JSON).
func TypicalRequestHeaders() *protocol.RequestHeaders {
	m := &protocol.RequestHeaders{Method: []byte("GET"), URI: []byte("/api/users?id=7")}
	for _, h := range [][2]string{
		{"host", "example.com"}, {"user-agent", "Mozilla/5.0 (X11; Linux x86_64)"}, {"accept", "text/html,application/xhtml+xml"},
		{"accept-encoding", "gzip, deflate, br"}, {"accept-language", "en-US,en;q=0.9"}, {"cookie", "session=abcdef0123456789"},
		{"x-request-id", "b9e2c1d4"}, {"cache-control", "no-cache"},
	} {
		m.Headers = m.Headers.Add([]byte(h[0]), []byte(h[1]))
	}
	m.Metadata = protocol.Metadata{CorrelationID: []byte("b9e2c1d4"), ClientIP: []byte("127.0.0.1"), ClientPort: 51234,
		Protocol: []byte("HTTP/1.1"), RouteID: []byte("default"), UpstreamID: []byte("app"), Timestamp: []byte("2026-11-21T10:00:00Z")}
	return m
}

// BenchRoundTrips runs b.N RequestHeaders → Decision exchanges on a with
// inflight of them in flight at a time, and reports decisions per second
// and the process's CPU time per round trip (cpu-µs/op: user + system,
// both ends when the agent runs in the test process; steadier than ns/op
// on a shared machine) beside ns/op and allocations. Every transport's
// round-trip benchmark is this function, so their numbers compare
// directly.
func BenchRoundTrips(b *testing.B, a agentmux.Agent, inflight int) {
	var left atomic.Int64
	left.Store(int64(b.N))
	var failed atomic.Pointer[error]
	// Only the error path takes an address: storing &err inline would move
	// err to the heap on every iteration and show up as an allocation.
	fail := func(err error) { failed.Store(&err) }
	var wg sync.WaitGroup
	b.ReportAllocs()
	cpu0 := ProcessCPU()
	b.ResetTimer()
	for w := 0; w < inflight; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := TypicalRequestHeaders()
			for left.Add(-1) >= 0 {
				ex, err := a.Begin(agentmux.Wait{})
				if err != nil {
					fail(err)
					return
				}
				_, err = ex.RequestHeaders(agentmux.Wait{}, m)
				ex.Finish()
				if err != nil {
					fail(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	cpu := ProcessCPU() - cpu0
	if p := failed.Load(); p != nil {
		b.Fatal(*p)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	if cpu > 0 {
		b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
	}
}

// ProcessCPU is the CPU time the process has used (user + system, all
// threads), 0 where getrusage is unavailable.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
