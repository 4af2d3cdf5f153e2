package bench

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/examples/allowagent"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/grpcclient"
	"github.com/zentinelproxy/sidecar/reverse"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/sdk/grpcsdk"
)

// Rows of the other transports, with the same headers-only agent as the
// UDS row so that the transports compare.
func init() {
	Register(Row{
		Name:  "sidecar + gRPC agent (headers)",
		Order: 40,
		Setup: func(env *Env) (string, error) {
			a, inst, err := env.StartGRPCAgent("allow", allowagent.New(false))
			if err != nil {
				return "", err
			}
			return env.StartSidecar(env.Config(a), map[string]agentmux.Agent{a.Name: inst})
		},
	})
	Register(Row{
		Name:  "sidecar + reverse agent (headers)",
		Order: 50,
		Setup: func(env *Env) (string, error) {
			a, inst, err := env.StartReverseAgent("allow", allowagent.New(false))
			if err != nil {
				return "", err
			}
			return env.StartSidecar(env.Config(a), map[string]agentmux.Agent{a.Name: inst})
		},
	})
}

// StartGRPCAgent serves h over gRPC on a loopback port until the row ends
// and returns its configuration entry and the sidecar's client for it
// (pass both to StartSidecar).
func (e *Env) StartGRPCAgent(name string, h sdk.Handler) (config.Agent, agentmux.Agent, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return config.Agent{}, nil, fmt.Errorf("%w: agent %s: %v", ErrBenchSetup, name, err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = grpcsdk.Serve(ctx, ln, h, &grpcsdk.Options{Name: name})
	}()
	e.Defer(func() { cancel(); <-done })

	a := config.Agent{Name: name, Transport: config.TransportGRPC, Address: ln.Addr().String()}
	c := grpcclient.DefaultConfig(name, a.Address)
	c.Logger = e.Logger.With().Str("agent", name).Logger()
	cl, err := grpcclient.NewClient(c)
	if err != nil {
		return config.Agent{}, nil, fmt.Errorf("%w: %v", ErrBenchSetup, err)
	}
	return a, cl, nil
}

// StartReverseAgent starts the sidecar's reverse listener on a Unix
// socket in Dir and an agent serving h that dials it, until the row ends.
// It returns the agent's configuration entry and its pool (pass both to
// StartSidecar).
func (e *Env) StartReverseAgent(name string, h sdk.Handler) (config.Agent, agentmux.Agent, error) {
	path := filepath.Join(e.Dir, name+"-reverse.sock")
	lc := reverse.DefaultConfig()
	lc.UnixPath = path
	lc.Agents = []reverse.AgentConfig{{Name: name, AllowNoToken: true}}
	l, err := reverse.NewListener(lc, e.Logger)
	if err != nil {
		return config.Agent{}, nil, fmt.Errorf("%w: %v", ErrBenchSetup, err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	lDone, aDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(lDone)
		_ = l.Serve(ctx)
	}()
	log := zerolog.Nop()
	go func() {
		defer close(aDone)
		_ = sdk.DialAndServe(ctx, sdk.ReverseConfig{
			Address: path, AgentID: name, Logger: &log,
			BackoffMin: 10 * time.Millisecond, BackoffMax: 500 * time.Millisecond,
		}, h)
	}()
	e.Defer(func() { cancel(); <-aDone; _ = l.Close(); <-lDone })
	a := config.Agent{
		Name: name, Transport: config.TransportReverse, Address: "unix:" + path,
		Options: map[string]string{"allow_no_token": "true"},
	}
	return a, l.Agent(name), nil
}
