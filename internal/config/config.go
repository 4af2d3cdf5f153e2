// Package config is the sidecar's YAML configuration: listeners, upstreams,
// agents and the routes that tie them together, with defaults and a
// validation that names the offending key and its line.
//
//	listeners:
//	  - name: public
//	    address: 127.0.0.1:8080
//	upstreams:
//	  - name: app
//	    address: 127.0.0.1:9000
//	agents:
//	  - name: waf
//	    transport: uds
//	    address: /run/waf.sock
//	    failure_mode: closed
//	routes:
//	  - name: default
//	    upstream: app
//	    agents: [waf]
//
// Durations are Go durations ("250ms", "5s"); sizes are bytes or a number
// with KiB, MiB, GiB (1024-based) or KB, MB, GB (1000-based).
//
// Parse and Load decode, apply defaults and validate; a Config built in
// code goes through SetDefaults and Validate the same way.
package config

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"

	"github.com/rs/zerolog"
	"gopkg.in/yaml.v3"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/redial"
	"github.com/zentinelproxy/sidecar/internal/udswriter"
	"github.com/zentinelproxy/sidecar/uds"
)

// Errors. Every error this package returns wraps one of them.
var (
	// ErrConfigSyntax: the file is not valid YAML or has the wrong shape.
	ErrConfigSyntax = errors.New("config: syntax error")
	// ErrConfigInvalid: a value is missing, out of range or inconsistent.
	ErrConfigInvalid = errors.New("config: invalid configuration")
	// ErrConfigUnreadable: the file cannot be read (missing, not
	// permitted, a directory); the error also wraps the cause
	// (fs.ErrNotExist, fs.ErrPermission, …).
	ErrConfigUnreadable = errors.New("config: cannot read the file")
)

// readError is a configuration file that cannot be read.
type readError struct {
	path string
	err  error
}

func (e *readError) Error() string   { return "config: cannot read " + e.path + ": " + e.err.Error() }
func (e *readError) Unwrap() []error { return []error{ErrConfigUnreadable, e.err} }

// Transports the configuration accepts. The dataplane builds an agent of
// each kind through a factory registered for the name.
const (
	TransportUDS     = "uds"
	TransportGRPC    = "grpc"
	TransportReverse = "reverse"
	// TransportExtProc runs an Envoy External Processing server
	// (envoy.service.ext_proc.v3.ExternalProcessor), one gRPC stream per
	// HTTP request; its options are checked by package transports.
	TransportExtProc = "ext_proc"
	// TransportExtAuthz runs an Envoy external authorization server
	// (envoy.service.auth.v3.Authorization), one Check call per HTTP
	// request; its options are checked by package transports.
	TransportExtAuthz = "ext_authz"
	// TransportHTTPAuth runs an HTTP forward-auth endpoint (nginx
	// auth_request, Traefik ForwardAuth), one subrequest per HTTP
	// request to the URL in address; its options are checked by package
	// transports.
	TransportHTTPAuth = "http_auth"
)

// Payload encodings of an agent's connections (uds and reverse).
const (
	// EncodingAuto takes protobuf payloads when the agent declares them.
	EncodingAuto = "auto"
	// EncodingJSON keeps JSON payloads.
	EncodingJSON = "json"
)

// Failure modes of an agent.
const (
	// FailClosed answers 503/504 when the agent cannot decide.
	FailClosed = "closed"
	// FailOpen passes the request, marked, when the agent cannot decide.
	FailOpen = "open"
)

// Body modes of an agent on a route.
const (
	// BodyAuto streams when the agent declares supports_streaming and
	// buffers otherwise.
	BodyAuto = "auto"
	// BodyNone never sends bodies to the agent.
	BodyNone = "none"
	// BodyBuffered reads the body up to Limit before the next hop is
	// contacted, so the agent decides on the whole body.
	BodyBuffered = "buffered"
	// BodyStreaming sends each chunk as it arrives and forwards it as soon
	// as the agent answered for it.
	BodyStreaming = "streaming"
)

// Over-limit actions of a buffered body.
const (
	// OverLimitReject refuses the message: 413 for a request body, 502 for
	// a response body.
	OverLimitReject = "reject"
	// OverLimitSkip passes the body uninspected and says so in the
	// X-Sidecar-Inspection: skipped header and a counter.
	OverLimitSkip = "skip"
)

// Host header handling of a route.
const (
	// HostPreserve forwards the client's Host header (default).
	HostPreserve = "preserve"
	// HostUpstream sends the upstream's address as Host.
	HostUpstream = "upstream"
)

