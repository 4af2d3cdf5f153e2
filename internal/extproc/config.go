package extproc

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/grpcclient"
	"github.com/zentinelproxy/sidecar/internal/redial"
)

// ErrExtProcConfig: the configuration of an ext_proc agent is invalid.
var ErrExtProcConfig = errors.New("extproc: invalid config")

// Header and body send modes, as Envoy names them.
type (
	// HeaderMode is SEND or SKIP (DEFAULT reads as the phase's default).
	HeaderMode = extprocfilter.ProcessingMode_HeaderSendMode
	// BodyMode is NONE, STREAMED, BUFFERED or BUFFERED_PARTIAL.
	BodyMode = extprocfilter.ProcessingMode_BodySendMode
)

// Mode is one processing mode: what is sent to the processor for each
// phase of a request. Its zero value is Envoy's default: both header
// phases sent, no body, no trailers.
type Mode struct {
	RequestHeader   HeaderMode
	ResponseHeader  HeaderMode
	RequestBody     BodyMode
	ResponseBody    BodyMode
	RequestTrailer  HeaderMode
	ResponseTrailer HeaderMode
}

// Sends reports whether a header mode sends the headers; DEFAULT means
// SEND for headers (def true) and SKIP for trailers (def false).
func sends(m HeaderMode, def bool) bool {
	switch m {
	case extprocfilter.ProcessingMode_SEND:
		return true
	case extprocfilter.ProcessingMode_SKIP:
		return false
	}
	return def
}

// ModeFromProto converts Envoy's ProcessingMode (nil: the zero Mode).
func ModeFromProto(p *extprocfilter.ProcessingMode) Mode {
	return Mode{
		RequestHeader:   p.GetRequestHeaderMode(),
		ResponseHeader:  p.GetResponseHeaderMode(),
		RequestBody:     p.GetRequestBodyMode(),
		ResponseBody:    p.GetResponseBodyMode(),
		RequestTrailer:  p.GetRequestTrailerMode(),
		ResponseTrailer: p.GetResponseTrailerMode(),
	}
}

// String writes m in the form ParseMode reads.
func (m Mode) String() string {
	return fmt.Sprintf("request_header_mode=%s,response_header_mode=%s,request_body_mode=%s,response_body_mode=%s,request_trailer_mode=%s,response_trailer_mode=%s",
		m.RequestHeader, m.ResponseHeader, m.RequestBody, m.ResponseBody, m.RequestTrailer, m.ResponseTrailer)
}

// check refuses what the dataplane cannot carry: trailers and the body
// modes that need a full-duplex exchange.
func (m Mode) check() error {
	if sends(m.RequestTrailer, false) || sends(m.ResponseTrailer, false) {
		return errors.New("trailer mode SEND is not supported (the proxy does not pass trailers to agents)")
	}
	for _, b := range []BodyMode{m.RequestBody, m.ResponseBody} {
		switch b {
		case extprocfilter.ProcessingMode_NONE, extprocfilter.ProcessingMode_STREAMED,
			extprocfilter.ProcessingMode_BUFFERED, extprocfilter.ProcessingMode_BUFFERED_PARTIAL:
		default:
			return fmt.Errorf("body mode %s is not supported (want NONE, STREAMED, BUFFERED or BUFFERED_PARTIAL)", b)
		}
	}
	return nil
}

// sameOverride compares an override with an allowed mode as Envoy does:
// request_header_mode is not part of the comparison.
func (m Mode) sameOverride(o Mode) bool {
	m.RequestHeader, o.RequestHeader = 0, 0
	return m == o
}

// ParseMode reads a processing mode written as comma-separated
// key=VALUE pairs, for example
// "request_body_mode=BUFFERED,response_header_mode=SKIP". Keys are the
// fields of Envoy's ProcessingMode; values its enum names (any letter
// case). Keys left out keep their zero value (Envoy's default).
func ParseMode(s string) (Mode, error) {
	var m Mode
	seen := map[string]bool{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			return m, fmt.Errorf("%q is not key=VALUE", part)
		}
		k, v = strings.TrimSpace(k), strings.ToUpper(strings.TrimSpace(v))
		if seen[k] {
			return m, fmt.Errorf("%s given twice", k)
		}
		seen[k] = true
		var hp *HeaderMode
		var bp *BodyMode
		switch k {
		case "request_header_mode":
			hp = &m.RequestHeader
		case "response_header_mode":
			hp = &m.ResponseHeader
		case "request_trailer_mode":
			hp = &m.RequestTrailer
		case "response_trailer_mode":
			hp = &m.ResponseTrailer
		case "request_body_mode":
			bp = &m.RequestBody
		case "response_body_mode":
			bp = &m.ResponseBody
		default:
			return m, fmt.Errorf("unknown key %q (want request_header_mode, response_header_mode, request_body_mode, response_body_mode, request_trailer_mode, response_trailer_mode)", k)
		}
		if hp != nil {
			n, ok := extprocfilter.ProcessingMode_HeaderSendMode_value[v]
			if !ok {
				return m, fmt.Errorf("%s: unknown header mode %q (want DEFAULT, SEND or SKIP)", k, v)
			}
			*hp = HeaderMode(n)
			continue
		}
		n, ok := extprocfilter.ProcessingMode_BodySendMode_value[v]
		if !ok {
			return m, fmt.Errorf("%s: unknown body mode %q", k, v)
		}
		*bp = BodyMode(n)
	}
	return m, nil
}

