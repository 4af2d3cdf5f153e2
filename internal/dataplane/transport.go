package dataplane

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
)

// AgentFactory builds the proxy side of one configured agent. The
// dataplane only ever sees the result as an agentmux.Agent, so each
// transport plugs in through its factory.
type AgentFactory func(a *config.Agent, log zerolog.Logger) (agentmux.Agent, error)

// Transports maps a transport name (config.TransportUDS, …) to its
// factory. Callers add the transports they link in:
//
//	tr := dataplane.DefaultTransports()
//	tr[config.TransportGRPC] = grpcFactory
//	agents, err := tr.Build(cfg, log)
type Transports map[string]AgentFactory

// DefaultTransports returns the transports this package can build by
// itself: uds.
func DefaultTransports() Transports {
	return Transports{config.TransportUDS: UDSAgent}
}

// Build builds every agent of cfg. On error, the agents already built
// are closed.
func (t Transports) Build(cfg *config.Config, log zerolog.Logger) (map[string]agentmux.Agent, error) {
	return t.BuildReusing(cfg, nil, nil, log)
}

// BuildReusing builds the agents of cfg like Build, but takes the
// instance from prev (built for prevCfg) for every agent whose
// configuration did not change, so a reload keeps their connections. On
// error, only the agents built here are closed. Pass the result to
// Server.Swap, which closes the instances of prev no longer used.
func (t Transports) BuildReusing(cfg, prevCfg *config.Config, prev map[string]agentmux.Agent, log zerolog.Logger) (map[string]agentmux.Agent, error) {
	out := make(map[string]agentmux.Agent, len(cfg.Agents))
	var built []agentmux.Agent
	for i := range cfg.Agents {
		a := &cfg.Agents[i]
		if prevCfg != nil {
			if old := prevCfg.Agent(a.Name); old != nil && reflect.DeepEqual(*old, *a) && prev[a.Name] != nil {
				out[a.Name] = prev[a.Name]
				continue
			}
		}
		f := t[a.Transport]
		var err error
		var inst agentmux.Agent
		if f == nil {
			err = fmt.Errorf("%w: agent %q: transport %q is not available in this build", ErrDataplaneConfig, a.Name, a.Transport)
		} else {
			inst, err = f(a, log.With().Str("agent", a.Name).Logger())
		}
		if err != nil {
			for _, b := range built {
				_ = b.Close()
			}
			return nil, err
		}
		built = append(built, inst)
		out[a.Name] = inst
	}
	return out, nil
}

// UDSConfig maps a configured agent to the UDS client's configuration.
func UDSConfig(a *config.Agent, log zerolog.Logger) udsclient.Config {
	c := udsclient.DefaultConfig(a.Name, strings.TrimPrefix(a.Address, "unix:"))
	c.Conns = a.Conns
	c.MaxInFlight = a.MaxInFlight
	c.MaxQueue = a.MaxQueue
	c.DialTimeout = a.Timeouts.Connect
	c.HandshakeTimeout = a.Timeouts.Handshake
	c.MessageTimeout = a.Timeouts.Message
	c.FrameTimeout = a.Timeouts.Frame
	c.Logger = log
	return c
}

// UDSAgent is the factory for transport "uds": a udsclient.Client that dials
// the agent's socket, reconnecting in the background.
func UDSAgent(a *config.Agent, log zerolog.Logger) (agentmux.Agent, error) {
	return udsclient.NewClient(UDSConfig(a, log))
}