// Limits on sizes. The chunk limit keeps a base64-encoded chunk far below
// the 16 MiB frame and 10 MiB gRPC message limits.
const (
	MaxChunkSize  = 4 << 20
	MinChunkSize  = 1 << 10
	MaxBodyLimit  = 256 << 20
	MaxBufferSize = 1 << 20
)

// Config is the whole configuration.
type Config struct {
	Listeners []Listener `yaml:"listeners"`
	Upstreams []Upstream `yaml:"upstreams"`
	Agents    []Agent    `yaml:"agents"`
	Routes    []Route    `yaml:"routes"`
	Logging   Logging    `yaml:"logging"`
	Tracing   Tracing    `yaml:"tracing"`
	Admin     Admin      `yaml:"admin"`
	AccessLog AccessLog  `yaml:"access_log"`
	// RateLimitService is the Envoy rate limit service of routes'
	// global_rate_limit (absent: none).
	RateLimitService *RateLimitService `yaml:"rate_limit_service"`

	// lines maps a key path ("routes[0].agents[1]") to its line in the
	// file, so that validation errors point at it.
	lines map[string]int
}

// Listener is an address the sidecar accepts HTTP/1.1 on.
type Listener struct {
	// Name labels the listener in logs.
	Name string `yaml:"name"`
	// Address is host:port, or unix:/path for a Unix socket.
	Address string `yaml:"address"`
	// ReadTimeout bounds reading a request's headers (default 10s).
	ReadTimeout time.Duration `yaml:"read_timeout"`
	// IdleTimeout bounds the wait for the next request on a keep-alive
	// connection (default 60s).
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// BodyTimeout bounds each read or write of a streamed body on the
	// client side: a client that stalls longer is dropped (default 60s).
	BodyTimeout time.Duration `yaml:"body_timeout"`
	// ReadBufferSize is the per-connection read buffer; it also caps the
	// request header size (default 16KiB).
	ReadBufferSize Size `yaml:"read_buffer_size"`
	// WriteBufferSize is the per-connection write buffer (default 16KiB).
	WriteBufferSize Size `yaml:"write_buffer_size"`
	// MaxConnections caps concurrent client connections. Unset (0), it is
	// what the file descriptor limit allows (RLIMIT_NOFILE, raised to its
	// hard limit at start, minus every upstream connection and a reserve),
	// at most 65536; a value above that limit is lowered to it with a
	// warning.
	MaxConnections int `yaml:"max_connections"`
	// MaxRequestBody rejects larger request bodies with 413 (0: no limit).
	MaxRequestBody Size `yaml:"max_request_body"`
	// BodyMinRate is the least average rate, in bytes per second, at
	// which a request body must arrive (absent: DefaultBodyMinRate; 0:
	// none). A body that falls more than body_timeout behind it is
	// answered 408; only the time spent waiting on the client counts.
	BodyMinRate *Size `yaml:"body_min_rate"`
	// TrustForwarded keeps the client's X-Forwarded-Proto/-Host and appends
	// to its X-Forwarded-For. Off (default), the sidecar is the edge and
	// replaces all three.
	TrustForwarded bool `yaml:"trust_forwarded"`
	// DisconnectCheck is how often requests that wait on an agent or the
	// upstream are checked for a client that went away (default 100ms).
	DisconnectCheck time.Duration `yaml:"disconnect_check"`
	// TLS serves the listener over TLS (absent: plain HTTP).
	TLS *ListenerTLS `yaml:"tls"`
	// TunnelIdleTimeout closes an Upgrade tunnel (WebSocket) when no byte
	// went either way for this long (default 5m).
	TunnelIdleTimeout time.Duration `yaml:"tunnel_idle_timeout"`
	// MaxTunnels caps the Upgrade tunnels open at once on the listener;
	// past it an upgrade request gets 503 (default 1024).
	MaxTunnels int `yaml:"max_tunnels"`
	// LingeringTimeout bounds a lingering close: a connection closed while
	// the client may still be sending (a request refused before its body
	// was read) is shut down for writing, and what the client sends is
	// read and discarded until it closes, for at most this long (default
	// 5s).
	LingeringTimeout time.Duration `yaml:"lingering_timeout"`
	// MaxLingeringBytes bounds the bytes a lingering close discards
	// (default 1MiB).
	MaxLingeringBytes Size `yaml:"max_lingering_bytes"`
	// Protocols are the HTTP versions the listener serves: http1, h2
	// (HTTP/2 over TLS, chosen by ALPN) and h2c (cleartext HTTP/2 with
	// prior knowledge). Default: [http1, h2] with tls, [http1] without.
	Protocols []string `yaml:"protocols"`
	// HTTP2 bounds the listener's HTTP/2 connections.
	HTTP2 ListenerHTTP2 `yaml:"http2"`
	// RateLimit is a local rate limit over every request of the
	// listener, checked before routing (absent: none; stage must be
	// before_agents).
	RateLimit *RateLimit `yaml:"rate_limit"`
}