// Config is the proxy side of one ext_proc agent.
type Config struct {
	// Name is the agent's configured name.
	Name string
	// Address is the processor's gRPC target (host:port or unix:/path).
	Address string
	// Conns is how many HTTP/2 connections carry the streams.
	Conns int
	// MaxInFlight caps requests in flight (one stream each) per
	// connection; MaxQueue caps how many wait for a slot.
	MaxInFlight int
	MaxQueue    int
	// DialTimeout bounds connecting.
	DialTimeout time.Duration
	// MessageTimeout is Envoy's message_timeout: the wait for each
	// response of the processor.
	MessageTimeout time.Duration
	// GraceTimeout bounds how long a finished request's stream may take to
	// end after the proxy half-closed it; then it is canceled.
	GraceTimeout time.Duration
	// Mode is the processing mode of every request, until a processor's
	// mode_override changes it for one request.
	Mode Mode
	// AllowModeOverride honours mode_override (Envoy's allow_mode_override);
	// AllowedOverrides, when set, limits it to these modes (Envoy's
	// allowed_override_modes) and implies AllowModeOverride.
	AllowModeOverride bool
	AllowedOverrides  []Mode
	// RequestAttrs and ResponseAttrs name the attributes sent with the
	// first message of each direction (RequestAttributes, ResponseAttributes).
	RequestAttrs  []string
	ResponseAttrs []string
	// Metadata is sent as the metadata_context of every message, as Envoy
	// sends it: filter_metadata namespace → key → string value.
	Metadata map[string]map[string]string
	// BufferLimit caps the body bytes held for one BUFFERED or
	// BUFFERED_PARTIAL phase (Envoy's per-stream buffer limit): a BUFFERED
	// body over it fails the request as the processor's error; a
	// BUFFERED_PARTIAL body is sent to the processor when it reaches it.
	BufferLimit int
	// MaxMessageSize caps messages both ways.
	MaxMessageSize int
	// TLS secures the connections (mTLS with a client certificate).
	TLS grpcclient.TLSConfig
	// Logger receives connection events; it carries the agent field.
	Logger zerolog.Logger
}

// Option names of transport ext_proc (config agents[].options).
var Options = append(slices.Clone(grpcclient.TLSOptions),
	"processing_mode", "allow_mode_override", "allowed_override_modes",
	"request_attributes", "response_attributes", "metadata", "buffer_limit",
)

// DefaultBufferLimit is the default of option buffer_limit (1 MiB);
// MaxBufferLimit its largest value (8 MiB: a held body is sent in one
// message, and messages are limited to 10 MiB).
const (
	DefaultBufferLimit = 1 << 20
	MaxBufferLimit     = 8 << 20
)

// DefaultConfig returns a Config with defaults for the agent at address.
func DefaultConfig(name, address string) Config {
	return Config{
		Name:           name,
		Address:        address,
		Conns:          1,
		MaxInFlight:    agentmux.DefaultMaxInFlight,
		MaxQueue:       agentmux.DefaultMaxQueue,
		DialTimeout:    redial.DefaultConnectTimeout + redial.DefaultHandshakeTimeout,
		MessageTimeout: agentmux.DefaultMessageTimeout,
		GraceTimeout:   time.Second,
		BufferLimit:    DefaultBufferLimit,
		MaxMessageSize: 10 << 20,
		Logger:         zerolog.Nop(),
	}
}

// ApplyOptions reads the transport's options into c.
func (c *Config) ApplyOptions(opts map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(opts)) {
		v := opts[k]
		var err error
		switch k {
		case "processing_mode":
			c.Mode, err = ParseMode(v)
		case "allow_mode_override":
			c.AllowModeOverride, err = strconv.ParseBool(v)
		case "allowed_override_modes":
			c.AllowedOverrides = c.AllowedOverrides[:0]
			for s := range strings.SplitSeq(v, ";") {
				if strings.TrimSpace(s) == "" {
					continue
				}
				var m Mode
				if m, err = ParseMode(s); err != nil {
					break
				}
				c.AllowedOverrides = append(c.AllowedOverrides, m)
			}
		case "request_attributes":
			c.RequestAttrs, err = attrList(v, attrRequest)
		case "response_attributes":
			c.ResponseAttrs, err = attrList(v, attrResponse)
		case "metadata":
			c.Metadata, err = parseMetadata(v)
		case "buffer_limit":
			var n int64
			n, err = strconv.ParseInt(v, 10, 64)
			// A held body travels in one message, under the 10 MiB cap.
			if err == nil && (n < 1<<10 || n > MaxBufferLimit) {
				err = fmt.Errorf("%d is not in 1024..%d bytes", n, MaxBufferLimit)
			}
			c.BufferLimit = int(n)
		default:
			// The TLS options are shared with transport grpc.
			var tls bool
			if tls, err = c.TLS.ApplyOption(k, v); !tls {
				err = fmt.Errorf("unknown option (known: %s)", strings.Join(Options, ", "))
			}
		}
		if err != nil {
			return &OptionError{Key: k, err: fmt.Errorf("%w: option %s: %v", ErrExtProcConfig, k, err)}
		}
	}
	return nil
}

