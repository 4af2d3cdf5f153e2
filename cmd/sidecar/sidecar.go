package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/accesslog"
	"github.com/zentinelproxy/sidecar/internal/admin"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/dataplane"
	"github.com/zentinelproxy/sidecar/internal/metrics"
	"github.com/zentinelproxy/sidecar/internal/reverse"
)

// sidecar is one running `sidecar run`: the dataplane with its agents and
// reverse listeners, the admin listener, the metrics and the access log,
// and the configuration file it reloads.
type sidecar struct {
	path     string
	override func(*config.Config) // command-line overrides, applied at every load
	log      zerolog.Logger
	version  string

	srv     atomic.Pointer[dataplane.Server]
	metrics *metrics.Metrics
	admin   *admin.Server
	access  *accesslog.Writer
	accessC io.Closer // the access log file, if any

	// failed receives the error of a listener that stopped on its own.
	failed chan error
	served chan struct{}

	// mu serializes reloads with each other and with shutdown; cfg and set
	// are what is being served.
	mu       sync.Mutex
	cfg      *config.Config
	set      *agentSet
	revCtx   context.Context
	stopRev  context.CancelFunc
	closed   bool
	retiring []*reverse.Listener                 // dropped by a reload, closing once idle
	required atomic.Pointer[[]string]            // fail-closed agents, for readiness
	revLns   atomic.Pointer[[]*reverse.Listener] // for the metrics
}

// reasonNotListening is /readyz's reason before the data listeners are
// bound and once a shutdown has started.
const reasonNotListening = "data listeners not accepting"

// agentRetire bounds how long a reverse listener dropped by a reload
// waits for the requests still using its agents.
const agentRetire = 30 * time.Second

// invalidConfig marks an error found while checking a configuration
// outside package config (transport options, reverse listeners that
// cannot change) as the operator's: the admin listener answers 400.
type invalidConfig struct{ err error }

func (e invalidConfig) Error() string   { return e.err.Error() }
func (e invalidConfig) Unwrap() []error { return []error{e.err, config.ErrConfigInvalid} }

// loadConfig reads, overrides and validates the file, transport options
// included.
func loadConfig(path string, override func(*config.Config)) (*config.Config, error) {
	cfg, err := config.Load(path)
	if err != nil {
		return nil, err
	}
	if override != nil {
		override(cfg)
		if err := cfg.Validate(); err != nil {
			return nil, err
		}
	}
	if err := checkTransports(cfg); err != nil {
		return nil, invalidConfig{err}
	}
	return cfg, nil
}

