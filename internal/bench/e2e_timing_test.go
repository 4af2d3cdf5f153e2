package bench

import (
	"context"
	"flag"
	"os"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

var benchConcurrency = flag.Int("e2e.concurrency", 64, "keep-alive connections of BenchmarkE2E")

// BenchmarkE2E runs every registered row as a sub-benchmark: b.N requests
// through the row's setup at a fixed concurrency (-e2e.concurrency).
// Besides ns/op (wall time over all connections, so 1/throughput) it
// reports req/s, p50-µs, p99-µs and cpu-µs/req (CPU time of the whole
// process per request). Compare rows of one run only.
func BenchmarkE2E(b *testing.B) {
	up, stopUp, err := StartUpstream()
	if err != nil {
		b.Fatal(err)
	}
	defer stopUp()
	dir := shortTempDir(b)
	log := zerolog.New(os.Stderr).Level(zerolog.ErrorLevel)
	for _, row := range Rows() {
		b.Run(row.Name, func(b *testing.B) {
			b.ReportAllocs()
			if row.BodySize > 0 {
				b.SetBytes(int64(row.BodySize))
			}
			lc := LoadConfig{
				Concurrency: *benchConcurrency,
				Requests:    b.N,
				Warmup:      100 * time.Millisecond,
				OnStart:     b.ResetTimer,
			}
			out, err := RunRow(context.Background(), row, up, dir, log, lc)
			b.StopTimer()
			if err != nil {
				b.Fatal(err)
			}
			res := out[0]
			if res.Errors > 0 {
				b.Errorf("%d failed requests, first: %v", res.Errors, res.FirstError)
			}
			b.ReportMetric(res.RPS(), "req/s")
			b.ReportMetric(float64(res.Quantile(0.5))/1e3, "p50-µs")
			b.ReportMetric(float64(res.Quantile(0.99))/1e3, "p99-µs")
			b.ReportMetric(float64(res.CPUPerRequest())/1e3, "cpu-µs/req")
		})
	}
}

// shortTempDir is a temporary directory with a path short enough for Unix
// sockets (t.TempDir's can exceed 107 bytes).
func shortTempDir(tb testing.TB) string {
	dir, err := os.MkdirTemp("", "scb")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