// OptionError is an invalid option: Key names it (for the line of the
// configuration error); it wraps ErrExtProcConfig.
type OptionError struct {
	Key string
	err error
}

func (e *OptionError) Error() string { return e.err.Error() }

// Unwrap returns the wrapped ErrExtProcConfig error.
func (e *OptionError) Unwrap() error { return e.err }

func attrList(v string, p attrPhase) ([]string, error) {
	var out []string
	for a := range strings.SplitSeq(v, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if err := checkAttr(a, p); err != nil {
			return nil, err
		}
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out, nil
}

// parseMetadata reads comma-separated namespace/key=value entries.
func parseMetadata(v string) (map[string]map[string]string, error) {
	out := map[string]map[string]string{}
	for e := range strings.SplitSeq(v, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		nk, val, ok := strings.Cut(e, "=")
		ns, key, ok2 := strings.Cut(nk, "/")
		if !ok || !ok2 || ns == "" || key == "" {
			return nil, fmt.Errorf("%q is not namespace/key=value", e)
		}
		if out[ns] == nil {
			out[ns] = map[string]string{}
		}
		out[ns][key] = val
	}
	return out, nil
}

// Validate reports the first invalid field.
func (c *Config) Validate() error {
	fail := func(f string, a ...any) error {
		return fmt.Errorf("%w: agent %q: %s", ErrExtProcConfig, c.Name, fmt.Sprintf(f, a...))
	}
	switch {
	case c.Name == "":
		return fmt.Errorf("%w: name is empty", ErrExtProcConfig)
	case c.Address == "":
		return fail("address is empty")
	case c.Conns < 1 || c.Conns > 64:
		return fail("conns %d not in 1..64", c.Conns)
	case c.MaxInFlight < 1:
		return fail("max_in_flight must be positive")
	case c.MaxQueue < 0:
		return fail("max_queue must not be negative")
	case c.DialTimeout <= 0:
		return fail("dial timeout must be positive")
	case c.MessageTimeout < 0 || c.GraceTimeout < 0:
		return fail("timeouts must not be negative")
	case c.BufferLimit < 1<<10 || c.BufferLimit > MaxBufferLimit:
		return fail("buffer_limit %d not in 1024..%d", c.BufferLimit, MaxBufferLimit)
	case c.MaxMessageSize < c.BufferLimit+64<<10:
		return fail("max message size below buffer_limit plus 64KiB")
	case (c.TLS.CertFile == "") != (c.TLS.KeyFile == ""):
		return fail("tls_cert_file and tls_key_file go together")
	case !c.TLS.On() && c.TLS.ServerName != "":
		return fail("tls_server_name without tls")
	}
	if err := c.Mode.check(); err != nil {
		return fail("processing_mode: %v", err)
	}
	for _, a := range c.RequestAttrs {
		if err := checkAttr(a, attrRequest); err != nil {
			return fail("request_attributes: %v", err)
		}
	}
	for _, a := range c.ResponseAttrs {
		if err := checkAttr(a, attrResponse); err != nil {
			return fail("response_attributes: %v", err)
		}
	}
	for i, m := range c.AllowedOverrides {
		if err := m.check(); err != nil {
			return fail("allowed_override_modes[%d]: %v", i, err)
		}
	}
	return nil
}

// overridable reports whether a mode_override may change the mode at all.
func (c *Config) overridable() bool { return c.AllowModeOverride || len(c.AllowedOverrides) > 0 }

// possibleModes are the modes a request may run under: the configured
// one and every allowed override; ok is false when any override is
// allowed (then every phase is possible).
func (c *Config) possibleModes() (modes []Mode, bounded bool) {
	modes = []Mode{c.Mode}
	if !c.overridable() {
		return modes, true
	}
	if len(c.AllowedOverrides) == 0 {
		return modes, false
	}
	for _, m := range c.AllowedOverrides {
		m.RequestHeader = c.Mode.RequestHeader // not overridable
		modes = append(modes, m)
	}
	return modes, true
}
