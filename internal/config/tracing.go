package config

import (
	"time"
)

// Tracing is W3C trace context handling and the optional export of spans.
//
// A valid incoming traceparent (and its tracestate) is always passed on
// to the agents and the upstream; a malformed one is removed with its
// tracestate and counted. Generate puts a fresh traceparent on requests
// that arrive without a valid one.
type Tracing struct {
	// Generate makes a traceparent for requests without a valid one
	// (default false: such requests go on without one).
	Generate bool `yaml:"generate"`
	// OTLP exports spans (request, agent phases, upstream) over OTLP/gRPC;
	// off without an endpoint.
	OTLP OTLP `yaml:"otlp"`
}

// OTLP is the span exporter's setting.
type OTLP struct {
	// Endpoint is the collector's host:port (empty: no export).
	Endpoint string `yaml:"endpoint"`
	// Insecure sends without TLS (plaintext gRPC).
	Insecure bool `yaml:"insecure"`
	// ServiceName is the service.name of the spans (default "sidecar").
	ServiceName string `yaml:"service_name"`
	// SampleRatio is the share of requests without a sampled parent whose
	// spans are exported, 0..1 (default 1). A sampled incoming traceparent
	// is always followed.
	SampleRatio *float64 `yaml:"sample_ratio"`
	// Timeout bounds one export (default 10s).
	Timeout time.Duration `yaml:"timeout"`
	// MaxQueue caps the spans waiting for export; past it spans are dropped
	// and counted (default 2048).
	MaxQueue int `yaml:"max_queue"`
	// BatchSize is the most spans per export (default 512).
	BatchSize int `yaml:"batch_size"`
}

func (t *Tracing) setDefaults() {
	o := &t.OTLP
	if o.ServiceName == "" {
		o.ServiceName = "sidecar"
	}
	if o.SampleRatio == nil {
		one := 1.0
		o.SampleRatio = &one
	}
	setDur(&o.Timeout, 10*time.Second)
	setInt(&o.MaxQueue, 2048)
	setInt(&o.BatchSize, 512)
}

func (v *validator) tracing() {
	o := &v.c.Tracing.OTLP
	if o.Endpoint != "" {
		v.address("tracing.otlp.endpoint", o.Endpoint, false)
	}
	if r := o.SampleRatio; r != nil && (*r < 0 || *r > 1 || *r != *r) {
		v.failf("tracing.otlp.sample_ratio", "%v is not in 0..1", *r)
	}
	v.positive("tracing.otlp.timeout", o.Timeout)
	if o.MaxQueue < 1 || o.MaxQueue > 1<<20 {
		v.failf("tracing.otlp.max_queue", "%d is not in 1..%d", o.MaxQueue, 1<<20)
	}
	if o.BatchSize < 1 || o.BatchSize > o.MaxQueue {
		v.failf("tracing.otlp.batch_size", "%d is not in 1..max_queue (%d)", o.BatchSize, o.MaxQueue)
	}
}