// Listener protocols (Listener.Protocols) and upstream protocols
// (Upstream.Protocol).
const (
	ProtoHTTP1 = "http1"
	ProtoH2    = "h2"
	ProtoH2C   = "h2c"
)

// Serves reports whether the listener serves protocol p.
func (l *Listener) Serves(p string) bool {
	for _, q := range l.Protocols {
		if q == p {
			return true
		}
	}
	return false
}

// ListenerHTTP2 are the limits of a listener's HTTP/2 connections. An
// HTTP/2 connection with no stream open is closed (GOAWAY) after the
// listener's idle_timeout.
type ListenerHTTP2 struct {
	// MaxConcurrentStreams caps the streams a client may have open on
	// one connection; more are refused (REFUSED_STREAM) (default 100).
	MaxConcurrentStreams int `yaml:"max_concurrent_streams"`
	// MaxHeaderListSize caps a request's header list (names, values and
	// 32 bytes per field, RFC 9113 §6.5.2): larger ones are answered 431
	// (default: the listener's read_buffer_size, the HTTP/1 bound).
	MaxHeaderListSize Size `yaml:"max_header_list_size"`
	// MaxReadFrameSize is the largest frame the listener accepts
	// (default 16KiB, the protocol's minimum; at most 16MiB-1).
	MaxReadFrameSize Size `yaml:"max_read_frame_size"`
}

// DefaultBodyMinRate is body_min_rate when absent: a body must average
// 1 KiB/s, with body_timeout (60s by default) of slack.
const DefaultBodyMinRate Size = 1 << 10

// MinBodyRate is the listener's body_min_rate (0: none).
func (l *Listener) MinBodyRate() Size {
	if l.BodyMinRate == nil {
		return DefaultBodyMinRate
	}
	return *l.BodyMinRate
}

// Upstream is the service the sidecar proxies to.
type Upstream struct {
	Name string `yaml:"name"`
	// Address is host:port, or unix:/path.
	Address string `yaml:"address"`
	// Endpoints lists the addresses of several instances of the service
	// (instead of Address); requests are balanced over those available.
	Endpoints []string `yaml:"endpoints"`
	// Balance is round_robin (default) or least_in_flight.
	Balance string `yaml:"balance"`
	// EndpointAttempts caps the endpoints one request tries when a
	// connection fails before the request was taken (default 3; 1: no
	// retry on another endpoint).
	EndpointAttempts int `yaml:"endpoint_attempts"`
	// HealthCheck is the active health check (endpoints.go).
	HealthCheck HealthCheck `yaml:"health_check"`
	// Ejection is the passive health check.
	Ejection Ejection `yaml:"ejection"`
	// Resolve re-resolves endpoints given by host name.
	Resolve Resolve `yaml:"resolve"`
	// ConnectTimeout bounds connection setup (default 5s).
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	// ResponseTimeout bounds the wait for the response headers once the
	// request is sent (default 30s); past it the client gets 504.
	ResponseTimeout time.Duration `yaml:"response_timeout"`
	// IdleTimeout bounds each read or write of a streamed body (default 60s).
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxConns caps connections to the upstream (default 1024).
	MaxConns int `yaml:"max_conns"`
	// MaxConnWait is how long a request waits for a free connection when
	// MaxConns are busy before it gets 503 (default 1s).
	MaxConnWait time.Duration `yaml:"max_conn_wait"`
	// KeepAlive closes pooled connections idle longer than this
	// (default 15s; keep it below the upstream's own keep-alive timeout).
	KeepAlive time.Duration `yaml:"keepalive"`
	// ReadBufferSize caps the response header size (default 16KiB).
	ReadBufferSize Size `yaml:"read_buffer_size"`
	// WriteBufferSize is the per-connection write buffer (default 16KiB).
	WriteBufferSize Size `yaml:"write_buffer_size"`
	// TLS connects to the upstream over TLS (absent: plain HTTP).
	TLS *UpstreamTLS `yaml:"tls"`
	// Protocol is the HTTP version spoken to the upstream: http1
	// (default), h2 (HTTP/2 over TLS; tls required) or h2c (cleartext
	// HTTP/2 with prior knowledge).
	Protocol string `yaml:"protocol"`
}

