// Package transports turns configured agents (config.Agent) into the
// proxy side of their transport — a udsclient.Client, a grpcclient.Client,
// an extproc.Client or the pool of a reverse.Listener — seen by everything
// else only as an agentmux.Agent. It also checks what package config
// leaves to the transports (their options) and decides, with InstanceKey,
// when two configured agents are served by the same instance.
//
// Agents builds the agents of a running sidecar through one table of
// factories, one per transport, and keeps them across reloads; it owns
// the reverse listeners (one per address, kept, bound, retired or refused
// by a reload), so that the supervisor handles every transport alike.
//
// The dataplane knows none of this: it is handed agentmux.Agent values.
package transports

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
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/extauthz"
	"github.com/zentinelproxy/sidecar/internal/extproc"
	"github.com/zentinelproxy/sidecar/internal/grpcclient"
	"github.com/zentinelproxy/sidecar/internal/httpauth"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
)

// Factory builds the proxy side of one configured agent; log carries the
// agent's name.
type Factory func(a *config.Agent, log zerolog.Logger) (agentmux.Agent, error)

// Factories maps a transport name (config.TransportUDS, …) to its factory.
type Factories map[string]Factory

// Dialing returns the factories of the transports whose instances dial
// their agent: uds, grpc, ext_proc, ext_authz and http_auth. Reverse agents dial the sidecar:
// their factory, in the same table in Agents.Build, hands out the pools of
// the reverse listener at their address, which Agents owns.
func Dialing() Factories {
	return Factories{
		config.TransportUDS: NewUDS, config.TransportGRPC: NewGRPC, config.TransportExtProc: NewExtProc,
		config.TransportExtAuthz: NewExtAuthz, config.TransportHTTPAuth: NewHTTPAuth,
	}
}

// ForConfig returns the factories of Dialing for the agents of cfg: the
// ext_authz factory gives each agent the context_extensions cfg's routes
// set for it (routes[].agents[].ext_authz), which Dialing's cannot know.
func ForConfig(cfg *config.Config) Factories {
	f := Dialing()
	f[config.TransportExtAuthz] = func(a *config.Agent, log zerolog.Logger) (agentmux.Agent, error) {
		return newExtAuthz(a, cfg.RouteContextExtensions(a.Name), log)
	}
	return f
}

// UDSConfig maps a configured agent of transport uds to the client's
// configuration.
func UDSConfig(a *config.Agent, log zerolog.Logger) udsclient.Config {
	c := udsclient.DefaultConfig(a.Name, udsPath(a.Address))
	c.Conns = a.Conns
	c.MaxInFlight = a.MaxInFlight
	c.MaxQueue = a.MaxQueue
	c.DialTimeout = a.Timeouts.Connect
	c.HandshakeTimeout = a.Timeouts.Handshake
	c.MessageTimeout = a.Timeouts.Message
	c.FrameTimeout = a.Timeouts.Frame
	c.MaxPendingBytes = int(a.MaxPendingBytes)
	c.JSONOnly = a.PayloadEncoding == config.EncodingJSON
	c.Logger = log
	return c
}

func udsPath(addr string) string { return strings.TrimPrefix(addr, "unix:") }

// NewUDS is the factory of transport uds: a udsclient.Client that dials
// the agent's socket, reconnecting in the background.
func NewUDS(a *config.Agent, log zerolog.Logger) (agentmux.Agent, error) {
	return withMembers(a, log, func(m *config.Agent, log zerolog.Logger) (agentmux.Agent, error) {
		return udsclient.NewClient(UDSConfig(m, log))
	})
}

// GRPCOptions are the options of transport grpc (config agents[].options).
var GRPCOptions = append(slices.Clone(grpcclient.TLSOptions), "health_interval")

// GRPCConfig maps a configured agent of transport grpc to the client's
// configuration, options included, and validates it.
func GRPCConfig(a *config.Agent, log zerolog.Logger) (grpcclient.Config, error) {
	c := grpcclient.DefaultConfig(a.Name, a.Address)
	c.Conns = a.Conns
	c.MaxInFlight = a.MaxInFlight
	c.MaxQueue = a.MaxQueue
	c.DialTimeout = a.Timeouts.Connect + a.Timeouts.Handshake
	c.MessageTimeout = a.Timeouts.Message
	c.Logger = log
	for _, k := range sortedKeys(a.Options) {
		v := a.Options[k]
		var err error
		switch k {
		case "health_interval":
			c.HealthInterval, err = time.ParseDuration(v)
		default:
			// The TLS options are shared with transport ext_proc.
			var tls bool
			if tls, err = c.TLS.ApplyOption(k, v); !tls {
				err = fmt.Errorf("unknown option (known: %s)", strings.Join(GRPCOptions, ", "))
			}
		}
		if err != nil {
			return c, fmt.Errorf("%w: option %s: %v", grpcclient.ErrGRPCConfig, k, err)
		}
	}
	return c, c.Validate()
}

