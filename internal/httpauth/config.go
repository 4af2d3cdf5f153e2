package httpauth

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/grpcclient"
	"github.com/zentinelproxy/sidecar/internal/redial"
)

// ErrHTTPAuthConfig: the configuration of an http_auth agent is invalid.
var ErrHTTPAuthConfig = errors.New("httpauth: invalid config")

// Styles of the headers that tell the service about the request.
const (
	// StyleTraefik sends X-Forwarded-Method, -Proto, -Host, -Uri and -For
	// (Traefik's ForwardAuth).
	StyleTraefik = "traefik"
	// StyleNginx sends X-Original-Method and X-Original-URI (the headers
	// an nginx auth_request location is usually given).
	StyleNginx = "nginx"
)

// Defaults and bounds.
const (
	// DefaultMaxBody bounds the body of a denial passed to the client.
	DefaultMaxBody = 64 << 10
	// MaxMaxBody is max_body's largest value.
	MaxMaxBody = 1 << 20
	// DefaultHealthInterval is how often a ready service is probed.
	DefaultHealthInterval = 10 * time.Second
	// MaxPipeline is pipeline's largest value.
	MaxPipeline = 64
	// maxResponseHeader bounds the service's response head.
	maxResponseHeader = 64 << 10
)

// Config is the proxy side of one http_auth agent.
type Config struct {
	// Name is the agent's configured name.
	Name string
	// URL is the authorization endpoint (http:// or https://).
	URL string
	// MaxInFlight caps subrequests in flight (and so the connections to
	// the service); MaxQueue caps how many requests wait for a slot.
	MaxInFlight int
	MaxQueue    int
	// DialTimeout bounds connecting (TCP and TLS) and the readiness probe.
	DialTimeout time.Duration
	// MessageTimeout bounds each subrequest.
	MessageTimeout time.Duration
	// Style is StyleTraefik (default) or StyleNginx.
	Style string
	// RequestHeaders are the client headers sent to the service (any
	// case); nil sends every end-to-end header but those the subrequest
	// frames itself (Host, Content-Length, Transfer-Encoding,
	// Accept-Encoding, Expect).
	RequestHeaders []string
	// ResponseHeaders are the headers of a 2xx answer copied to the
	// upstream request; each named header of the client's request is
	// removed first, so that a client cannot send one of its own.
	ResponseHeaders []string
	// ResponseHeadersRegex, when set, copies the 2xx answer's headers
	// whose name matches it too, removing the client's that match first.
	ResponseHeadersRegex *regexp.Regexp
	// MaxBody bounds the body of a denial passed to the client; a longer
	// one is cut there (counted as bodies_truncated).
	MaxBody int
	// HealthInterval is how often a ready service is probed.
	HealthInterval time.Duration
	// UnixSocket, when set, is the path of the Unix socket the service
	// listens on, dialed instead of the URL's host and port (which still
	// give the Host header, and the name TLS checks).
	UnixSocket string
	// Pipeline is the most GET subrequests sent together on one
	// connection (HTTP/1.1 pipelining, pipeline.go); 1 (the default)
	// sends each on a connection of its own.
	Pipeline int
	// TLS sets the CA, client certificate and server name of an https
	// URL.
	TLS grpcclient.TLSConfig
	// Logger receives readiness events; it carries the agent field.
	Logger zerolog.Logger
}

// Options are the option names of transport http_auth (config
// agents[].options).
var Options = []string{
	"style", "auth_request_headers", "auth_response_headers", "auth_response_headers_regex",
	"max_body", "health_interval", "unix_socket", "pipeline", "tls_ca_file", "tls_cert_file", "tls_key_file", "tls_server_name",
}

// DefaultConfig returns a Config with defaults for the agent at url.
func DefaultConfig(name, url string) Config {
	return Config{
		Name:           name,
		URL:            url,
		MaxInFlight:    agentmux.DefaultMaxInFlight,
		MaxQueue:       agentmux.DefaultMaxQueue,
		DialTimeout:    redial.DefaultConnectTimeout + redial.DefaultHandshakeTimeout,
		MessageTimeout: agentmux.DefaultMessageTimeout,
		Style:          StyleTraefik,
		MaxBody:        DefaultMaxBody,
		HealthInterval: DefaultHealthInterval,
		Pipeline:       1,
		Logger:         zerolog.Nop(),
	}
}

// OptionError is an invalid option: Key names it (for the line of the
// configuration error); it wraps ErrHTTPAuthConfig.
type OptionError struct {
	Key string
	err error
}

func (e *OptionError) Error() string { return e.err.Error() }

// Unwrap returns the wrapped ErrHTTPAuthConfig error.
func (e *OptionError) Unwrap() error { return e.err }

