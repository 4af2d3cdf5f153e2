package bench

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/dataplane"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/transports"
	"github.com/zentinelproxy/sidecar/sdk"
)

// ErrBenchSetup is returned when a row could not be set up.
var ErrBenchSetup = errors.New("bench: row setup failed")

// readyTimeout bounds how long a row waits for its agents to connect.
const readyTimeout = 5 * time.Second

// Env is what a row's Setup builds on: the shared upstream, a private
// directory for sockets, and helpers that start sidecars and agents and
// stop them when the row ends.
type Env struct {
	// UpstreamAddr is the benchmark upstream's host:port.
	UpstreamAddr string
	// Dir is a private directory for Unix sockets, short enough for their
	// 107-byte path limit.
	Dir string
	// Logger is handed to sidecars and agents (errors only by default, so
	// that logging does not weigh on the numbers).
	Logger zerolog.Logger
	// Transports build the agents StartSidecar is not handed (default:
	// transports.Dialing). A row may add its transport's factory.
	Transports transports.Factories
	// Dataplane, when set, adjusts the dataplane configuration before
	// StartSidecar creates the server (an Observer for a metrics row, …).
	Dataplane func(*dataplane.Config)
	// ClientTLS, set by a row whose listener speaks TLS, makes the load
	// generator connect over TLS with it (rows_tls.go).
	ClientTLS *tls.Config

	ctx   context.Context
	stops []func()
}

// Defer registers f to run when the row ends, after everything registered
// later (last in, first out).
func (e *Env) Defer(f func()) { e.stops = append(e.stops, f) }

// Context ends when the row ends.
func (e *Env) Context() context.Context { return e.ctx }

func (e *Env) stop() {
	for i := len(e.stops) - 1; i >= 0; i-- {
		e.stops[i]()
	}
	e.stops = nil
}

// Config returns a sidecar configuration with one loopback listener on a
// free port, the benchmark upstream, and one route through agents in
// order. Rows adjust it before StartSidecar.
func (e *Env) Config(agents ...config.Agent) *config.Config {
	c := &config.Config{
		Listeners: []config.Listener{{Name: "bench", Address: "127.0.0.1:0"}},
		Upstreams: []config.Upstream{{Name: "upstream", Address: e.UpstreamAddr}},
		Routes:    []config.Route{{Name: "bench", Upstream: "upstream"}},
		Logging:   config.Logging{Level: "error"},
	}
	for _, a := range agents {
		c.Agents = append(c.Agents, a)
		c.Routes[0].Agents = append(c.Routes[0].Agents, config.RouteAgent{Name: a.Name})
	}
	return c
}

// StartUDSAgent serves h on a Unix socket in Dir until the row ends and
// returns the agent's configuration entry (transport uds, fail-closed) to
// pass to Config.
func (e *Env) StartUDSAgent(name string, h sdk.Handler) (config.Agent, error) {
	path := filepath.Join(e.Dir, name+".sock")
	ln, err := sdk.ListenUDS(path, nil)
	if err != nil {
		return config.Agent{}, fmt.Errorf("%w: agent %s: %v", ErrBenchSetup, name, err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = sdk.Serve(ctx, ln, h, &sdk.Options{Name: name})
	}()
	e.Defer(func() {
		cancel()
		<-done
		_ = os.Remove(path)
	})
	return config.Agent{Name: name, Transport: config.TransportUDS, Address: path}, nil
}

// StartSidecar starts a sidecar on cfg until the row ends and returns its
// listener's host:port once its agents are connected. agents holds
// instances built by the row (keyed by agent name); the others are built
// from cfg with Transports.
func (e *Env) StartSidecar(cfg *config.Config, agents map[string]agentmux.Agent) (string, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return "", fmt.Errorf("%w: %v", ErrBenchSetup, err)
	}
	all := make(map[string]agentmux.Agent, len(cfg.Agents))
	closeAll := func() {
		for _, a := range all {
			_ = a.Close()
		}
	}
	for k, v := range agents {
		all[k] = v
	}
	tr := e.Transports
	if tr == nil {
		tr = transports.Dialing()
	}
	for i := range cfg.Agents {
		a := &cfg.Agents[i]
		if all[a.Name] != nil {
			continue
		}
		f := tr[a.Transport]
		if f == nil {
			closeAll()
			return "", fmt.Errorf("%w: agent %s: no factory for transport %s", ErrBenchSetup, a.Name, a.Transport)
		}
		inst, err := f(a, e.Logger)
		if err != nil {
			closeAll()
			return "", fmt.Errorf("%w: %v", ErrBenchSetup, err)
		}
		all[a.Name] = inst
	}
	wctx, cancel := context.WithTimeout(e.ctx, readyTimeout)
	defer cancel()
	for name, a := range all {
		if err := waitReady(wctx, a); err != nil {
			closeAll()
			return "", fmt.Errorf("%w: agent %s: %v", ErrBenchSetup, name, err)
		}
	}
	dc := dataplane.Config{File: cfg}
	if e.Dataplane != nil {
		e.Dataplane(&dc)
	}
	srv, err := dataplane.New(dc, all, e.Logger)
	if err != nil {
		closeAll()
		return "", fmt.Errorf("%w: %v", ErrBenchSetup, err)
	}
	// From here the server owns the agents and closes them on Shutdown.
	ln, err := net.Listen("tcp", cfg.Listeners[0].Address)
	if err != nil {
		_ = srv.Shutdown(context.Background())
		return "", fmt.Errorf("%w: %v", ErrBenchSetup, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	e.Defer(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	})
	return ln.Addr().String(), nil
}

// waitReady waits until a has a live connection.
func waitReady(ctx context.Context, a agentmux.Agent) error {
	if w, ok := a.(interface{ WaitReady(context.Context) error }); ok {
		return w.WaitReady(ctx)
	}
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for !a.Snapshot().Ready {
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready: %s", a.Snapshot().LastError)
		case <-t.C:
		}
	}
	return nil
}
