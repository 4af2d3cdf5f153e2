// Package supervisor runs one sidecar: it builds everything a
// configuration describes — the agent instances of every transport, the
// reverse listeners, the dataplane server, the admin listener, the
// metrics and the access log — serves it, reloads it, and shuts it down.
//
//	cfg, err := supervisor.Load(path, nil)
//	o := supervisor.DefaultOptions()
//	o.Path, o.Log = path, log
//	s, err := supervisor.Start(ctx, cfg, o) // returns once the data listeners accept
//	err = s.Run(ctx, sigs)                  // until ctx ends, SIGTERM, or a listener fails
//
// Reload re-reads the file: it validates it completely, has
// transports.Agents build the agents anew — keeping every instance whose
// transports.InstanceKey did not change (only the policy the dataplane
// applies per request changed) and every reverse listener whose agents
// did not change — swaps the routing table and agents in atomically and
// retires what is no longer used. Shutdown turns /readyz to 503, drains
// in-flight requests, sends CancelAll to the agents and closes
// everything.
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/dataplane"
	"github.com/zentinelproxy/sidecar/internal/accesslog"
	"github.com/zentinelproxy/sidecar/internal/admin"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/metrics"
	"github.com/zentinelproxy/sidecar/internal/transports"
	"github.com/zentinelproxy/sidecar/internal/version"
)

// Defaults of Options.
const (
	// DefaultAgentWait is how long Start waits for the agents before it
	// serves anyway (their failure modes decide until they connect), and
	// how long a reload waits for the agents it adds.
	DefaultAgentWait = 3 * time.Second
	// DefaultDrain is how long in-flight requests may take to finish when
	// Run shuts down.
	DefaultDrain = 10 * time.Second
)

// ReasonNotListening is /readyz's reason before the data listeners are
// bound and once a shutdown has started.
const ReasonNotListening = "data listeners not accepting"

// Options configure a Supervisor beyond its configuration. Start from
// DefaultOptions; a zero duration means none (no wait, no drain).
type Options struct {
	// Path is the configuration file Reload re-reads; "" means the
	// configuration cannot be reloaded (and the admin listener serves no
	// /reload).
	Path string
	// Override applies command-line overrides at every load of Path.
	Override func(*config.Config)
	// Log receives the process log (the zero Logger discards).
	Log zerolog.Logger
	// Version is shown on /status and in sidecar_build_info.
	Version string
	// AgentWait bounds how long Start waits for the agents to connect,
	// and a reload for the agents it adds.
	AgentWait time.Duration
	// Drain bounds how long in-flight requests may take to finish when
	// Run shuts down.
	Drain time.Duration
	// Listener, if set, is served instead of binding the address of the
	// configuration's only listener (a caller that binds first to report
	// a taken port). The supervisor closes it on Shutdown.
	Listener net.Listener
}

// DefaultOptions returns Options with the default waits.
func DefaultOptions() Options {
	return Options{Version: version.Get().Version, AgentWait: DefaultAgentWait, Drain: DefaultDrain}
}

// Supervisor is one running sidecar. Create it with Start.
type Supervisor struct {
	opts Options
	log  zerolog.Logger

	srv     atomic.Pointer[dataplane.Server]
	metrics *metrics.Metrics
	admin   *admin.Server
	access  *accesslog.Writer
	accessF *accesslog.File // the access log file, if any

	// failed receives the error of a listener that stopped on its own.
	failed chan error
	served chan struct{}

	// agents builds and keeps the agent instances and reverse listeners;
	// start is their first Build until the dataplane serves it.
	agents *transports.Agents
	start  *transports.Build

	// mu serializes reloads with each other and with shutdown; cfg is
	// what is being served.
	mu       sync.Mutex
	cfg      *config.Config
	closed   bool
	required atomic.Pointer[[]string] // fail-closed agents, for readiness

	// fds are the sockets inherited from a service manager (nil when
	// Options.Listener is given).
	fds *inherited
}