// Agent is one policy agent and its defaults for every route using it.
type Agent struct {
	// Name identifies the agent; it may appear in the
	// X-Sidecar-Fail-Open header, so it is limited to [A-Za-z0-9._-].
	Name string `yaml:"name"`
	// Transport is uds, grpc, reverse, ext_proc, ext_authz or http_auth.
	Transport string `yaml:"transport"`
	// Address is the socket path (uds), host:port (grpc, ext_proc,
	// ext_authz), the listen address for registrations (reverse) or the
	// authorization URL (http_auth).
	Address string `yaml:"address"`
	// Conns is how many connections to keep to the agent (default 1).
	Conns int `yaml:"conns"`
	// MaxInFlight caps requests in flight per connection (default 1024).
	MaxInFlight int `yaml:"max_in_flight"`
	// MaxQueue caps requests waiting for a slot (default 1024).
	MaxQueue int `yaml:"max_queue"`
	// MaxPendingBytes caps the bytes queued or being written per
	// connection (uds and reverse; default 4MiB): past it an event waits
	// for room within its deadline, and pings, pongs and cancels that find
	// no room are dropped, so a peer that stops reading cannot make the
	// proxy buffer without bound.
	MaxPendingBytes Size `yaml:"max_pending_bytes"`
	// PayloadEncoding of the frames after the handshake (uds and reverse):
	// auto (default) takes protobuf payloads when the agent declares
	// supports_protobuf_payloads, json keeps JSON whatever it declares
	// (readable in a packet capture, or for an agent whose protobuf
	// support is suspect).
	PayloadEncoding string `yaml:"payload_encoding"`
	// Timeouts of the conversation.
	Timeouts AgentTimeouts `yaml:"timeouts"`
	// FailureMode is closed (default) or open.
	FailureMode string `yaml:"failure_mode"`
	// FailureStatus is the status a fail-closed failure answers, a
	// timeout excepted (504): 0 is the transport's default (FailStatus).
	FailureStatus int `yaml:"failure_status"`
	// RequestBody and ResponseBody say how bodies reach the agent.
	RequestBody  BodyPolicy `yaml:"request_body"`
	ResponseBody BodyPolicy `yaml:"response_body"`
	// Limits bound what one reply of the agent may do to headers.
	Limits AgentLimits `yaml:"limits"`
	// Options are transport-specific settings (TLS files, tokens, …),
	// validated by the transport.
	Options map[string]string `yaml:"options"`
	// CircuitBreaker stops consulting the agent after consecutive
	// failures, for a cool-down (off by default).
	CircuitBreaker CircuitBreaker `yaml:"circuit_breaker"`
	// Shadow makes the agent observe-only: it gets the events of its
	// routes an enforcing agent would get, but no request waits for it and
	// its decisions are only logged and counted.
	Shadow bool `yaml:"shadow"`
	// ShadowQueue bounds the events waiting for a shadow agent; more are
	// dropped and counted (default 1024).
	ShadowQueue int `yaml:"shadow_queue"`
	// ShadowWorkers caps the events of a shadow agent in flight at once
	// (default 16).
	ShadowWorkers int `yaml:"shadow_workers"`
	// ShadowQueueBytes bounds the body bytes waiting for a shadow agent;
	// a request whose body event does not fit is dropped from the shadow
	// agent's view (default 8 MiB).
	ShadowQueueBytes Size `yaml:"shadow_queue_bytes"`
	// DecisionCache caches the agent's request-header decisions (off by
	// default).
	DecisionCache DecisionCache `yaml:"decision_cache"`
	// Addresses are more members of the agent besides Address (uds: more
	// sockets, grpc and ext_authz: more targets, http_auth: more URLs),
	// each a separate agent process; new
	// requests go to the members in turn.
	Addresses []string `yaml:"addresses"`
	// Failover retries, once, on another member (or connection) a request
	// whose agent failed before any body was sent to it (default true).
	Failover *bool `yaml:"failover"`
}

