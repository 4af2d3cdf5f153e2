package exchange

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/zentinelproxy/sidecar/dataplane/internal/clock"
	"github.com/zentinelproxy/sidecar/dataplane/internal/ratelog"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/observe"
)

// Span export over OTLP/gRPC, off unless tracing.otlp.endpoint is set. A
// sampled request leaves one record in a bounded queue when it finishes
// (full: dropped and counted); one goroutine turns records into spans
// (the request as a server span, each agent phase that took time, the
// upstream exchange as a client span) and exports them in batches.
// Unsampled requests and a sidecar without an exporter pay nothing here.
//
// The agent phase spans carry the phase's total agent time; the request
// path keeps durations, not instants, so a phase span is placed against
// the upstream exchange (request phases end where it starts, response
// phases start where its head arrived).

// ErrTracing is a tracing setting that cannot be applied.
var ErrTracing = errors.New("tracing")

// spanRecord is what a finished sampled request leaves for export.
type spanRecord struct {
	traceID           [16]byte
	parentID          [8]byte
	spanID, upSpanID  [8]byte
	start             time.Time
	dur               time.Duration
	upStart, upEnd    time.Duration // mono; 0: no upstream exchange
	agentTime         [observe.NumPhases]time.Duration
	method, path      string
	route, upstream   string
	endpoint, outcome string
	corr              string
	status            int
}

// spanExporter queues records and exports them.
type spanExporter struct {
	client    otlptrace.Client
	queue     chan spanRecord
	batch     int
	timeout   time.Duration
	threshold uint64 // sample when a random uint64 is below it
	all       bool
	resource  *resourcepb.Resource
	scope     *commonpb.InstrumentationScope
	log       zerolog.Logger
	logErr    ratelog.Limit

	flushReq chan chan struct{}
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once

	exported, dropped, failed atomic.Uint64
}

// newSpanExporter starts the exporter of cfg; nil without an endpoint.
// The gRPC connection is made lazily: a collector that is down costs
// failed exports, not a failed start.
func newSpanExporter(cfg config.Tracing, log zerolog.Logger) (*spanExporter, error) {
	o := cfg.OTLP
	if o.Endpoint == "" {
		return nil, nil
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(o.Endpoint), otlptracegrpc.WithTimeout(o.Timeout),
		otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: false})}
	if o.Insecure {
		opts = append(opts, otlptracegrpc.WithInsecure())
	}
	c := otlptracegrpc.NewClient(opts...)
	if err := c.Start(context.Background()); err != nil {
		return nil, fmt.Errorf("%w: otlp client: %w", ErrTracing, err)
	}
	return startSpanExporter(c, cfg, log), nil
}

func startSpanExporter(c otlptrace.Client, cfg config.Tracing, log zerolog.Logger) *spanExporter {
	o := cfg.OTLP
	ratio := 1.0
	if o.SampleRatio != nil {
		ratio = *o.SampleRatio
	}
	e := &spanExporter{
		client: c, queue: make(chan spanRecord, o.MaxQueue), batch: o.BatchSize, timeout: o.Timeout,
		all:       ratio >= 1,
		threshold: uint64(ratio * (1 << 63) * 2),
		resource:  &resourcepb.Resource{Attributes: []*commonpb.KeyValue{strAttr("service.name", o.ServiceName)}},
		scope:     &commonpb.InstrumentationScope{Name: "github.com/zentinelproxy/sidecar"},
		log:       log, flushReq: make(chan chan struct{}), stop: make(chan struct{}), done: make(chan struct{}),
	}
	go e.run()
	return e
}

// sample decides whether a new trace is exported.
func (e *spanExporter) sample() bool {
	return e.all || rand.Uint64() < e.threshold
}

// maxSpanString bounds each client-chosen string a span record keeps: a
// client decides whether its request is sampled (the traceparent flags),
// and max_queue records of whole header buffers would be its to fill.
const maxSpanString = 1024

// spanString is b as a span attribute: at most maxSpanString bytes, and
// valid UTF-8 (a decoded path or a request id may be anything; protobuf
// refuses to marshal such a string, and one of them failed the export of
// its whole batch).
func spanString(b []byte) string {
	if len(b) > maxSpanString {
		b = b[:maxSpanString]
	}
	if utf8.Valid(b) {
		return string(b)
	}
	v := strings.ToValidUTF8(string(b), "\uFFFD")
	for len(v) > maxSpanString {
		_, n := utf8.DecodeLastRuneInString(v)
		v = v[:len(v)-n]
	}
	return v
}

// record queues the spans of a finished sampled request.
func (e *spanExporter) record(ex *Exchange, route, status int, d time.Duration) {
	tr := &ex.trace
	r := spanRecord{traceID: tr.traceID, parentID: tr.parentID, spanID: tr.spanID, upSpanID: tr.upSpanID,
		start: ex.start, dur: d, upStart: time.Duration(tr.upStart), upEnd: time.Duration(tr.upEnd),
		agentTime: ex.agentTime, status: status, outcome: ex.outcome, corr: spanString(ex.corr), endpoint: tr.upAddr}
	r.method = spanString(ex.head.Method)
	r.path = spanString(ex.head.Path)
	if ex.rt != nil {
		r.route, r.upstream = ex.rt.name, ex.rt.up.Name()
	}
	select {
	case e.queue <- r:
	default:
		e.dropped.Add(1)
	}
}