// Start starts everything cfg describes and returns once the data
// listeners accept. cfg must have passed Load (or config validation and
// Check). It waits up to o.AgentWait for the agents; when ctx ends first,
// it stops what it started and returns ctx's error. On any error nothing
// it started stays open.
func Start(ctx context.Context, cfg *config.Config, o Options) (*Supervisor, error) {
	if o.Listener != nil && len(cfg.Listeners) != 1 {
		return nil, fmt.Errorf("supervisor: a given listener needs exactly one configured listener, not %d", len(cfg.Listeners))
	}
	s := &Supervisor{
		opts:   o,
		log:    o.Log,
		cfg:    cfg,
		failed: make(chan error, 8),
		served: make(chan struct{}),
	}
	ok := false
	defer func() {
		if !ok {
			s.abort()
		}
	}()
	var obs []dataplane.Observer
	if cfg.Admin.MetricsOn() {
		m, err := metrics.New(metrics.Config{Version: o.Version})
		if err != nil {
			return nil, err
		}
		s.metrics = m
		obs = append(obs, m)
	}
	for _, w := range Warnings(cfg) {
		s.log.Warn().Str("key", w.Path).Int("line", w.Line).Msg(w.String())
	}
	if cfg.AccessLog.Enabled {
		out, f, err := openAccessLog(cfg.AccessLog.Output)
		if err != nil {
			return nil, cfg.ErrorAt("access_log.output", err)
		}
		s.accessF = f
		s.access = accesslog.NewWriter(out, 0, 0, 0)
		l, err := accesslog.New(s.access, accesslog.Config{SampleEvery: cfg.AccessLog.SampleEvery, Fields: cfg.AccessLog.Fields})
		if err != nil {
			return nil, err
		}
		obs = append(obs, l)
	}
	s.setRequired(cfg)
	if cfg.Admin.On() {
		if err := s.startAdmin(cfg); err != nil {
			return nil, err
		}
	}

	s.agents = transports.NewAgents(s.log, s.fail)
	b, err := s.agents.Build(cfg)
	if err != nil {
		return nil, err
	}
	s.start = b

	wctx, cancel := context.WithTimeout(ctx, o.AgentWait)
	missing := waitAgents(wctx, b.Agents())
	cancel()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for _, name := range missing {
		s.log.Warn().Str("agent", name).Str("last_error", b.Agents()[name].Snapshot().LastError).
			Msg("agent not connected yet; its failure mode applies until it is")
	}

	dcfg := dataplane.Config{File: cfg, Observer: dataplane.Observers(obs...)}
	if o.Listener == nil {
		fds, err := newInherited(s.log)
		if err != nil {
			return nil, err
		}
		s.fds = fds
		dcfg.Listen = fds.take
	}
	srv, err := dataplane.New(dcfg, b.Agents(), s.log)
	if err != nil {
		return nil, err
	}
	s.srv.Store(srv) // the server closes the agents from here on
	b.Commit()
	s.start = nil
	if s.metrics != nil {
		s.metrics.SetAgents(srv.AgentStatus)
		s.metrics.SetStats(srv.Stats)
		s.metrics.SetUpstreams(srv.Upstreams)
		s.metrics.SetTracing(srv.TracingStats)
		s.metrics.SetPolicy(srv.PolicyStatus)
	}
	go func() {
		defer close(s.served)
		var err error
		if o.Listener != nil {
			err = srv.Serve(o.Listener)
		} else {
			err = srv.ListenAndServe()
		}
		if err != nil && !errors.Is(err, dataplane.ErrDataplaneClosed) {
			s.fail(err)
		}
	}()
	if err := s.waitListening(srv); err != nil {
		return nil, err
	}
	addrs := make([]string, 0, len(cfg.Listeners))
	for _, a := range srv.Addrs() {
		addrs = append(addrs, a.String())
	}
	ev := s.log.Info().Strs("listeners", addrs).Int("routes", len(cfg.Routes)).Int("agents", len(cfg.Agents))
	if s.admin != nil {
		ev = ev.Str("admin", s.admin.Addr().String())
	}
	ev.Msg("sidecar serving")
	if s.fds != nil {
		s.fds.warnUnused()
	}
	s.notify("READY=1")
	ok = true
	return s, nil
}