// AgentLimits bound the header work one agent reply may cause. A reply
// over any of them is an agent error: nothing of it is applied and the
// agent's failure mode decides (closed: 503; open: the request passes
// unchanged by that reply). The defaults are far above what a policy
// agent does (a few operations of a few hundred bytes) and far below
// what costs the proxy noticeable CPU or lets an agent build a header
// block no upstream or client accepts.
type AgentLimits struct {
	// HeaderOps caps the header operations of one reply: request and
	// response operations and block-response headers together (default
	// 256).
	HeaderOps int `yaml:"header_ops"`
	// HeaderBytes caps the bytes of names and values in one reply's
	// header operations (default 64KiB).
	HeaderBytes Size `yaml:"header_bytes"`
	// HeaderValue caps one header value an agent sets, adds or puts on a
	// block response (default 16KiB).
	HeaderValue Size `yaml:"header_value"`
	// HeaderBlock caps the request or response header block (names,
	// values and line framing) that a reply may bring a message to; a
	// reply's additions count in full (default 64KiB).
	HeaderBlock Size `yaml:"header_block"`
}

// AgentTimeouts bound the conversation with an agent.
type AgentTimeouts struct {
	// Connect bounds dialing (default 1s).
	Connect time.Duration `yaml:"connect"`
	// Handshake bounds the handshake (default 2s).
	Handshake time.Duration `yaml:"handshake"`
	// Message bounds the wait for each reply (default 1s).
	Message time.Duration `yaml:"message"`
	// Request bounds the total time one request may wait on the agent over
	// its header events and buffered bodies (default 5s). Streamed chunks
	// are bounded by Message only, so long uploads are not cut off.
	Request time.Duration `yaml:"request"`
	// Frame bounds the time the rest of a frame may take once the agent
	// has begun it (uds and reverse; default 5s, at most 1m). A healthy
	// agent writes each frame at once, within its own 5s write timeout; one
	// that stalls mid-frame would hold every request on the connection
	// until the ping timeout, so it loses the connection instead. The wait
	// between frames is not bounded by it.
	Frame time.Duration `yaml:"frame"`
}

// BodyPolicy says how one body phase reaches an agent.
type BodyPolicy struct {
	// Mode is auto (default), none, buffered or streaming.
	Mode string `yaml:"mode"`
	// Limit is the most a buffered body may hold (default 1MiB).
	Limit Size `yaml:"limit"`
	// OverLimit is reject or skip; the default is reject for request
	// bodies and skip for response bodies.
	OverLimit string `yaml:"over_limit"`
	// ChunkSize is the largest chunk sent in one event (default 64KiB).
	ChunkSize Size `yaml:"chunk_size"`
}

// RouteAgent puts an agent on a route, optionally overriding its policy.
// In YAML it is either the agent's name or a mapping with name and overrides.
type RouteAgent struct {
	Name string `yaml:"name"`
	// FailureMode overrides the agent's failure mode on this route.
	FailureMode string `yaml:"failure_mode"`
	// Timeout overrides the agent's request timeout on this route.
	Timeout time.Duration `yaml:"timeout"`
	// RequestBody and ResponseBody override the fields they set.
	RequestBody  *BodyPolicy `yaml:"request_body"`
	ResponseBody *BodyPolicy `yaml:"response_body"`
	// ExtAuthz are the settings of an ext_authz agent on this route, as
	// Envoy's ExtAuthzPerRoute.
	ExtAuthz *RouteExtAuthz `yaml:"ext_authz"`
}

// RouteExtAuthz is an ext_authz agent's settings on one route (Envoy's
// ExtAuthzPerRoute).
type RouteExtAuthz struct {
	// Disabled skips the agent on this route: its requests are not
	// checked (Envoy's disabled).
	Disabled bool `yaml:"disabled"`
	// ContextExtensions are sent in the route's CheckRequests, merged
	// over the agent's context_extensions option, the route's winning
	// (Envoy's check_settings.context_extensions).
	ContextExtensions map[string]string `yaml:"context_extensions"`
}

// MaxRouteContextExtensions bounds the context_extensions of one route's
// ext_authz settings.
const MaxRouteContextExtensions = 64

// RouteContextExtensions returns the context_extensions routes set for
// the ext_authz agent name, by route name (none: nil).
func (c *Config) RouteContextExtensions(name string) map[string]map[string]string {
	var out map[string]map[string]string
	for i := range c.Routes {
		r := &c.Routes[i]
		for j := range r.Agents {
			ra := &r.Agents[j]
			if ra.Name != name || ra.ExtAuthz == nil || ra.ExtAuthz.Disabled || len(ra.ExtAuthz.ContextExtensions) == 0 {
				continue
			}
			if out == nil {
				out = make(map[string]map[string]string)
			}
			out[r.Name] = ra.ExtAuthz.ContextExtensions
		}
	}
	return out
}

