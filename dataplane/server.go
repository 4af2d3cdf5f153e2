package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/dataplane/internal/exchange"
	"github.com/zentinelproxy/sidecar/dataplane/internal/http1"
	"github.com/zentinelproxy/sidecar/dataplane/internal/http2"
	"github.com/zentinelproxy/sidecar/dataplane/internal/upstream"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/observe"
	"github.com/zentinelproxy/sidecar/internal/unixsock"
)

// Errors of the dataplane.
var (
	// ErrDataplaneConfig: the configuration cannot be served (a missing
	// agent instance, too many agents on a route).
	ErrDataplaneConfig = exchange.ErrConfig
	// ErrDataplaneClosed: the server was shut down.
	ErrDataplaneClosed = errors.New("dataplane: server closed")
	// ErrTLSConfig is a listener TLS setting that cannot be loaded (a
	// missing file, a bad PEM block, a key that does not match).
	ErrTLSConfig = http1.ErrTLSConfig
	// ErrCircuitOpen is the failure of a request that did not consult an
	// agent because its circuit is open (an unavailable agent).
	ErrCircuitOpen = exchange.ErrCircuitOpen
	// ErrTracing is a tracing setting that cannot be applied.
	ErrTracing = exchange.ErrTracing
)

// Marker headers the dataplane adds.
const (
	// HeaderFailOpen is set on the upstream request and the response when
	// an agent failed open; one value per agent.
	HeaderFailOpen = exchange.HeaderFailOpen
	// HeaderInspection is "skipped" when a body went uninspected because it
	// exceeded a buffered agent's limit ("partial" when only its prefix was
	// inspected).
	HeaderInspection = exchange.HeaderInspection
)

// Config configures a Server.
type Config struct {
	// File is the validated configuration: listeners, upstreams, routes
	// and the agents' policies.
	File *config.Config
	// Observer receives per-request events for metrics (default: none).
	Observer Observer
	// Listen, if set, is asked first for each listener's socket by
	// ListenAndServe (a socket inherited from a service manager); a nil
	// listener and nil error leave the server to bind the address itself.
	Listen func(name, address string) (net.Listener, error)
}

// Server is the reverse proxy. Create it with New; it serves the
// listeners of its configuration (ListenAndServe) or any net.Listener
// (Serve), and swaps routes and agents atomically (Swap).
type Server struct {
	log  zerolog.Logger
	core *exchange.Core
	// lsts are the listeners in configuration order; a Swap replaces
	// the slice (under mu) when listeners are added or removed.
	lsts   []*http1.Listener
	listen func(name, address string) (net.Listener, error) // Config.Listen
	// live holds what listeners.go keeps of each listener (under mu).
	live map[*http1.Listener]*liveListener
	// managed: ListenAndServe serves the listeners, so a Swap applies
	// the configuration's listeners; failc carries the first failure of
	// one, shut is closed by Shutdown, retiring counts the listeners a
	// Swap removed that are still draining.
	managed  bool
	failc    chan error
	shut     chan struct{}
	retiring sync.WaitGroup

	h1      http1.Counters
	h2      http2.Counters
	up      upstream.Counters
	clamped atomic.Uint64 // listeners whose limits were lowered to the descriptor budget

	mu     sync.Mutex
	agents map[string]agentmux.Agent
	// ups are the upstreams of the current table (Swap and Shutdown
	// start and stop them, under mu; status pages read them).
	ups    atomic.Pointer[[]*upstream.Upstream]
	closed bool
	serves sync.WaitGroup
	// listening is set once the listeners accept and cleared when
	// Shutdown starts (readiness).
	listening atomic.Bool
}