// NewGRPC is the factory of transport grpc: a grpcclient.Client that
// keeps its streams to the agent open, reconnecting in the background.
func NewGRPC(a *config.Agent, log zerolog.Logger) (agentmux.Agent, error) {
	return withMembers(a, log, func(m *config.Agent, log zerolog.Logger) (agentmux.Agent, error) {
		c, err := GRPCConfig(m, log)
		if err != nil {
			return nil, err
		}
		return grpcclient.NewClient(c)
	})
}

// Check validates what package config leaves to the transports (their
// options) without opening anything. Errors carry the line of the agent
// or its options and wrap config.ErrConfigInvalid.
func Check(cfg *config.Config) error {
	if err := check(cfg); err != nil {
		return invalidConfig{err}
	}
	return nil
}

func check(cfg *config.Config) error {
	for i := range cfg.Agents {
		a := &cfg.Agents[i]
		switch a.Transport {
		case config.TransportUDS:
			if len(a.Options) > 0 {
				return agentError(cfg, i, "options", errors.New("transport uds takes no options"))
			}
		case config.TransportGRPC:
			if _, err := GRPCConfig(a, zerolog.Nop()); err != nil {
				return agentError(cfg, i, "options", err)
			}
		case config.TransportExtProc:
			if _, err := ExtProcConfig(a, zerolog.Nop()); err != nil {
				key := "options"
				var oe *extproc.OptionError
				if errors.As(err, &oe) {
					key += "." + oe.Key // the option's own line
				}
				return agentError(cfg, i, key, err)
			}
		case config.TransportExtAuthz:
			c, err := ExtAuthzConfig(a, zerolog.Nop())
			if err != nil {
				key := "options"
				var oe *extauthz.OptionError
				if errors.As(err, &oe) {
					key += "." + oe.Key
				}
				return agentError(cfg, i, key, err)
			}
			if c.WithRequestBody {
				if err := checkAuthzBody(cfg, a); err != nil {
					return err
				}
			}
		case config.TransportHTTPAuth:
			c, err := HTTPAuthConfig(a, zerolog.Nop())
			if err != nil {
				key := "options"
				var oe *httpauth.OptionError
				if errors.As(err, &oe) {
					key += "." + oe.Key
				}
				return agentError(cfg, i, key, err)
			}
			if c.UnixSocket != "" && len(a.Addresses) > 0 {
				// Every member would dial the one socket.
				return agentError(cfg, i, "addresses", errors.New("addresses with the unix_socket option: every member would dial the same socket; give each member its own agent"))
			}
		}
	}
	if specs := ReverseSpecs(cfg); len(specs) > 0 {
		if _, err := ReverseListenerConfigs(specs); err != nil {
			// The error names the agent; point at the first reverse agent.
			for i := range cfg.Agents {
				if cfg.Agents[i].Transport == config.TransportReverse && strings.Contains(err.Error(), strconv.Quote(cfg.Agents[i].Name)) {
					return agentError(cfg, i, "options", err)
				}
			}
			return fmt.Errorf("config: agents: %w", err)
		}
	}
	return nil
}

// checkAuthzBody checks the request body policy of an ext_authz agent
// with with_request_body, and of every route that uses it: the body is
// buffered (auto is, for this agent) so that the upstream gets none of
// it before the verdict, and one over the limit is refused (413, Envoy's
// answer) or checked on its first limit bytes (prefix, Envoy's
// allow_partial_message), never passed unchecked (skip) or streamed
// (stream); a route may not raise the limit (the Check's message is
// sized for the agent's).
func checkAuthzBody(cfg *config.Config, a *config.Agent) error {
	i := slices.IndexFunc(cfg.Agents, func(x config.Agent) bool { return x.Name == a.Name })
	bad := func(p config.BodyPolicy) (string, string) {
		switch {
		case p.Mode != config.BodyAuto && p.Mode != config.BodyBuffered:
			return "mode", fmt.Sprintf("mode %s: with_request_body needs the body buffered (auto or buffered), so that the upstream gets none of it before the verdict", p.Mode)
		case p.OverLimit != config.OverLimitReject && p.OverLimit != config.OverLimitPrefix:
			return "over_limit", fmt.Sprintf("over_limit %s: with_request_body refuses a body over the limit (reject, 413) or checks its first limit bytes (prefix); %s would let the body reach the upstream unchecked", p.OverLimit, p.OverLimit)
		}
		return "", ""
	}
	if key, why := bad(a.RequestBody); key != "" {
		return agentError(cfg, i, "request_body."+key, errors.New(why))
	}
	for ri := range cfg.Routes {
		r := &cfg.Routes[ri]
		for j := range r.Agents {
			ra := &r.Agents[j]
			if ra.Name != a.Name || ra.RequestBody == nil {
				continue
			}
			p := cfg.Policy(ra).RequestBody
			path := fmt.Sprintf("routes[%d].agents[%d].request_body", ri, j)
			key, why := bad(p)
			if key == "" && p.Limit > a.RequestBody.Limit {
				key, why = "limit", fmt.Sprintf("limit %s is above agent %s's request_body.limit %s (the Check is sized for it)", p.Limit, a.Name, a.RequestBody.Limit)
			}
			if key != "" {
				if cfg.Line(path+"."+key) > 0 {
					path += "." + key
				}
				return cfg.ErrorAt(path, errors.New(why))
			}
		}
	}
	return nil
}