// Route matches requests by host and path prefix and sends them through
// its agents, in order, to its upstream.
type Route struct {
	Name string `yaml:"name"`
	// Hosts are exact names ("api.example.com") or wildcards
	// ("*.example.com", any depth of subdomain); empty or "*" matches any
	// host. An exact host beats a wildcard, a longer wildcard beats a
	// shorter one, any wildcard beats a catch-all. They are matched in
	// canonical form (CanonicalHost: lower case, one trailing dot
	// removed), as the request's Host is.
	Hosts []string `yaml:"hosts"`
	// PathPrefix is matched byte-wise against the normalized path
	// (default "/"); among the routes of the best host match, the longest
	// matching prefix wins.
	PathPrefix string `yaml:"path_prefix"`
	// Upstream names the upstream.
	Upstream string `yaml:"upstream"`
	// HostHeader is preserve (default), upstream, or a literal host name
	// to send instead.
	HostHeader string `yaml:"host_header"`
	// Agents run in order; the first non-allow decision wins.
	Agents []RouteAgent `yaml:"agents"`

	// Path matches the normalized path exactly (instead of path_prefix).
	Path string `yaml:"path"`
	// PathRegex matches the normalized path with an RE2 expression,
	// anchored at both ends (instead of path_prefix).
	PathRegex string `yaml:"path_regex"`
	// Methods the route matches (any when empty).
	Methods []string `yaml:"methods"`
	// Headers are conditions on the request's header fields; all must
	// hold.
	Headers []StringMatch `yaml:"headers"`
	// Query are conditions on the request's query parameters, compared
	// as sent (percent-encoded); all must hold.
	Query []StringMatch `yaml:"query"`
	// Rewrite changes the path the upstream gets.
	Rewrite *Rewrite `yaml:"rewrite"`
	// RequestHeaders change the request's headers before the agents see
	// the forwarded request.
	RequestHeaders HeaderOps `yaml:"request_headers"`
	// ResponseHeaders change the upstream's response (and the route's
	// direct response or redirect) before the response-phase agents.
	ResponseHeaders HeaderOps `yaml:"response_headers"`
	// DirectResponse answers the route's requests without an upstream.
	DirectResponse *DirectResponse `yaml:"direct_response"`
	// Redirect answers the route's requests with a redirect.
	Redirect *Redirect `yaml:"redirect"`
	// Timeout bounds the time from sending the request upstream to its
	// response head, over every try and backoff (0: none beyond each
	// try's); past it the client gets 504.
	Timeout time.Duration `yaml:"timeout"`
	// UpstreamTimeout replaces the upstream's response_timeout for this
	// route (0: the upstream's).
	UpstreamTimeout time.Duration `yaml:"upstream_timeout"`
	// Retry is the route's retry policy (absent: no retries beyond the
	// upstream's own on stale connections and other endpoints).
	Retry *Retry `yaml:"retry"`
	// RateLimit is the route's local rate limit (absent: none).
	RateLimit *RateLimit `yaml:"rate_limit"`
	// GlobalRateLimit asks the rate_limit_service about the route's
	// requests (absent: never).
	GlobalRateLimit *GlobalRateLimit `yaml:"global_rate_limit"`
}

// Logging configures the zerolog logger.
type Logging struct {
	// Level is trace, debug, info (default), warn or error.
	Level string `yaml:"level"`
	// Format is json (default) or console.
	Format string `yaml:"format"`
}

// Logger returns a zerolog logger writing to w at the configured level
// and format, with timestamps.
func (l Logging) Logger(w io.Writer) zerolog.Logger {
	level, err := zerolog.ParseLevel(l.Level)
	if err != nil || l.Level == "" {
		level = zerolog.InfoLevel
	}
	if l.Format == "console" {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
	}
	return zerolog.New(w).Level(level).With().Timestamp().Logger()
}

// Policy is an agent's effective behaviour on one route: the agent's
// settings with the route's overrides applied.
type Policy struct {
	Agent    *Agent
	FailOpen bool
	// FailureStatus answers a fail-closed failure other than a timeout
	// (Agent.FailStatus).
	FailureStatus int
	Timeout       time.Duration
	RequestBody   BodyPolicy
	ResponseBody  BodyPolicy
}

