package extauthz

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/grpcclient"
	"github.com/zentinelproxy/sidecar/internal/redial"
)

// ErrExtAuthzConfig: the configuration of an ext_authz agent is invalid.
var ErrExtAuthzConfig = errors.New("extauthz: invalid config")

// Config is the proxy side of one ext_authz agent.
type Config struct {
	// Name is the agent's configured name.
	Name string
	// Address is the authorization server's gRPC target (host:port or
	// unix:/path).
	Address string
	// Conns is how many HTTP/2 connections carry the calls.
	Conns int
	// MaxInFlight caps calls in flight per connection; MaxQueue caps how
	// many requests wait for a slot.
	MaxInFlight int
	MaxQueue    int
	// DialTimeout bounds connecting (and the readiness probe).
	DialTimeout time.Duration
	// MessageTimeout bounds each Check call (Envoy's timeout).
	MessageTimeout time.Duration
	// ContextExtensions are sent as the context_extensions of every
	// CheckRequest (the agent's option).
	ContextExtensions map[string]string
	// RouteContextExtensions are the context_extensions of routes, by
	// route name (routes[].agents[].ext_authz.context_extensions): a
	// request of such a route is sent ContextExtensions with the route's
	// merged over them, the route's winning, as Envoy merges an
	// ExtAuthzPerRoute's over the filter's.
	RouteContextExtensions map[string]map[string]string
	// IncludeTLSSession sends tls_session (the SNI) for TLS requests, as
	// Envoy's include_tls_session.
	IncludeTLSSession bool
	// WithRequestBody sends the request body with the Check, as Envoy's
	// with_request_body: the agent then takes buffered request bodies,
	// and its request_body policy is Envoy's max_request_bytes (limit)
	// and allow_partial_message (over_limit: prefix; reject, the default,
	// answers 413 as Envoy does).
	WithRequestBody bool
	// PackAsBytes sends the body as raw_body rather than body (Envoy's
	// pack_as_bytes).
	PackAsBytes bool
	// EncodeRawHeaders sends the headers as header_map with raw values
	// instead of the headers map, as Envoy's encode_raw_headers.
	EncodeRawHeaders bool
	// HealthService is the service name asked of the server's gRPC
	// health service (grpc.health.v1.Health/Check), "" (the server as a
	// whole) by default, as Envoy's gRPC health checks ask.
	HealthService string
	// HealthInterval is how often a live connection's server is asked
	// again, when it implements the health service (default 10s).
	HealthInterval time.Duration
	// MaxMessageSize caps messages both ways.
	MaxMessageSize int
	// TLS secures the connections (mTLS with a client certificate).
	TLS grpcclient.TLSConfig
	// Logger receives connection events; it carries the agent field.
	Logger zerolog.Logger
}

// Options are the option names of transport ext_authz (config
// agents[].options).
var Options = append(slices.Clone(grpcclient.TLSOptions),
	"context_extensions", "include_tls_session", "encode_raw_headers", "with_request_body", "pack_as_bytes",
	"health_service", "health_interval",
)

// refusedOptions are options of Envoy's ext_authz filter that check-config
// refuses, with why (or which key of the agent to use instead).
var refusedOptions = map[string]string{
	"max_request_bytes":           "use the agent's request_body.limit",
	"allow_partial_message":       "use the agent's request_body.over_limit: prefix",
	"failure_mode_allow":          "use the agent's failure_mode: open",
	"status_on_error":             "use the agent's failure_status",
	"timeout":                     "use the agent's timeouts.message",
	"include_peer_certificate":    "the proxy does not give agents the client certificate itself (source.principal carries its URI SAN or subject)",
	"metadata_context_namespaces": "the proxy has no dynamic metadata to send",
	"clear_route_cache":           "routes are chosen before agents are consulted",
	"transport_api_version":       "only V3 (envoy.service.auth.v3) is spoken",
	"http_service":                "use transport http_auth for an HTTP authorization service",
}

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
		MaxMessageSize: 4 << 20,
		HealthInterval: 10 * time.Second,
		Logger:         zerolog.Nop(),
	}
}

// OptionError is an invalid option: Key names it (for the line of the
// configuration error); it wraps ErrExtAuthzConfig.
type OptionError struct {
	Key string
	err error
}

func (e *OptionError) Error() string { return e.err.Error() }

// Unwrap returns the wrapped ErrExtAuthzConfig error.
func (e *OptionError) Unwrap() error { return e.err }

// ApplyOptions reads the transport's options into c.
func (c *Config) ApplyOptions(opts map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(opts)) {
		v := opts[k]
		var err error
		switch k {
		case "context_extensions":
			c.ContextExtensions, err = parseExtensions(v)
		case "include_tls_session":
			c.IncludeTLSSession, err = strconv.ParseBool(v)
		case "encode_raw_headers":
			c.EncodeRawHeaders, err = strconv.ParseBool(v)
		case "with_request_body":
			c.WithRequestBody, err = strconv.ParseBool(v)
		case "pack_as_bytes":
			c.PackAsBytes, err = strconv.ParseBool(v)
		case "health_service":
			c.HealthService = v
		case "health_interval":
			c.HealthInterval, err = time.ParseDuration(v)
			if err == nil && c.HealthInterval < 100*time.Millisecond {
				err = fmt.Errorf("%v is below 100ms", c.HealthInterval)
			}
		default:
			if why, ok := refusedOptions[k]; ok {
				err = fmt.Errorf("not supported: %s", why)
				break
			}
			var tls bool
			if tls, err = c.TLS.ApplyOption(k, v); !tls {
				err = fmt.Errorf("unknown option (known: %s)", strings.Join(Options, ", "))
			}
		}
		if err != nil {
			return &OptionError{Key: k, err: fmt.Errorf("%w: option %s: %v", ErrExtAuthzConfig, k, err)}
		}
	}
	return nil
}

// parseExtensions reads comma-separated key=value pairs.
func parseExtensions(v string) (map[string]string, error) {
	out := map[string]string{}
	for e := range strings.SplitSeq(v, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		k, val, ok := strings.Cut(e, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not key=value", e)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("%s given twice", k)
		}
		out[k] = strings.TrimSpace(val)
	}
	return out, nil
}

// extensionsFor returns the context_extensions of a request of route:
// ContextExtensions, with the route's merged over them.
func (c *Config) extensionsFor(route string) map[string]string {
	r, ok := c.RouteContextExtensions[route]
	if !ok {
		return c.ContextExtensions
	}
	out := maps.Clone(c.ContextExtensions)
	if out == nil {
		out = make(map[string]string, len(r))
	}
	maps.Copy(out, r)
	return out
}

// Validate reports the first invalid field.
func (c *Config) Validate() error {
	fail := func(f string, a ...any) error {
		return fmt.Errorf("%w: agent %q: %s", ErrExtAuthzConfig, c.Name, fmt.Sprintf(f, a...))
	}
	switch {
	case c.Name == "":
		return fmt.Errorf("%w: name is empty", ErrExtAuthzConfig)
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
	case c.MessageTimeout < 0:
		return fail("timeouts must not be negative")
	case c.MaxMessageSize < 64<<10:
		return fail("max message size below 64KiB")
	case (c.TLS.CertFile == "") != (c.TLS.KeyFile == ""):
		return fail("tls_cert_file and tls_key_file go together")
	case !c.TLS.On() && c.TLS.ServerName != "":
		return fail("tls_server_name without tls")
	case c.PackAsBytes && !c.WithRequestBody:
		return fail("pack_as_bytes without with_request_body")
	case c.HealthInterval <= 0:
		return fail("health_interval must be positive")
	}
	return nil
}