// New builds a server for cfg. agents holds one instance per agent of
// cfg.File, built by the caller for its transport (the dataplane knows
// agents only as agentmux.Agent); the server owns them from here on and
// closes them on Shutdown or when a Swap drops them.
func New(cfg Config, agents map[string]agentmux.Agent, log zerolog.Logger) (*Server, error) {
	if cfg.File == nil {
		return nil, fmt.Errorf("%w: no configuration", ErrDataplaneConfig)
	}
	if err := cfg.File.Validate(); err != nil {
		return nil, err
	}
	s := &Server{log: log, agents: agents, core: exchange.NewCore(cfg.Observer, log), listen: cfg.Listen,
		live: map[*http1.Listener]*liveListener{}, failc: make(chan error, 1), shut: make(chan struct{})}
	t, ups, err := s.buildTable(cfg.File, agents, nil, nil)
	if err != nil {
		return nil, err
	}
	s.core.Publish(t)
	s.ups.Store(&ups)
	upstream.WarnInsecure(cfg.File, log)
	interval := time.Duration(0)
	nofile := fdLimit()
	budget := connectionBudget(cfg.File, nofile)
	for _, lc := range cfg.File.Listeners {
		l, err := s.newListener(lc, budget, nofile)
		if err != nil {
			s.closeListeners()
			return nil, err
		}
		lc := l.Config()
		s.lsts = append(s.lsts, l)
		s.live[l] = &liveListener{file: cfg.File.Listeners[len(s.lsts)-1], done: make(chan struct{})}
		if interval == 0 || lc.DisconnectCheck < interval {
			interval = lc.DisconnectCheck
		}
	}
	// Goroutines last: nothing is left running when New fails.
	if err := s.core.Start(cfg.File.Tracing, interval); err != nil {
		s.closeListeners()
		return nil, err
	}
	for _, up := range ups {
		up.Start(&s.log)
	}
	return s, nil
}

// buildTable builds the routing table of cfg: its upstreams (from prev's
// where unchanged, prevUps), then the routes and agent policies.
func (s *Server) buildTable(cfg *config.Config, agents map[string]agentmux.Agent, prev *exchange.Table, prevUps []*upstream.Upstream) (*exchange.Table, []*upstream.Upstream, error) {
	ups := make([]*upstream.Upstream, 0, len(cfg.Upstreams))
	seam := make([]exchange.Upstream, 0, len(cfg.Upstreams))
	for _, u := range cfg.Upstreams {
		var prevUp *upstream.Upstream
		for _, old := range prevUps {
			if old.Name() == u.Name {
				prevUp = old
			}
		}
		up := upstream.New(u, prevUp, &s.up)
		ups = append(ups, up)
		seam = append(seam, up)
	}
	t, err := exchange.BuildTable(cfg, agents, seam, prev)
	if err != nil {
		return nil, nil, err
	}
	return t, ups, nil
}

// closeListeners stops the certificate watchers of the listeners.
func (s *Server) closeListeners() {
	for _, l := range s.lsts {
		l.Close()
	}
}

// Serve serves HTTP on ln with the settings of the first configured
// listener. It returns when ln fails or the server shuts down.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	s.live[s.lsts[0]].ln = ln
	s.mu.Unlock()
	s.markListening()
	return s.serve(s.lsts[0], ln)
}

// markListening records bound listeners: the kernel queues connections
// from here on, so the server counts as listening.
func (s *Server) markListening() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.listening.Store(true)
}

// Listening reports whether the listeners are bound and Shutdown has not
// started.
func (s *Server) Listening() bool { return s.listening.Load() }

// Addrs returns the bound listener addresses (useful with port 0), in
// configuration order for ListenAndServe.
func (s *Server) Addrs() []net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]net.Addr, 0, len(s.lsts))
	for _, l := range s.lsts {
		if ln := s.live[l].ln; ln != nil {
			out = append(out, ln.Addr())
		}
	}
	return out
}

func (s *Server) serve(l *http1.Listener, ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = ln.Close()
		return ErrDataplaneClosed
	}
	s.serves.Add(1)
	s.mu.Unlock()
	defer s.serves.Done()
	return l.Serve(ln)
}

