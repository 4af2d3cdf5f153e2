package accesslog

import (
	"io"
	"testing"
	"time"
)

// BenchmarkLine is one access log line into a Writer.
func BenchmarkLine(b *testing.B) {
	w := NewWriter(io.Discard, 0, 0, 10*time.Millisecond)
	defer w.Close()
	l, _ := New(w, DefaultConfig())
	s := blocked()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l.RecordRequest(s)
		}
	})
}

// BenchmarkSampledOut is an ordinary request left out by 1-in-100 sampling.
func BenchmarkSampledOut(b *testing.B) {
	l, _ := New(io.Discard, Config{SampleEvery: 100})
	s := allowed(200)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l.RecordRequest(s)
		}
	})
}