// ApplyOptions reads the transport's options into c.
func (c *Config) ApplyOptions(opts map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(opts)) {
		v := opts[k]
		var err error
		switch k {
		case "style":
			c.Style = strings.ToLower(strings.TrimSpace(v))
			if c.Style != StyleTraefik && c.Style != StyleNginx {
				err = fmt.Errorf("%q is not traefik or nginx", v)
			}
		case "auth_request_headers":
			c.RequestHeaders, err = names(v)
		case "auth_response_headers":
			c.ResponseHeaders, err = names(v)
		case "auth_response_headers_regex":
			c.ResponseHeadersRegex, err = regexp.Compile(v)
		case "max_body":
			var n int
			n, err = strconv.Atoi(v)
			if err == nil && (n < 0 || n > MaxMaxBody) {
				err = fmt.Errorf("%d is not in 0..%d bytes", n, MaxMaxBody)
			}
			c.MaxBody = n
		case "health_interval":
			c.HealthInterval, err = time.ParseDuration(v)
			if err == nil && c.HealthInterval < 100*time.Millisecond {
				err = fmt.Errorf("%v is below 100ms", c.HealthInterval)
			}
		case "pipeline":
			var n int
			n, err = strconv.Atoi(strings.TrimSpace(v))
			if err == nil && (n < 1 || n > MaxPipeline) {
				err = fmt.Errorf("%d is not in 1..%d", n, MaxPipeline)
			}
			c.Pipeline = n
		case "unix_socket":
			c.UnixSocket = v
			err = checkSocketPath(v)
		case "tls_ca_file", "tls_cert_file", "tls_key_file", "tls_server_name":
			_, err = c.TLS.ApplyOption(k, v)
		default:
			err = fmt.Errorf("unknown option (known: %s)", strings.Join(Options, ", "))
		}
		if err != nil {
			return &OptionError{Key: k, err: fmt.Errorf("%w: option %s: %v", ErrHTTPAuthConfig, k, err)}
		}
	}
	return nil
}

// maxSocketPath is the longest Unix socket path (sun_path holds 108
// bytes with its NUL).
const maxSocketPath = 107

func checkSocketPath(p string) error {
	switch {
	case !strings.HasPrefix(p, "/"):
		return fmt.Errorf("%q is not an absolute path", p)
	case len(p) > maxSocketPath:
		return fmt.Errorf("socket path longer than %d bytes", maxSocketPath)
	}
	return nil
}

// names reads a comma-separated list of header names.
func names(v string) ([]string, error) {
	out := []string{}
	for n := range strings.SplitSeq(v, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if !validToken(n) {
			return nil, fmt.Errorf("%q is not a header name", n)
		}
		n = http.CanonicalHeaderKey(n)
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

func validToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return s != ""
}

// Validate reports the first invalid field.
func (c *Config) Validate() error {
	fail := func(f string, a ...any) error {
		return fmt.Errorf("%w: agent %q: %s", ErrHTTPAuthConfig, c.Name, fmt.Sprintf(f, a...))
	}
	u, err := url.Parse(c.URL)
	switch {
	case c.Name == "":
		return fmt.Errorf("%w: name is empty", ErrHTTPAuthConfig)
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return fail("address %q is not an http:// or https:// URL", c.URL)
	case c.MaxInFlight < 1:
		return fail("max_in_flight must be positive")
	case c.MaxQueue < 0:
		return fail("max_queue must not be negative")
	case c.DialTimeout <= 0:
		return fail("dial timeout must be positive")
	case c.MessageTimeout < 0:
		return fail("timeouts must not be negative")
	case c.Style != StyleTraefik && c.Style != StyleNginx:
		return fail("style %q is not traefik or nginx", c.Style)
	case c.MaxBody < 0 || c.MaxBody > MaxMaxBody:
		return fail("max_body %d not in 0..%d", c.MaxBody, MaxMaxBody)
	case c.Pipeline < 1 || c.Pipeline > MaxPipeline:
		return fail("pipeline %d not in 1..%d", c.Pipeline, MaxPipeline)
	case c.HealthInterval <= 0:
		return fail("health_interval must be positive")
	case c.UnixSocket != "" && checkSocketPath(c.UnixSocket) != nil:
		return fail("unix_socket: %v", checkSocketPath(c.UnixSocket))
	case (c.TLS.CertFile == "") != (c.TLS.KeyFile == ""):
		return fail("tls_cert_file and tls_key_file go together")
	case u.Scheme != "https" && (c.TLS.CAFile != "" || c.TLS.CertFile != "" || c.TLS.ServerName != ""):
		return fail("tls options with an http:// URL")
	}
	return nil
}