// ListenAndServe listens on every configured listener and serves until
// Shutdown (nil) or a listener fails (its error). Listeners a Swap adds
// are served too, and those it removes stop.
func (s *Server) ListenAndServe() error {
	s.mu.Lock()
	lsts := s.lsts
	s.mu.Unlock()
	lns := make([]net.Listener, 0, len(lsts))
	for _, l := range lsts {
		ln, err := s.bind(l.Config())
		if err != nil {
			for _, o := range lns {
				_ = o.Close()
			}
			return fmt.Errorf("dataplane: listener %s: %w", l.Config().Name, err)
		}
		lns = append(lns, ln)
	}
	s.mu.Lock()
	s.managed = true
	for i, l := range lsts {
		s.live[l].ln = lns[i]
	}
	s.mu.Unlock()
	s.markListening()
	for _, l := range lsts {
		s.start(l, nil)
	}
	select {
	case err := <-s.failc:
		s.mu.Lock()
		for _, l := range s.lsts {
			if ln := s.live[l].ln; ln != nil {
				_ = ln.Close()
			}
		}
		s.mu.Unlock()
		return err
	case <-s.shut:
		s.serves.Wait()
		return nil
	}
}

// bind returns the socket of listener lc: Config.Listen's, or bound here.
func (s *Server) bind(lc *config.Listener) (net.Listener, error) {
	if s.listen != nil {
		if ln, err := s.listen(lc.Name, lc.Address); ln != nil || err != nil {
			return ln, err
		}
	}
	return listen(lc.Address)
}

func listen(addr string) (net.Listener, error) {
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		return unixsock.Listen(path, 0)
	}
	return net.Listen("tcp", addr)
}

// Shutdown stops accepting, waits for in-flight requests to finish (or
// ctx to end), then closes the agents and the upstream pools.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrDataplaneClosed
	}
	s.closed = true
	s.listening.Store(false)
	close(s.shut)
	s.mu.Unlock()
	var first error
	for _, l := range s.lsts {
		if err := l.Shutdown(ctx); err != nil && first == nil {
			first = err
		}
	}
	done := make(chan struct{})
	go func() { s.serves.Wait(); s.retiring.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		if first == nil {
			first = ctx.Err()
		}
	}
	s.waitLingering(ctx)
	for _, l := range s.lsts {
		l.DrainTunnels(ctx)
	}
	s.core.StopShadows(ctx)
	s.closeListeners()
	if err := s.core.Stop(ctx); err != nil && first == nil {
		first = err
	}
	s.mu.Lock()
	ups := *s.ups.Load()
	agents := s.agents
	s.agents = nil
	s.mu.Unlock()
	for _, up := range ups {
		up.Stop()
	}
	for _, up := range ups {
		up.CloseIdle()
	}
	for name, a := range agents {
		if err := a.Close(); err != nil {
			s.log.Warn().Str("agent", name).Err(err).Msg("closing agent")
		}
	}
	return first
}

// waitLingering waits for the lingering closes to end: each is bounded
// by its listener's lingering_timeout, and the wait by ctx. The answers
// they protect were written; cut, they could still be lost to a reset.
func (s *Server) waitLingering(ctx context.Context) {
	var tick *time.Ticker
	for _, l := range s.lsts {
		for l.Lingering() > 0 {
			if tick == nil {
				tick = time.NewTicker(5 * time.Millisecond)
				defer tick.Stop()
			}
			select {
			case <-tick.C:
			case <-ctx.Done():
				return
			}
		}
	}
}

