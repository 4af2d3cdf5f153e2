package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/dataplane"
	"github.com/zentinelproxy/sidecar/internal/grpcclient"
	"github.com/zentinelproxy/sidecar/internal/reverse"
)

// Options of transport grpc (config agents[].options).
var grpcOptions = []string{"tls", "tls_ca_file", "tls_cert_file", "tls_key_file", "tls_server_name", "health_interval"}

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

// grpcConfig maps a configured agent of transport grpc to the client's
// configuration.
func grpcConfig(a *config.Agent, log zerolog.Logger) (grpcclient.Config, error) {
	c := grpcclient.DefaultConfig(a.Name, a.Address)
	c.Conns = a.Conns
	c.MaxInFlight = a.MaxInFlight
	c.MaxQueue = a.MaxQueue
	c.DialTimeout = a.Timeouts.Connect + a.Timeouts.Handshake
	c.MessageTimeout = a.Timeouts.Message
	c.Logger = log
	for _, k := range sortedOptionKeys(a.Options) {
		v := a.Options[k]
		var err error
		switch k {
		case "tls":
			c.TLS.Enabled, err = strconv.ParseBool(v)
		case "tls_ca_file":
			c.TLS.CAFile = v
		case "tls_cert_file":
			c.TLS.CertFile = v
		case "tls_key_file":
			c.TLS.KeyFile = v
		case "tls_server_name":
			c.TLS.ServerName = v
		case "health_interval":
			c.HealthInterval, err = time.ParseDuration(v)
		default:
			err = fmt.Errorf("unknown option (known: %s)", strings.Join(grpcOptions, ", "))
		}
		if err != nil {
			return c, fmt.Errorf("%w: option %s: %v", grpcclient.ErrGRPCConfig, k, err)
		}
	}
	return c, c.Validate()
}

func sortedOptionKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// reverseSpecs collects the agents of transport reverse.
func reverseSpecs(cfg *config.Config) []reverse.AgentSpec {
	var specs []reverse.AgentSpec
	for i := range cfg.Agents {
		a := &cfg.Agents[i]
		if a.Transport != config.TransportReverse {
			continue
		}
		specs = append(specs, reverse.AgentSpec{
			Name:           a.Name,
			Address:        a.Address,
			MaxInFlight:    a.MaxInFlight,
			MaxQueue:       a.MaxQueue,
			MessageTimeout: a.Timeouts.Message,
			FrameTimeout:   a.Timeouts.Frame,
			Options:        a.Options,
		})
	}
	return specs
}

// checkTransports validates what config leaves to the transports (their
// options) without opening anything; check-config runs it too.
func checkTransports(cfg *config.Config) error {
	for i := range cfg.Agents {
		a := &cfg.Agents[i]
		switch a.Transport {
		case config.TransportUDS:
			if len(a.Options) > 0 {
				return agentError(cfg, i, "options", errors.New("transport uds takes no options"))
			}
		case config.TransportGRPC:
			if _, err := grpcConfig(a, zerolog.Nop()); err != nil {
				return agentError(cfg, i, "options", err)
			}
		}
	}
	if specs := reverseSpecs(cfg); len(specs) > 0 {
		if _, err := reverse.ListenerConfigs(specs); err != nil {
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

// agentSet is the agents of one configuration, built for dataplane.New,
// and the reverse listeners the reverse agents live on.
type agentSet struct {
	agents  map[string]agentmux.Agent
	reverse []*reverse.Listener
	// reverseCfgs are the configurations of reverse, in the same order; a
	// reload compares them to keep unchanged listeners.
	reverseCfgs []reverse.Config
}

// buildAgents builds every agent of cfg: UDS and gRPC clients start
// connecting in the background; reverse listeners are bound (serve them
// with serveReverse).
func buildAgents(cfg *config.Config, log zerolog.Logger) (*agentSet, error) {
	if err := checkTransports(cfg); err != nil {
		return nil, err
	}
	set := &agentSet{}
	if specs := reverseSpecs(cfg); len(specs) > 0 {
		lcs, err := reverse.ListenerConfigs(specs)
		if err != nil {
			return nil, err
		}
		for _, lc := range lcs {
			l, err := reverse.NewListener(lc, log.With().Str("component", "reverse").Logger())
			if err != nil {
				set.close()
				return nil, err
			}
			set.reverse = append(set.reverse, l)
			set.reverseCfgs = append(set.reverseCfgs, lc)
		}
	}
	agents, err := transports(set).Build(cfg, log)
	if err != nil {
		set.close()
		return nil, err
	}
	set.agents = agents
	return set, nil
}

// transports are the agent factories of every transport this binary
// links; reverse agents are the pools of set's reverse listeners.
func transports(set *agentSet) dataplane.Transports {
	tr := dataplane.DefaultTransports()
	tr[config.TransportGRPC] = func(a *config.Agent, log zerolog.Logger) (agentmux.Agent, error) {
		c, err := grpcConfig(a, log)
		if err != nil {
			return nil, err
		}
		return grpcclient.NewClient(c)
	}
	tr[config.TransportReverse] = func(a *config.Agent, _ zerolog.Logger) (agentmux.Agent, error) {
		for _, l := range set.reverse {
			if ag := l.Agent(a.Name); ag != nil {
				return ag, nil
			}
		}
		return nil, fmt.Errorf("agent %q: no reverse listener", a.Name)
	}
	return tr
}

// serveReverse runs the reverse listeners until ctx ends; the first
// listener error (a failed socket) is sent on the returned channel.
func (s *agentSet) serveReverse(ctx context.Context) <-chan error {
	errc := make(chan error, len(s.reverse))
	for _, l := range s.reverse {
		go func() {
			if err := l.Serve(ctx); err != nil {
				errc <- err
			}
		}()
	}
	return errc
}

// close closes the agents and listeners that were not handed to a
// dataplane server (which closes its agents itself).
func (s *agentSet) close() {
	for _, a := range s.agents {
		_ = a.Close()
	}
	s.closeListeners()
}

func (s *agentSet) closeListeners() {
	for _, l := range s.reverse {
		_ = l.Close()
	}
}

// waitAgents waits until every agent has a live connection or ctx ends,
// and returns the names of those still without one.
func waitAgents(ctx context.Context, agents map[string]agentmux.Agent) []string {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		var missing []string
		for name, a := range agents {
			if !a.Snapshot().Ready {
				missing = append(missing, name)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			slices.Sort(missing)
			return missing
		case <-t.C:
		}
	}
}