// startSidecar starts everything cfg describes and returns once the data
// listeners are bound (or failed).
func startSidecar(cfg *config.Config, path string, override func(*config.Config), log zerolog.Logger) (*sidecar, error) {
	s := &sidecar{
		path:     path,
		override: override,
		log:      log,
		version:  version(),
		cfg:      cfg,
		failed:   make(chan error, 8),
		served:   make(chan struct{}),
	}
	ok := false
	defer func() {
		if !ok {
			s.abort()
		}
	}()
	var obs []dataplane.Observer
	if cfg.Admin.MetricsOn() {
		m, err := metrics.New(metrics.Config{Version: s.version})
		if err != nil {
			return nil, err
		}
		s.metrics = m
		obs = append(obs, m)
	}
	if cfg.AccessLog.Enabled {
		out, closer, err := openAccessLog(cfg.AccessLog.Output)
		if err != nil {
			return nil, err
		}
		s.accessC = closer
		s.access = accesslog.NewWriter(out, 0, 0, 0)
		l, err := accesslog.New(s.access, accesslog.Config{SampleEvery: cfg.AccessLog.SampleEvery})
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

	set, err := buildAgents(cfg, log)
	if err != nil {
		return nil, err
	}
	s.set = set
	s.revCtx, s.stopRev = context.WithCancel(context.Background())
	s.serveReverse(set.reverse)
	s.revLns.Store(&set.reverse)

	wctx, cancel := context.WithTimeout(context.Background(), agentWait)
	missing := waitAgents(wctx, set.agents)
	cancel()
	for _, name := range missing {
		log.Warn().Str("agent", name).Str("last_error", set.agents[name].Snapshot().LastError).
			Msg("agent not connected yet; its failure mode applies until it is")
	}

	srv, err := dataplane.New(dataplane.Config{File: cfg, Observer: dataplane.Observers(obs...)}, set.agents, log)
	if err != nil {
		return nil, err
	}
	s.srv.Store(srv) // the server closes the agents from here on
	if s.metrics != nil {
		s.metrics.SetAgents(srv.AgentStatus)
		s.metrics.SetStats(srv.Stats)
		s.metrics.SetReverse(func() []*reverse.Listener { return *s.revLns.Load() })
	}
	go func() {
		defer close(s.served)
		if err := srv.ListenAndServe(); err != nil {
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
	ev := log.Info().Strs("listeners", addrs).Int("routes", len(cfg.Routes)).Int("agents", len(cfg.Agents))
	if s.admin != nil {
		ev = ev.Str("admin", s.admin.Addr().String())
	}
	ev.Msg("sidecar serving")
	ok = true
	return s, nil
}

// fail reports a listener that stopped on its own; the first one stops
// the sidecar, later ones are already moot.
func (s *sidecar) fail(err error) {
	select {
	case s.failed <- err:
	default:
	}
}

// waitListening waits until the data listeners are bound or failed.
func (s *sidecar) waitListening(srv *dataplane.Server) error {
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

func (s *sidecar) startAdmin(cfg *config.Config) error {
	ac := admin.Config{
		Address: cfg.Admin.Address,
		Version: s.version,
		Ready:   s.ready,
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
		Log: s.log,
	}
	if s.path != "" {
		ac.Reload = s.reload
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

// ready is the readiness rule: the data listeners accept and every
// fail-closed agent has a live connection.
func (s *sidecar) ready() (bool, string) {
	srv := s.srv.Load()
	if srv == nil || !srv.Listening() {
		return false, reasonNotListening
	}
	return admin.AgentsReady(srv.AgentStatus(), *s.required.Load())
}

func (s *sidecar) setRequired(cfg *config.Config) {
	req := admin.FailClosedAgents(cfg)
	s.required.Store(&req)
}

// serveReverse serves lns until the sidecar stops; a listener whose
// socket fails stops the sidecar.
func (s *sidecar) serveReverse(lns []*reverse.Listener) {
	for _, l := range lns {
		go func() {
			if err := l.Serve(s.revCtx); err != nil {
				s.fail(err)
			}
		}()
	}
}

// reloadSignal reloads on SIGHUP, through the admin listener when there
// is one so that /status counts it.
func (s *sidecar) reloadSignal() {
	s.log.Info().Str("config", s.path).Msg("SIGHUP: reloading the configuration")
	if s.admin != nil {
		_ = s.admin.Reload() // logs the outcome
		return
	}
	if err := s.reload(); err != nil {
		s.log.Error().Err(err).Msg("configuration reload failed; the previous configuration keeps serving")
		return
	}
	s.log.Info().Msg("configuration reloaded")
}

// reload re-reads the configuration file and applies it: validate, build
// what changed, swap, retire what is no longer used. On any error the
// running configuration stays as it was.
func (s *sidecar) reload() (err error) {
	if s.metrics != nil {
		defer func() { s.metrics.ConfigReloaded(err) }()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("shutting down")
	}
	srv := s.srv.Load()
	if srv == nil {
		return errors.New("still starting")
	}
	cfg, err := loadConfig(s.path, s.override)
	if err != nil {
		return err
	}
	next, fresh, newLns, retired, err := s.buildNext(cfg)
	if err != nil {
		return err
	}
	undo := func() {
		for _, a := range fresh {
			_ = a.Close()
		}
		for _, l := range newLns {
			_ = l.Close()
		}
	}
	s.serveReverse(newLns)
	if len(fresh) > 0 || len(newLns) > 0 {
		// New agents get the time a start gives them to connect, so that
		// the swap does not turn requests into failures.
		wctx, cancel := context.WithTimeout(context.Background(), agentWait)
		waiting := make(map[string]agentmux.Agent, len(fresh))
		for name, a := range next.agents {
			if slices.Contains(fresh, a) || isOnListener(a, newLns) {
				waiting[name] = a
			}
		}
		missing := waitAgents(wctx, waiting)
		cancel()
		for _, name := range missing {
			s.log.Warn().Str("agent", name).Msg("reload: agent not connected yet; its failure mode applies until it is")
		}
	}
	if err := srv.Swap(cfg, next.agents); err != nil {
		undo()
		return err
	}
	for _, l := range retired {
		s.retiring = append(s.retiring, l)
		go s.retireListener(l)
	}
	if changed := restartOnly(s.cfg, cfg); len(changed) > 0 {
		s.log.Warn().Strs("sections", changed).Msg("reload: these settings change only with a restart")
	}
	s.cfg, s.set = cfg, next
	s.setRequired(cfg)
	s.revLns.Store(&next.reverse)
	return nil
}

func isOnListener(a agentmux.Agent, lns []*reverse.Listener) bool {
	for _, l := range lns {
		for _, name := range l.Agents() {
			if l.Agent(name) == a {
				return true
			}
		}
	}
	return false
}

// buildNext builds the agents of cfg, reusing every instance whose
// connection settings did not change and every reverse listener whose
// settings did not change. fresh are the agents built here and newLns the
// listeners bound here (to close if the reload fails); retired are the
// current reverse listeners cfg no longer has. On error nothing built
// here stays open.
func (s *sidecar) buildNext(cfg *config.Config) (next *agentSet, fresh []agentmux.Agent, newLns, retired []*reverse.Listener, err error) {
	old := s.set
	next = &agentSet{agents: make(map[string]agentmux.Agent, len(cfg.Agents))}
	fail := func(err error) (*agentSet, []agentmux.Agent, []*reverse.Listener, []*reverse.Listener, error) {
		for _, a := range fresh {
			_ = a.Close()
		}
		for _, l := range newLns {
			_ = l.Close()
		}
		return nil, nil, nil, nil, err
	}

	// Reverse listeners by address: kept when identical, bound when new.
	lcs, err := reverse.ListenerConfigs(reverseSpecs(cfg))
	if err != nil {
		return fail(invalidConfig{err})
	}
	oldByAddr := map[string]int{}
	for i, lc := range old.reverseCfgs {
		oldByAddr[reverseKey(lc)] = i
	}
	kept := map[int]bool{}
	for _, lc := range lcs {
		key := reverseKey(lc)
		if i, ok := oldByAddr[key]; ok {
			if !reflect.DeepEqual(old.reverseCfgs[i], lc) {
				return fail(invalidConfig{fmt.Errorf("config: the reverse listener at %s changed; restart to apply", key)})
			}
			kept[i] = true
			next.reverse = append(next.reverse, old.reverse[i])
			next.reverseCfgs = append(next.reverseCfgs, lc)
			continue
		}
		l, err := reverse.NewListener(lc, s.log.With().Str("component", "reverse").Logger())
		if err != nil {
			return fail(err)
		}
		newLns = append(newLns, l)
		next.reverse = append(next.reverse, l)
		next.reverseCfgs = append(next.reverseCfgs, lc)
	}
	for i, l := range old.reverse {
		if !kept[i] {
			retired = append(retired, l)
		}
	}

	tr := transports(next)
	for i := range cfg.Agents {
		a := &cfg.Agents[i]
		if a.Transport != config.TransportReverse {
			if prev := s.cfg.Agent(a.Name); prev != nil && sameInstance(prev, a) && old.agents[a.Name] != nil {
				next.agents[a.Name] = old.agents[a.Name]
				continue
			}
		}
		f := tr[a.Transport]
		if f == nil {
			return fail(fmt.Errorf("agent %q: transport %q is not available", a.Name, a.Transport))
		}
		inst, err := f(a, s.log.With().Str("agent", a.Name).Logger())
		if err != nil {
			return fail(err)
		}
		if a.Transport != config.TransportReverse {
			// Reverse pools belong to their listener: closed with it.
			fresh = append(fresh, inst)
		}
		next.agents[a.Name] = inst
	}
	return next, fresh, newLns, retired, nil
}

// reverseKey names a reverse listener by its address.
func reverseKey(c reverse.Config) string {
	if c.UnixPath != "" {
		return "unix:" + c.UnixPath
	}
	return c.TCPAddr
}

// sameInstance reports whether an agent instance built for a serves b:
// only the route policy (failure mode, request budget, bodies) differs,
// which the dataplane applies per request.
func sameInstance(a, b *config.Agent) bool {
	x, y := *a, *b
	for _, c := range []*config.Agent{&x, &y} {
		c.FailureMode = ""
		c.Timeouts.Request = 0
		c.RequestBody, c.ResponseBody = config.BodyPolicy{}, config.BodyPolicy{}
	}
	return reflect.DeepEqual(x, y)
}

// retireListener closes a reverse listener a reload dropped once the
// requests still using its agents are done (bounded by agentRetire).
func (s *sidecar) retireListener(l *reverse.Listener) {
	deadline := time.Now().Add(agentRetire)
	for time.Now().Before(deadline) {
		busy := false
		for _, name := range l.Agents() {
			if l.Agent(name).Snapshot().InFlight > 0 {
				busy = true
			}
		}
		if !busy {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = l.Close()
}

// restartOnly lists the sections that differ between a and b but are
// only applied at start.
func restartOnly(a, b *config.Config) []string {
	var out []string
	if !reflect.DeepEqual(a.Listeners, b.Listeners) {
		out = append(out, "listeners")
	}
	if !reflect.DeepEqual(a.Admin, b.Admin) {
		out = append(out, "admin")
	}
	if !reflect.DeepEqual(a.AccessLog, b.AccessLog) {
		out = append(out, "access_log")
	}
	if !reflect.DeepEqual(a.Logging, b.Logging) {
		out = append(out, "logging")
	}
	return out
}

// shutdown stops the sidecar: not ready, stop accepting, drain in-flight
// requests until ctx ends, CancelAll to and close the agents, close the
// reverse listeners, flush the access log, close the admin listener.
func (s *sidecar) shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
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
func (s *sidecar) abort() {
	if srv := s.srv.Load(); srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = srv.Shutdown(ctx) // a no-op after shutdown
		cancel()
	} else if s.set != nil {
		for _, a := range s.set.agents {
			_ = a.Close()
		}
	}
	if s.stopRev != nil {
		s.stopRev()
	}
	s.mu.Lock()
	retiring := s.retiring
	s.mu.Unlock()
	for _, l := range retiring {
		_ = l.Close()
	}
	if s.set != nil {
		s.set.closeListeners()
	}
	if s.access != nil {
		_ = s.access.Close()
	}
	if s.accessC != nil {
		_ = s.accessC.Close()
	}
	if s.admin != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = s.admin.Shutdown(ctx)
		cancel()
	}
}

// openAccessLog opens the access log output: stdout, stderr or a file.
func openAccessLog(out string) (io.Writer, io.Closer, error) {
	switch out {
	case "", "stdout":
		return os.Stdout, nil, nil
	case "stderr":
		return os.Stderr, nil, nil
	}
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return nil, nil, fmt.Errorf("access log: %w", err)
	}
	return f, f, nil
}