// Swap atomically replaces the routes, upstreams and agent policies with
// those of cfg and the agent instances with agents. Requests already
// running finish on the old table; agents of the old set that are not in
// the new one are closed once no request uses them. Under ListenAndServe,
// listeners are added, removed and replaced as listeners.go describes;
// the others, and their connections, are untouched.
func (s *Server) Swap(cfg *config.Config, agents map[string]agentmux.Agent) error {
	if cfg == nil {
		return fmt.Errorf("%w: no configuration", ErrDataplaneConfig)
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	handed, err := s.swap(cfg, agents)
	s.mu.Unlock()
	// A listener whose socket went to its successor accepts on it until
	// its Serve has seen Detach's deadline: a goroutine preempted between
	// the deadline check and accept(2) takes one more connection, and
	// serves it on the old settings. Once Swap returns, only the new
	// listener accepts, as with a socket closed. Outside s.mu: the
	// listener's Serve may not have started (a reload just before), and
	// starting takes s.mu.
	for _, done := range handed {
		<-done
	}
	return err
}

// swap is Swap under s.mu; handed are the ends of the Serves of the
// listeners whose socket it handed over.
func (s *Server) swap(cfg *config.Config, agents map[string]agentmux.Agent) (handed []chan struct{}, err error) {
	if s.closed {
		return nil, ErrDataplaneClosed
	}
	old := s.core.Table()
	oldUps := *s.ups.Load()
	plan, err := s.planListeners(cfg)
	if err != nil {
		return nil, err
	}
	t, ups, err := s.buildTable(cfg, agents, old, oldUps)
	if err != nil {
		plan.abort()
		return nil, err
	}
	for _, up := range ups {
		up.Start(&s.log) // before requests can see t
	}
	s.core.Publish(t)
	s.ups.Store(&ups)
	handed = s.commitListeners(plan)
	for _, l := range s.lsts {
		l.ReloadTLS(cfg)
	}
	upstream.WarnInsecure(cfg, s.log)
	for _, up := range oldUps {
		up.Stop()
	}
	oldAgents := s.agents
	s.agents = agents
	keep := make(map[agentmux.Agent]bool, len(agents))
	for _, a := range agents {
		keep[a] = true
	}
	keepUp := upstream.Kept(ups)
	log := s.log
	old.Retire(t, func() {
		for name, a := range oldAgents {
			if !keep[a] {
				if err := a.Close(); err != nil {
					log.Warn().Str("agent", name).Err(err).Msg("closing replaced agent")
				}
			}
		}
		upstream.CloseReplaced(oldUps, keepUp)
	})
	return handed, nil
}

// Stats returns the server's counters.
func (s *Server) Stats() Stats {
	var st observe.Stats
	s.core.Stats(&st)
	s.h1.Fill(&st)
	s.h2.Fill(&st)
	st.ListenersClamped = s.clamped.Load()
	st.UpstreamStale = s.up.Stale.Load()
	st.UpstreamRetries = s.up.Retries.Load()
	st.UpstreamDiscardedUnsolicited = s.up.Unsolicited.Load()
	st.UpstreamDiscardedClosed = s.up.Closed.Load()
	st.EndpointRetries = s.up.EndpointRetries.Load()
	s.mu.Lock()
	lsts := s.lsts
	s.mu.Unlock()
	st.Connections = make([]ConnStats, len(lsts))
	for i, l := range lsts {
		st.Connections[i] = l.ConnStats()
	}
	return st
}

// Upstreams returns a snapshot of the current upstreams.
func (s *Server) Upstreams() []UpstreamStatus {
	ups := *s.ups.Load()
	out := make([]UpstreamStatus, 0, len(ups))
	for _, up := range ups {
		out = append(out, up.Status())
	}
	return out
}

// Routes returns the route names of the current table, in configuration
// order.
func (s *Server) Routes() []string { return s.core.Routes() }

// Agents returns the agent names of the current table, in configuration
// order.
func (s *Server) Agents() []string { return s.core.Agents() }

// AgentStatus returns a snapshot of every current agent.
func (s *Server) AgentStatus() []agentmux.AgentStatus { return s.core.AgentStatus() }

// PolicyStatus returns the current state of the policy features.
func (s *Server) PolicyStatus() PolicyStatus { return s.core.PolicyStatus() }

// Breakers returns the circuit of every current agent that has one.
func (s *Server) Breakers() []BreakerStatus { return s.core.Breakers() }

// Shadows returns the counters of every current shadow agent.
func (s *Server) Shadows() []ShadowStatus { return s.core.Shadows() }

// Caches returns the counters of every current agent's decision cache.
func (s *Server) Caches() []CacheStatus { return s.core.Caches() }

// Failovers returns the failover counters of every current agent that
// has retried or has several members.
func (s *Server) Failovers() []FailoverStatus { return s.core.Failovers() }

// Bodies returns the over-limit counters of every current agent with a
// prefix or stream action on some route.
func (s *Server) Bodies() []BodyStatus { return s.core.Bodies() }

// TracingStats returns the span export counters (zero without export).
func (s *Server) TracingStats() TracingStats { return s.core.TracingStats() }
