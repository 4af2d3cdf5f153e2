// Package accesslog writes one JSON line per request (zerolog): route,
// status, outcome, the deciding agent, time spent on agents per phase,
// body bytes, duration and the request's ids, or the fields configured
// (Config.Fields). It receives the dataplane's per-request summaries
// (observe.RequestRecorder), samples ordinary requests 1 in N while
// always logging blocks, redirects, failures and 5xx answers, and writes
// through a Writer that never blocks a request, to a File that can be
// reopened at its path after a log rotation renamed it.
//
// A line:
//
//	{"level":"info","req":42,"corr":"0f3c…","route":"api","method":"POST",
//	 "protocol":"HTTP/1.1","host":"app.example","path":"/upload","client":"10.0.0.7","status":403,
//	 "outcome":"blocked","agent":"waf","reason":"blocked by waf",
//	 "agent_request_headers_us":85,"agent_request_body_us":240,
//	 "bytes_in":4096,"bytes_out":9,"duration_us":512,
//	 "time":"2026-05-09T07:30:00Z","message":"access"}
package accesslog

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/observe"
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
	// Fields are the fields of a line, names of config.AccessLogFields
	// (nil: config.DefaultAccessLogFields). Lines carry them in a fixed
	// order whatever the order here, with "level" and "message".
	Fields []string
}

// DefaultConfig logs every request with the default fields.
func DefaultConfig() Config { return Config{SampleEvery: 1} }

// Validate checks c, filling a zero SampleEvery with 1.
func (c *Config) Validate() error {
	if c.SampleEvery == 0 {
		c.SampleEvery = 1
	}
	if c.SampleEvery < 1 {
		return fmt.Errorf("%w: sample_every %d must be at least 1", ErrAccessLogConfig, c.SampleEvery)
	}
	if _, err := fieldMask(c.Fields); err != nil {
		return err
	}
	return nil
}

// field is one bit of a line's field set, in config.AccessLogFields
// order.
type field uint32

const (
	fTime field = 1 << iota
	fReq
	fCorr
	fRoute
	fMethod
	fHost
	fPath
	fClient
	fStatus
	fOutcome
	fAgent
	fReason
	fAgentTime
	fBytesIn
	fBytesOut
	fDuration
	fFailOpen
	fInspectionSkipped
	fAborted
	fStart
	fReqInspected
	fRespInspected
	fReqMutated
	fRespMutated
	fProtocol
	numFields = iota
)

// fieldMask turns field names into the set RecordRequest tests.
func fieldMask(names []string) (field, error) {
	if names == nil {
		names = config.DefaultAccessLogFields
	}
	var m field
	for _, n := range names {
		i := slices.Index(config.AccessLogFields, n)
		if i < 0 {
			return 0, fmt.Errorf("%w: unknown field %q (known: %s)", ErrAccessLogConfig, n, strings.Join(config.AccessLogFields, ", "))
		}
		m |= 1 << i
	}
	return m, nil
}

// Stats are a Logger's counters.
type Stats struct {
	Logged     uint64 `json:"logged"`      // lines written
	SampledOut uint64 `json:"sampled_out"` // ordinary requests left out by sampling
}

// Logger is the access log. Use it as a observe.Observer (alone or
// through observe.Observers); it only acts on RecordRequest.
type Logger struct {
	observe.NopObserver
	log     zerolog.Logger
	fields  field
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
	fields, _ := fieldMask(cfg.Fields)
	log := zerolog.New(w).Level(zerolog.InfoLevel)
	if fields&fTime != 0 {
		log = log.With().Timestamp().Logger()
	}
	return &Logger{log: log, fields: fields, every: uint64(cfg.SampleEvery)}, nil
}

// Stats returns the logger's counters.
func (l *Logger) Stats() Stats {
	return Stats{Logged: l.logged.Load(), SampledOut: l.sampled.Load()}
}

// always reports whether s is logged whatever the sampling.
func always(s *observe.RequestSummary) bool {
	return s.Outcome != observe.RequestAllowed || s.Status >= 500 || s.Aborted || s.FailedOpen > 0
}

// RecordRequest implements observe.RequestRecorder.
func (l *Logger) RecordRequest(s *observe.RequestSummary) {
	if l.every > 1 && !always(s) && l.seq.Add(1)%l.every != 0 {
		l.sampled.Add(1)
		return
	}
	e := l.log.Info()
	if e == nil {
		return
	}
	f := l.fields
	if f&fReq != 0 {
		e.Uint64("req", s.ID)
	}
	if f&fCorr != 0 {
		e.Bytes("corr", s.Correlation)
	}
	if f&fRoute != 0 && s.Route >= 0 {
		e.Str("route", s.RouteName)
	}
	if f&fMethod != 0 {
		e.Bytes("method", s.Method)
	}
	if f&fProtocol != 0 && len(s.Protocol) > 0 {
		e.Bytes("protocol", s.Protocol)
	}
	if f&fHost != 0 {
		e.Bytes("host", clip(s.Host))
	}
	if f&fPath != 0 {
		e.Bytes("path", clip(s.Path))
	}
	if f&fClient != 0 && len(s.ClientIP) > 0 {
		e.Bytes("client", s.ClientIP)
	}
	if f&fStatus != 0 {
		e.Int("status", s.Status)
	}
	if f&fOutcome != 0 {
		e.Str("outcome", s.Outcome.String())
	}
	if f&fAgent != 0 && s.AgentName != "" {
		e.Str("agent", s.AgentName)
	}
	if f&fReason != 0 && s.Reason != "" {
		e.Str("reason", s.Reason)
	}
	if f&fAgentTime != 0 {
		for p, d := range s.AgentTime {
			if d > 0 {
				e.Int64(agentFields[p], d.Microseconds())
			}
		}
	}
	if f&fBytesIn != 0 {
		e.Int64("bytes_in", s.BytesIn)
	}
	if f&fBytesOut != 0 {
		e.Int64("bytes_out", s.BytesOut)
	}
	if f&fDuration != 0 {
		e.Int64("duration_us", s.Duration.Microseconds())
	}
	if f&fFailOpen != 0 && s.FailedOpen > 0 {
		e.Int("fail_open", s.FailedOpen)
	}
	if f&fInspectionSkipped != 0 && s.InspectionSkipped {
		e.Bool("inspection_skipped", true)
	}
	if f&fAborted != 0 && s.Aborted {
		e.Bool("aborted", true)
	}
	if f&fStart != 0 && !s.Start.IsZero() {
		e.Time("start", s.Start)
	}
	if f&fReqInspected != 0 {
		e.Int64("request_bytes_inspected", s.Inspected[0])
	}
	if f&fRespInspected != 0 {
		e.Int64("response_bytes_inspected", s.Inspected[1])
	}
	if f&fReqMutated != 0 {
		e.Int64("request_bytes_mutated", s.Mutated[0])
	}
	if f&fRespMutated != 0 {
		e.Int64("response_bytes_mutated", s.Mutated[1])
	}
	e.Msg("access")
	l.logged.Add(1)
}

var agentFields = [observe.NumPhases]string{
	"agent_" + observe.PhaseNames[0] + "_us",
	"agent_" + observe.PhaseNames[1] + "_us",
	"agent_" + observe.PhaseNames[2] + "_us",
	"agent_" + observe.PhaseNames[3] + "_us",
}

func clip(b []byte) []byte {
	if len(b) > maxField {
		return b[:maxField]
	}
	return b
}

var (
	_ observe.Observer        = (*Logger)(nil)
	_ observe.RequestRecorder = (*Logger)(nil)
)