// Run serves until ctx ends, a SIGINT or SIGTERM arrives on sigs, or a
// listener fails, then shuts down, letting in-flight requests finish
// within Options.Drain; another SIGINT or SIGTERM ends the drain at once.
// A SIGHUP on sigs reloads the configuration, a SIGUSR1 reopens the
// access log file. sigs may be nil. Run returns nil after a clean
// shutdown, the listener's error after a failure, or, when requests were
// cut off, ErrShutdownForced (a second signal) or an error wrapping
// ErrDrainTimeout.
func (s *Supervisor) Run(ctx context.Context, sigs <-chan os.Signal) error {
	for {
		select {
		case sig := <-sigs:
			switch sig {
			case syscall.SIGHUP:
				s.reloadSignal()
				continue
			case syscall.SIGUSR1:
				s.reopenSignal()
				continue
			}
			s.log.Info().Str("signal", sig.String()).Dur("drain", s.opts.Drain).Msg("shutting down")
			return s.stop(sigs)
		case <-ctx.Done():
			return s.stop(nil)
		case err := <-s.failed:
			s.log.Error().Err(err).Msg("a listener failed; shutting down")
			_ = s.stop(nil)
			return err
		}
	}
}

// Errors of Run when requests were still running as the drain ended.
var (
	// ErrShutdownForced: a second SIGINT or SIGTERM ended the drain.
	ErrShutdownForced = errors.New("shutdown forced by a second signal: requests still running were cut off")
	// ErrDrainTimeout: the drain (Options.Drain) ran out.
	ErrDrainTimeout = errors.New("shutdown: the drain ran out: requests still running were cut off")
)

// stop shuts down within Options.Drain; another SIGINT or SIGTERM on
// sigs ends the drain at once.
func (s *Supervisor) stop(sigs <-chan os.Signal) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.Drain)
	defer cancel()
	done := make(chan struct{})
	defer close(done)
	var forced atomic.Bool
	if sigs != nil {
		go func() {
			for {
				select {
				case sig := <-sigs:
					switch sig {
					case syscall.SIGHUP:
					case syscall.SIGUSR1:
						s.reopenSignal()
					default:
						s.log.Warn().Str("signal", sig.String()).Msg("second signal: ending the drain now")
						forced.Store(true)
						cancel()
						return
					}
				case <-done:
					return
				}
			}
		}()
	}
	err := s.Shutdown(ctx)
	if err != nil {
		if forced.Load() {
			err = ErrShutdownForced
		} else if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w (-drain %v)", ErrDrainTimeout, s.opts.Drain)
		}
		s.log.Error().Err(err).Msg("stopped before every request finished")
		return err
	}
	s.log.Info().Msg("stopped")
	return nil
}

// Failed receives the error of a data or reverse listener that stopped
// on its own; Run shuts down on it.
func (s *Supervisor) Failed() <-chan error { return s.failed }

// Addrs returns the bound data listener addresses, in configuration
// order.
func (s *Supervisor) Addrs() []net.Addr { return s.srv.Load().Addrs() }

// AdminAddr returns the admin listener's address, or nil without one.
func (s *Supervisor) AdminAddr() net.Addr {
	if s.admin == nil {
		return nil
	}
	return s.admin.Addr()
}

// Agents returns a snapshot of every agent being served.
func (s *Supervisor) Agents() []agentmux.AgentStatus { return s.srv.Load().AgentStatus() }

// fail reports a listener that stopped on its own; the first one stops
// the sidecar, later ones are already moot.
func (s *Supervisor) fail(err error) {
	select {
	case s.failed <- err:
	default:
	}
}

// waitListening waits until the data listeners are bound or failed.
func (s *Supervisor) waitListening(srv *dataplane.Server) error {
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for !srv.Listening() {
		select {
		case err := <-s.failed:
			return err
		case <-t.C:
		}
	}
	return nil
}

func (s *Supervisor) startAdmin(cfg *config.Config) error {
	ac := admin.Config{
		Address: cfg.Admin.Address,
		Version: s.opts.Version,
		Build:   version.Get(),
		Ready:   s.Ready,
		Routes: func() []string {
			if srv := s.srv.Load(); srv != nil {
				return srv.Routes()
			}
			return nil
		},
		Agents: func() []agentmux.AgentStatus {
			if srv := s.srv.Load(); srv != nil {
				return srv.AgentStatus()
			}
			return nil
		},
		Stats: func() dataplane.Stats {
			if srv := s.srv.Load(); srv != nil {
				return srv.Stats()
			}
			return dataplane.Stats{}
		},
		Policy: func() dataplane.PolicyStatus {
			if srv := s.srv.Load(); srv != nil {
				return srv.PolicyStatus()
			}
			return dataplane.PolicyStatus{}
		},
		Log: s.log,
	}
	if s.opts.Path != "" {
		ac.Reload = s.Reload
	}
	ac.AllowedHosts = cfg.Admin.AllowedHosts
	if s.metrics != nil {
		ac.Gatherer = s.metrics.Registry()
	}
	a, err := admin.New(ac)
	if err != nil {
		return err
	}
	if err := a.Start(); err != nil {
		return err
	}
	s.admin = a
	return nil
}

