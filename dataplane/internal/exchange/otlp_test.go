package exchange

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// blockingExporter holds every export until released, counting spans.
type blockingExporter struct {
	release chan struct{}
	entered chan struct{}
	once    sync.Once
	mu      sync.Mutex
	n       int
}

func (e *blockingExporter) Start(context.Context) error { return nil }

func (e *blockingExporter) UploadTraces(ctx context.Context, rss []*tracepb.ResourceSpans) error {
	spans := rss[0].ScopeSpans[0].Spans
	e.once.Do(func() { close(e.entered) })
	select {
	case <-e.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	e.mu.Lock()
	e.n += len(spans)
	e.mu.Unlock()
	return nil
}

func (e *blockingExporter) Stop(context.Context) error { return nil }

func testTracing(mod func(*config.OTLP)) config.Tracing {
	c := config.Tracing{OTLP: config.OTLP{ServiceName: "test", Timeout: 5 * time.Second, MaxQueue: 2048, BatchSize: 512}}
	mod(&c.OTLP)
	return c
}

// TestSpanQueueBound: with the exporter stuck, requests past
// otlp.max_queue have their spans dropped and counted; what was queued is
// exported once the exporter moves again.
func TestSpanQueueBound(t *testing.T) {
	cfg := testTracing(func(o *config.OTLP) { o.MaxQueue, o.BatchSize = 2, 1 })
	exp := &blockingExporter{release: make(chan struct{}), entered: make(chan struct{})}
	e := startSpanExporter(exp, cfg, zerolog.Nop())
	ex := testExchange()
	ex.start = time.Now()
	randomID(ex.trace.traceID[:])
	randomID(ex.trace.spanID[:])
	ex.trace.sampled = true
	e.record(ex, 0, 200, time.Millisecond) // taken by the exporter, which blocks
	<-exp.entered
	for i := 0; i < 5; i++ {
		e.record(ex, 0, 200, time.Millisecond)
	}
	if st := e.stats(); st.Dropped != 3 {
		t.Fatalf("dropped %d, want 3 (queue of 2)", st.Dropped)
	}
	close(exp.release)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if st := e.stats(); st.Exported != 3 || exp.n != 3 {
		t.Fatalf("exported %d (exporter saw %d), want 3 request spans", st.Exported, exp.n)
	}
}

// TestSampleRatio: ratio 0 exports no new trace, ratio 1 every one.
func TestSampleRatio(t *testing.T) {
	for _, tc := range []struct {
		ratio float64
		want  bool
	}{{0, false}, {1, true}} {
		cfg := testTracing(func(o *config.OTLP) { o.SampleRatio = &tc.ratio })
		e := startSpanExporter(&blockingExporter{release: make(chan struct{}), entered: make(chan struct{})}, cfg, zerolog.Nop())
		for i := 0; i < 100; i++ {
			if e.sample() != tc.want {
				t.Fatalf("ratio %v sampled %v", tc.ratio, !tc.want)
			}
		}
		_ = e.shutdown(context.Background())
	}
}