// Load reads, parses and validates the file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		// The path is said once: "cannot read x.yaml: no such file or
		// directory", not "open x.yaml: …".
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, &readError{path: path, err: err}
	}
	return Parse(data)
}

// Parse decodes YAML, rejects unknown keys, applies defaults and validates.
func Parse(data []byte) (*Config, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfigSyntax, err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil, fmt.Errorf("%w: empty document", ErrConfigSyntax)
	}
	c := &Config{lines: make(map[string]int)}
	d := decoder{lines: c.lines}
	if err := d.decode(doc.Content[0], c, ""); err != nil {
		return nil, err
	}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Line returns the line of the key at path ("routes[0].agents[1]"), or 0
// when unknown (a Config built in code).
func (c *Config) Line(path string) int { return c.lines[path] }

// Agent returns the agent called name, or nil.
func (c *Config) Agent(name string) *Agent {
	for i := range c.Agents {
		if c.Agents[i].Name == name {
			return &c.Agents[i]
		}
	}
	return nil
}

// Upstream returns the upstream called name, or nil.
func (c *Config) Upstream(name string) *Upstream {
	for i := range c.Upstreams {
		if c.Upstreams[i].Name == name {
			return &c.Upstreams[i]
		}
	}
	return nil
}

// Failure statuses of a fail-closed agent (failure_status): an ext_proc
// agent answers 500, as Envoy's ext_proc filter does by default
// (status_on_error: "HTTP 500 Internal Server Error"), so that a
// processor's deployment keeps the status its clients and alerts know;
// every other transport 503. A timeout answers 504 whatever the
// transport, as Envoy's message timeout does.
//
// An ext_authz agent answers 403, Envoy's ext_authz status_on_error
// default; an http_auth agent 500, as nginx's auth_request and Traefik's
// ForwardAuth answer when the authorization service cannot be asked.
const (
	FailureStatusDefault         = 503
	FailureStatusExtProcDefault  = 500
	FailureStatusExtAuthzDefault = 403
	FailureStatusHTTPAuthDefault = 500
)

// FailStatus is the status a fail-closed failure of a answers, a timeout
// excepted: failure_status, else the transport's default.
func (a *Agent) FailStatus() int {
	switch {
	case a.FailureStatus != 0:
		return a.FailureStatus
	case a.Transport == TransportExtProc:
		return FailureStatusExtProcDefault
	case a.Transport == TransportExtAuthz:
		return FailureStatusExtAuthzDefault
	case a.Transport == TransportHTTPAuth:
		return FailureStatusHTTPAuthDefault
	}
	return FailureStatusDefault
}

// Policy returns the effective policy of the route's agent reference ra.
// The agent must exist (Validate checks it).
func (c *Config) Policy(ra *RouteAgent) Policy {
	a := c.Agent(ra.Name)
	p := Policy{
		Agent:         a,
		FailOpen:      a.FailureMode == FailOpen,
		FailureStatus: a.FailStatus(),
		Timeout:       a.Timeouts.Request,
		RequestBody:   a.RequestBody,
		ResponseBody:  a.ResponseBody,
	}
	if ra.FailureMode != "" {
		p.FailOpen = ra.FailureMode == FailOpen
	}
	if ra.Timeout > 0 {
		p.Timeout = ra.Timeout
	}
	p.RequestBody.override(ra.RequestBody)
	p.ResponseBody.override(ra.ResponseBody)
	return p
}

func (b *BodyPolicy) override(o *BodyPolicy) {
	if o == nil {
		return
	}
	if o.Mode != "" {
		b.Mode = o.Mode
	}
	if o.Limit != 0 {
		b.Limit = o.Limit
	}
	if o.OverLimit != "" {
		b.OverLimit = o.OverLimit
	}
	if o.ChunkSize != 0 {
		b.ChunkSize = o.ChunkSize
	}
}