func (e *spanExporter) run() {
	defer close(e.done)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var spans []*tracepb.Span
	export := func() {
		if len(spans) == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), e.timeout)
		err := e.client.UploadTraces(ctx, []*tracepb.ResourceSpans{{
			Resource:   e.resource,
			ScopeSpans: []*tracepb.ScopeSpans{{Scope: e.scope, Spans: spans}},
		}})
		cancel()
		if err != nil {
			e.failed.Add(uint64(len(spans)))
			if ok, suppressed := e.logErr.Allow(); ok {
				e.log.Warn().Err(err).Int("spans", len(spans)).Uint64("suppressed", suppressed).Msg("exporting spans")
			}
		} else {
			e.exported.Add(uint64(len(spans)))
		}
		spans = nil // the slice went to the client
	}
	add := func(r *spanRecord) {
		spans = e.appendSpans(spans, r)
		if len(spans) >= e.batch {
			export()
		}
	}
	drain := func() {
		for {
			select {
			case r := <-e.queue:
				add(&r)
			default:
				export()
				return
			}
		}
	}
	for {
		select {
		case r := <-e.queue:
			add(&r)
		case <-t.C:
			export()
		case ack := <-e.flushReq:
			drain()
			close(ack)
		case <-e.stop:
			drain()
			return
		}
	}
}

// flush exports what is queued now; it gives up when ctx ends.
func (e *spanExporter) flush(ctx context.Context) error {
	ack := make(chan struct{})
	select {
	case e.flushReq <- ack:
	case <-e.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-ack:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// shutdown exports what is queued and closes the exporter.
func (e *spanExporter) shutdown(ctx context.Context) error {
	e.stopOnce.Do(func() { close(e.stop) })
	select {
	case <-e.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return e.client.Stop(ctx)
}

func (e *spanExporter) stats() observe.TracingStats {
	if e == nil {
		return observe.TracingStats{}
	}
	return observe.TracingStats{Exported: e.exported.Load(), Failed: e.failed.Load(), Dropped: e.dropped.Load()}
}

func strAttr(k, v string) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
}

func intAttr(k string, v int64) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v}}}
}

func unixNano(t time.Time) uint64 { return uint64(t.UnixNano()) }

// appendSpans turns one record into its spans.
func (e *spanExporter) appendSpans(dst []*tracepb.Span, r *spanRecord) []*tracepb.Span {
	traceID := r.traceID[:]
	me := r.spanID[:]
	var parent []byte
	if !allZero(r.parentID[:]) {
		parent = r.parentID[:]
	}
	const sampled = 1 // W3C trace flags in the span's low byte
	end := r.start.Add(r.dur)
	name := r.method
	if r.route != "" {
		name += " " + r.route
	}
	attrs := []*commonpb.KeyValue{
		strAttr("http.request.method", r.method),
		strAttr("url.path", r.path),
		intAttr("http.response.status_code", int64(r.status)),
		strAttr("sidecar.route", r.route),
		strAttr("sidecar.correlation_id", r.corr),
	}
	if r.outcome != "" {
		attrs = append(attrs, strAttr("sidecar.outcome", r.outcome))
	}
	dst = append(dst, &tracepb.Span{TraceId: traceID, SpanId: me, ParentSpanId: parent, Name: name, Flags: sampled,
		Kind: tracepb.Span_SPAN_KIND_SERVER, StartTimeUnixNano: unixNano(r.start), EndTimeUnixNano: unixNano(end), Attributes: attrs})
	// The upstream exchange, and the agent phases around it.
	reqAnchor, respAnchor := r.start, end
	if r.upStart > 0 {
		us := clock.At(r.upStart)
		ue := us
		if r.upEnd > r.upStart {
			ue = us.Add(r.upEnd - r.upStart)
		}
		respAnchor = ue
		dst = append(dst, &tracepb.Span{TraceId: traceID, SpanId: r.upSpanID[:], ParentSpanId: me, Name: "upstream " + r.upstream, Flags: sampled,
			Kind: tracepb.Span_SPAN_KIND_CLIENT, StartTimeUnixNano: unixNano(us), EndTimeUnixNano: unixNano(ue),
			Attributes: []*commonpb.KeyValue{strAttr("sidecar.upstream", r.upstream), strAttr("server.address", r.endpoint)}})
		// Request phases end where the exchange starts.
		reqAnchor = us.Add(-r.agentTime[observe.PhaseRequestHeaders] - r.agentTime[observe.PhaseRequestBody])
		if reqAnchor.Before(r.start) {
			reqAnchor = r.start
		}
	}
	phase := func(p int, from time.Time) time.Time {
		d := r.agentTime[p]
		if d <= 0 {
			return from
		}
		id := make([]byte, 8)
		randomID(id)
		dst = append(dst, &tracepb.Span{TraceId: traceID, SpanId: id, ParentSpanId: me, Name: "agents " + observe.PhaseNames[p], Flags: sampled,
			Kind: tracepb.Span_SPAN_KIND_INTERNAL, StartTimeUnixNano: unixNano(from), EndTimeUnixNano: unixNano(from.Add(d)),
			Attributes: []*commonpb.KeyValue{strAttr("sidecar.phase", observe.PhaseNames[p])}})
		return from.Add(d)
	}
	next := phase(observe.PhaseRequestHeaders, reqAnchor)
	phase(observe.PhaseRequestBody, next)
	if r.upStart > 0 {
		next = phase(observe.PhaseResponseHeaders, respAnchor)
		phase(observe.PhaseResponseBody, next)
	}
	return dst
}

// TracingStats returns the span export counters (zero without export).
func (c *Core) TracingStats() observe.TracingStats { return c.spans.stats() }
