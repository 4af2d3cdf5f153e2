// Package accesslog writes one JSON line per request (zerolog): route,
// status, outcome, the deciding agent, time spent on agents per phase,
// body bytes, duration and the request's ids. It receives the dataplane's
// per-request summaries (dataplane.RequestRecorder), samples ordinary
// requests 1 in N while always logging blocks, redirects, failures and
// 5xx answers, and writes through a Writer that never blocks a request.
//
// A line:
//
//	{"level":"info","req":42,"corr":"0f3c…","route":"api","method":"POST",
//	 "host":"app.example","path":"/upload","client":"10.0.0.7","status":403,
//	 "outcome":"blocked","agent":"waf","reason":"blocked by waf",
//	 "agent_request_headers_us":85,"agent_request_body_us":240,
//	 "bytes_in":4096,"bytes_out":9,"duration_us":512,
//	 "time":"2026-05-09T07:30:00Z","message":"access"}
package accesslog

import (
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/dataplane"
)

// ErrAccessLogConfig: the configuration is invalid.
var ErrAccessLogConfig = errors.New("accesslog: invalid config")

// maxField clips logged request bytes (path, host) so one request cannot
// produce a huge line.
const maxField = 1024

// Config configures a Logger.
type Config struct {
	// SampleEvery logs one in this many ordinary requests (allowed, status
	// below 500); 1 logs every request (default). Every other outcome and
	// every 5xx is always logged.
	SampleEvery int
}

// DefaultConfig logs every request.
func DefaultConfig() Config { return Config{SampleEvery: 1} }

// Validate checks c, filling a zero SampleEvery with 1.
func (c *Config) Validate() error {
	if c.SampleEvery == 0 {
		c.SampleEvery = 1
	}
	if c.SampleEvery < 1 {
		return fmt.Errorf("%w: sample_every %d must be at least 1", ErrAccessLogConfig, c.SampleEvery)
	}
	return nil
}

// Stats are a Logger's counters.
type Stats struct {
	Logged     uint64 `json:"logged"`      // lines written
	SampledOut uint64 `json:"sampled_out"` // ordinary requests left out by sampling
}

// Logger is the access log. Use it as a dataplane.Observer (alone or
// through dataplane.Observers); it only acts on RecordRequest.
type Logger struct {
	dataplane.NopObserver
	log     zerolog.Logger
	every   uint64
	seq     atomic.Uint64
	logged  atomic.Uint64
	sampled atomic.Uint64
}

// New returns a Logger writing JSON lines to w (wrap a slow or blocking w
// in a Writer).
func New(w io.Writer, cfg Config) (*Logger, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Logger{
		log:   zerolog.New(w).Level(zerolog.InfoLevel).With().Timestamp().Logger(),
		every: uint64(cfg.SampleEvery),
	}, nil
}

// Stats returns the logger's counters.
func (l *Logger) Stats() Stats {
	return Stats{Logged: l.logged.Load(), SampledOut: l.sampled.Load()}
}

// always reports whether s is logged whatever the sampling.
func always(s *dataplane.RequestSummary) bool {
	return s.Outcome != dataplane.RequestAllowed || s.Status >= 500 || s.Aborted || s.FailedOpen > 0
}

// RecordRequest implements dataplane.RequestRecorder.
func (l *Logger) RecordRequest(s *dataplane.RequestSummary) {
	if l.every > 1 && !always(s) && l.seq.Add(1)%l.every != 0 {
		l.sampled.Add(1)
		return
	}
	e := l.log.Info()
	if e == nil {
		return
	}
	e.Uint64("req", s.ID).Bytes("corr", s.Correlation)
	if s.Route >= 0 {
		e.Str("route", s.RouteName)
	}
	e.Bytes("method", s.Method).Bytes("host", clip(s.Host)).Bytes("path", clip(s.Path))
	if len(s.ClientIP) > 0 {
		e.Bytes("client", s.ClientIP)
	}
	e.Int("status", s.Status).Str("outcome", s.Outcome.String())
	if s.AgentName != "" {
		e.Str("agent", s.AgentName)
	}
	if s.Reason != "" {
		e.Str("reason", s.Reason)
	}
	for p, d := range s.AgentTime {
		if d > 0 {
			e.Int64(agentFields[p], d.Microseconds())
		}
	}
	e.Int64("bytes_in", s.BytesIn).Int64("bytes_out", s.BytesOut).Int64("duration_us", s.Duration.Microseconds())
	if s.FailedOpen > 0 {
		e.Int("fail_open", s.FailedOpen)
	}
	if s.InspectionSkipped {
		e.Bool("inspection_skipped", true)
	}
	if s.Aborted {
		e.Bool("aborted", true)
	}
	e.Msg("access")
	l.logged.Add(1)
}

var agentFields = [dataplane.NumPhases]string{
	"agent_" + dataplane.PhaseNames[0] + "_us",
	"agent_" + dataplane.PhaseNames[1] + "_us",
	"agent_" + dataplane.PhaseNames[2] + "_us",
	"agent_" + dataplane.PhaseNames[3] + "_us",
}

func clip(b []byte) []byte {
	if len(b) > maxField {
		return b[:maxField]
	}
	return b
}

var (
	_ dataplane.Observer        = (*Logger)(nil)
	_ dataplane.RequestRecorder = (*Logger)(nil)
)