// SetDefaults fills every unset field with its default.
func (c *Config) SetDefaults() {
	c.setTLSDefaults()
	for i := range c.Listeners {
		l := &c.Listeners[i]
		if l.Name == "" {
			l.Name = fmt.Sprintf("listener%d", i)
		}
		setDur(&l.ReadTimeout, 10*time.Second)
		setDur(&l.IdleTimeout, 60*time.Second)
		setDur(&l.BodyTimeout, 60*time.Second)
		setSize(&l.ReadBufferSize, 16<<10)
		setSize(&l.WriteBufferSize, 16<<10)
		setDur(&l.DisconnectCheck, 100*time.Millisecond)
		setDur(&l.TunnelIdleTimeout, 5*time.Minute)
		setInt(&l.MaxTunnels, 1024)
		setDur(&l.LingeringTimeout, 5*time.Second)
		setSize(&l.MaxLingeringBytes, 1<<20)
		if l.Protocols == nil {
			l.Protocols = []string{ProtoHTTP1}
			if l.TLS != nil {
				l.Protocols = append(l.Protocols, ProtoH2)
			}
		}
		setInt(&l.HTTP2.MaxConcurrentStreams, 100)
		setSize(&l.HTTP2.MaxHeaderListSize, l.ReadBufferSize)
		setSize(&l.HTTP2.MaxReadFrameSize, 16<<10)
		if l.RateLimit != nil {
			l.RateLimit.setDefaults()
		}
	}
	for i := range c.Upstreams {
		u := &c.Upstreams[i]
		setDur(&u.ConnectTimeout, 5*time.Second)
		setDur(&u.ResponseTimeout, 30*time.Second)
		setDur(&u.IdleTimeout, 60*time.Second)
		setInt(&u.MaxConns, 1024)
		setDur(&u.MaxConnWait, time.Second)
		setDur(&u.KeepAlive, 15*time.Second)
		setSize(&u.ReadBufferSize, 16<<10)
		setSize(&u.WriteBufferSize, 16<<10)
		if u.Protocol == "" {
			u.Protocol = ProtoHTTP1
		}
		u.setEndpointDefaults()
	}
	for i := range c.Agents {
		a := &c.Agents[i]
		setInt(&a.Conns, 1)
		setInt(&a.MaxInFlight, agentmux.DefaultMaxInFlight)
		setInt(&a.MaxQueue, agentmux.DefaultMaxQueue)
		setSize(&a.MaxPendingBytes, udswriter.DefaultMaxPendingBytes)
		if a.PayloadEncoding == "" {
			a.PayloadEncoding = EncodingAuto
		}
		setDur(&a.Timeouts.Connect, redial.DefaultConnectTimeout)
		setDur(&a.Timeouts.Handshake, redial.DefaultHandshakeTimeout)
		setDur(&a.Timeouts.Message, agentmux.DefaultMessageTimeout)
		setDur(&a.Timeouts.Request, 5*time.Second)
		setDur(&a.Timeouts.Frame, uds.DefaultFrameTimeout)
		setInt(&a.Limits.HeaderOps, 256)
		setSize(&a.Limits.HeaderBytes, 64<<10)
		setSize(&a.Limits.HeaderValue, 16<<10)
		setSize(&a.Limits.HeaderBlock, 64<<10)
		if a.FailureMode == "" {
			a.FailureMode = FailClosed
		}
		a.RequestBody.setDefaults(OverLimitReject)
		a.ResponseBody.setDefaults(OverLimitSkip)
		a.setPolicyDefaults()
	}
	for i := range c.Routes {
		r := &c.Routes[i]
		if r.Name == "" {
			r.Name = fmt.Sprintf("route%d", i)
		}
		if r.PathPrefix == "" && r.Path == "" && r.PathRegex == "" {
			r.PathPrefix = "/"
		}
		r.setRoutingDefaults()
		if r.HostHeader == "" {
			r.HostHeader = HostPreserve
		}
	}
	if s := c.RateLimitService; s != nil {
		setDur(&s.Timeout, 20*time.Millisecond)
		if s.FailureMode == "" {
			s.FailureMode = RateLimitFailAllow
		}
	}
	c.setOpsDefaults()
	c.Tracing.setDefaults()
	if c.Logging.Level == "" {
		c.Logging.Level = "info"
	}
	if c.Logging.Format == "" {
		c.Logging.Format = "json"
	}
}

func (b *BodyPolicy) setDefaults(overLimit string) {
	if b.Mode == "" {
		b.Mode = BodyAuto
	}
	setSize(&b.Limit, 1<<20)
	if b.OverLimit == "" {
		b.OverLimit = overLimit
	}
	setSize(&b.ChunkSize, 64<<10)
}

func setDur(d *time.Duration, v time.Duration) {
	if *d == 0 {
		*d = v
	}
}

func setSize(s *Size, v Size) {
	if *s == 0 {
		*s = v
	}
}

func setInt(n *int, v int) {
	if *n == 0 {
		*n = v
	}
}