// Ready is the readiness rule: the data listeners accept and every
// fail-closed agent has a live connection. (/readyz adds "shutting down"
// once Shutdown has started.)
func (s *Supervisor) Ready() (bool, string) {
	srv := s.srv.Load()
	if srv == nil || !srv.Listening() {
		return false, ReasonNotListening
	}
	return admin.AgentsReady(srv.AgentStatus(), *s.required.Load())
}

func (s *Supervisor) setRequired(cfg *config.Config) {
	req := admin.FailClosedAgents(cfg)
	s.required.Store(&req)
}

// Shutdown stops the sidecar: not ready, stop accepting, drain in-flight
// requests until ctx ends, CancelAll to and close the agents, close the
// reverse listeners, flush the access log, close the admin listener. It
// returns an error when ctx ended before every request finished.
func (s *Supervisor) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.notify("STOPPING=1")
	if s.admin != nil {
		s.admin.SetDraining()
	}
	var err error
	if srv := s.srv.Load(); srv != nil {
		if serr := srv.Shutdown(ctx); serr != nil && !errors.Is(serr, dataplane.ErrDataplaneClosed) {
			err = fmt.Errorf("shutdown: %w", serr)
		}
		<-s.served
	}
	s.abort()
	return err
}

// abort closes whatever is still open (also after a failed start).
func (s *Supervisor) abort() {
	if srv := s.srv.Load(); srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = srv.Shutdown(ctx) // a no-op after shutdown
		cancel()
	} else if s.start != nil {
		s.start.Abort()
	}
	if s.agents != nil {
		s.agents.Close()
	}
	if s.fds != nil {
		s.fds.close()
	}
	if s.access != nil {
		_ = s.access.Close()
	}
	if s.accessF != nil {
		_ = s.accessF.Close()
	}
	if s.admin != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = s.admin.Shutdown(ctx)
		cancel()
	}
}

// openAccessLog opens the access log output: stdout, stderr or a file
// (returned as f too, for ReopenAccessLog).
func openAccessLog(out string) (w io.Writer, f *accesslog.File, err error) {
	switch out {
	case "", config.AccessLogStdout:
		return os.Stdout, nil, nil
	case config.AccessLogStderr:
		return os.Stderr, nil, nil
	}
	f, err = accesslog.OpenFile(out)
	if err != nil {
		return nil, nil, fmt.Errorf("access log: %w", err)
	}
	return f, f, nil
}

// ErrNoAccessLogFile: the access log is off or not written to a file, so
// there is nothing to reopen.
var ErrNoAccessLogFile = errors.New("the access log is not written to a file")

// ReopenAccessLog writes out the buffered access log lines to the file,
// then opens its path anew: after a rotation renamed the file, new lines
// go to a new file at the path, and none is lost. On error lines keep
// going to the file written so far.
func (s *Supervisor) ReopenAccessLog() error {
	if s.accessF == nil {
		return ErrNoAccessLogFile
	}
	s.access.Flush()
	if err := s.accessF.Reopen(); err != nil {
		return fmt.Errorf("reopening the access log %s: %w", s.accessF.Path(), err)
	}
	return nil
}

// reopenSignal reopens the access log on SIGUSR1 and logs the outcome.
func (s *Supervisor) reopenSignal() {
	switch err := s.ReopenAccessLog(); {
	case err == nil:
		s.log.Info().Str("path", s.accessF.Path()).Msg("SIGUSR1: access log reopened")
	case errors.Is(err, ErrNoAccessLogFile):
		s.log.Info().Msg("SIGUSR1: " + err.Error() + "; nothing to reopen")
	default:
		s.log.Error().Err(err).Msg("SIGUSR1: access log not reopened; lines keep going to the file written so far")
	}
}