// agentError places a transport's complaint about agent i at its line.
func agentError(cfg *config.Config, i int, key string, err error) error {
	path := fmt.Sprintf("agents[%d]", i)
	if key != "" && cfg.Line(path+"."+key) > 0 {
		path += "." + key
	}
	if line := cfg.Line(path); line > 0 {
		return fmt.Errorf("config: line %d: %s: %w", line, path, err)
	}
	return fmt.Errorf("config: %s: %w", path, err)
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// ExtProcConfig maps a configured agent of transport ext_proc to the
// client's configuration, options included (extproc.Options), and
// validates it.
func ExtProcConfig(a *config.Agent, log zerolog.Logger) (extproc.Config, error) {
	c := extproc.DefaultConfig(a.Name, a.Address)
	c.Conns = a.Conns
	c.MaxInFlight = a.MaxInFlight
	c.MaxQueue = a.MaxQueue
	c.DialTimeout = a.Timeouts.Connect + a.Timeouts.Handshake
	c.MessageTimeout = a.Timeouts.Message
	c.Logger = log
	if err := c.ApplyOptions(a.Options); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// NewExtProc is the factory of transport ext_proc: an extproc.Client that
// opens one stream per request to an Envoy External Processing server.
func NewExtProc(a *config.Agent, log zerolog.Logger) (agentmux.Agent, error) {
	c, err := ExtProcConfig(a, log)
	if err != nil {
		return nil, err
	}
	return extproc.NewClient(c)
}

// ExtAuthzConfig maps a configured agent of transport ext_authz to the
// client's configuration, options included (extauthz.Options), and
// validates it.
func ExtAuthzConfig(a *config.Agent, log zerolog.Logger) (extauthz.Config, error) {
	c := extauthz.DefaultConfig(a.Name, a.Address)
	c.Conns = a.Conns
	c.MaxInFlight = a.MaxInFlight
	c.MaxQueue = a.MaxQueue
	c.DialTimeout = a.Timeouts.Connect + a.Timeouts.Handshake
	c.MessageTimeout = a.Timeouts.Message
	c.Logger = log
	if err := c.ApplyOptions(a.Options); err != nil {
		return c, err
	}
	if c.WithRequestBody {
		// The Check carries up to the agent's body limit besides the
		// attributes.
		c.MaxMessageSize = max(c.MaxMessageSize, int(a.RequestBody.Limit)+1<<20)
	}
	return c, c.Validate()
}

// NewExtAuthz is the factory of transport ext_authz: an extauthz.Client
// that makes one Check call per request to an Envoy external
// authorization server (one per member with addresses).
//
// It knows nothing of the routes: ForConfig's factory gives the agent the
// context_extensions its routes set.
func NewExtAuthz(a *config.Agent, log zerolog.Logger) (agentmux.Agent, error) {
	return newExtAuthz(a, nil, log)
}

// newExtAuthz is NewExtAuthz with the routes' context_extensions (by
// route name).
func newExtAuthz(a *config.Agent, routes map[string]map[string]string, log zerolog.Logger) (agentmux.Agent, error) {
	return withMembers(a, log, func(m *config.Agent, log zerolog.Logger) (agentmux.Agent, error) {
		c, err := ExtAuthzConfig(m, log)
		if err != nil {
			return nil, err
		}
		c.RouteContextExtensions = routes
		return extauthz.NewClient(c)
	})
}

// HTTPAuthConfig maps a configured agent of transport http_auth to the
// client's configuration, options included (httpauth.Options), and
// validates it.
func HTTPAuthConfig(a *config.Agent, log zerolog.Logger) (httpauth.Config, error) {
	c := httpauth.DefaultConfig(a.Name, a.Address)
	c.MaxInFlight = a.MaxInFlight
	c.MaxQueue = a.MaxQueue
	c.DialTimeout = a.Timeouts.Connect + a.Timeouts.Handshake
	c.MessageTimeout = a.Timeouts.Message
	c.Logger = log
	if err := c.ApplyOptions(a.Options); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// NewHTTPAuth is the factory of transport http_auth: an httpauth.Client
// that makes one subrequest per request to a forward-auth URL (one per
// member with addresses, each URL its own service).
func NewHTTPAuth(a *config.Agent, log zerolog.Logger) (agentmux.Agent, error) {
	return withMembers(a, log, func(m *config.Agent, log zerolog.Logger) (agentmux.Agent, error) {
		c, err := HTTPAuthConfig(m, log)
		if err != nil {
			return nil, err
		}
		return httpauth.NewClient(c)
	})
}
