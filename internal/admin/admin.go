// Package admin is the sidecar's operator listener, on its own address
// (loopback by default) so that it is never reachable through the data
// listeners:
//
//	GET  /metrics   Prometheus metrics (OpenMetrics when asked for)
//	GET  /healthz   200 while the process runs
//	GET  /readyz    200 when the sidecar can serve (listeners up, every
//	                fail-closed agent connected), else 503 with the reason
//	GET  /status    JSON: version, uptime, routes, agents, reloads, counters
//	POST /reload    re-read the configuration; 200, or 400 with the
//	                validation error while the old configuration keeps serving
//
// Every endpoint first checks the request's Host (see Config.AllowedHosts):
// a page that DNS rebinding lets a browser load from an attacker's name
// must not read /status or /metrics through the browser.
//
// It is plain net/http: nothing here is on the request path.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	stdlog "log"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/dataplane"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/metrics"
	"github.com/zentinelproxy/sidecar/internal/version"
)

// DefaultAddress is the admin listener's default address: loopback only.
const DefaultAddress = "127.0.0.1:9901"

// Errors of the admin listener.
var (
	// ErrAdminConfig: the configuration is invalid.
	ErrAdminConfig = errors.New("admin: invalid config")
	// ErrAdminStarted: Start was called twice.
	ErrAdminStarted = errors.New("admin: already started")
	// ErrAdminNoReload: no reload function is configured.
	ErrAdminNoReload = errors.New("admin: reload not available")
)

// Config configures the admin listener. Every source is optional; a
// missing one leaves its part of the pages empty.
type Config struct {
	// Address is host:port (default DefaultAddress).
	Address string
	// Version is shown on /status.
	Version string
	// Build adds the commit and its date to /status (their zero values
	// leave them out).
	Build version.Info
	// Gatherer serves /metrics (nil: 404).
	Gatherer prometheus.Gatherer
	// Ready decides /readyz: ok, or false and a short reason (nil: ready
	// while the admin listener serves).
	Ready func() (ok bool, reason string)
	// Routes and Agents describe the serving configuration on /status.
	Routes func() []string
	Agents func() []agentmux.AgentStatus
	// Stats are the dataplane's counters on /status.
	Stats func() dataplane.Stats
	// Policy is the state of the policy features (circuit breakers,
	// shadow agents, decision caches, failover, over-limit bodies) on
	// /status.
	Policy func() dataplane.PolicyStatus
	// Reload re-reads and applies the configuration. An error wrapping
	// config.ErrConfigSyntax, config.ErrConfigInvalid or
	// config.ErrConfigUnreadable is the operator's
	// (400); any other is the sidecar's (500). Nil: /reload answers 404.
	Reload func() error
	// Log receives reload outcomes and listener errors.
	Log zerolog.Logger
	// AllowedHosts are host names, besides IP literals (v4, or v6 in
	// brackets) and "localhost", that a request's Host may name, with any
	// port or none. Names only: no port, IP literal or wildcard; compared
	// case-insensitively, a trailing dot ignored. Any other Host, or none,
	// is answered 421 Misdirected Request and counted.
	AllowedHosts []string
}

// DefaultConfig returns a Config listening on DefaultAddress.
func DefaultConfig() Config { return Config{Address: DefaultAddress} }

// Validate fills defaults and checks the address and the allowed hosts,
// which it puts in the form requests are compared in.
func (c *Config) Validate() error {
	if c.Address == "" {
		c.Address = DefaultAddress
	}
	if _, _, err := net.SplitHostPort(c.Address); err != nil {
		return fmt.Errorf("%w: address %q: %v", ErrAdminConfig, c.Address, err)
	}
	hosts := make([]string, 0, len(c.AllowedHosts))
	for _, h := range c.AllowedHosts {
		if !config.ValidAdminHost(h) {
			return fmt.Errorf("%w: allowed host %q is not a host name (no port, IP address or wildcard)", ErrAdminConfig, h)
		}
		hosts = append(hosts, canonicalHost(h))
	}
	c.AllowedHosts = hosts
	return nil
}

// Status is the /status document.
type Status struct {
	Version       string                  `json:"version"`
	Commit        string                  `json:"commit,omitempty"`
	CommitDate    string                  `json:"commit_date,omitempty"`
	Started       time.Time               `json:"started"`
	UptimeSeconds float64                 `json:"uptime_seconds"`
	Ready         bool                    `json:"ready"`
	NotReady      string                  `json:"not_ready_reason,omitempty"`
	Routes        []string                `json:"routes"`
	Agents        []agentmux.AgentStatus  `json:"agents"`
	Reload        ReloadStatus            `json:"reload"`
	Requests      *dataplane.Stats        `json:"requests,omitempty"`
	Policy        *dataplane.PolicyStatus `json:"policy,omitempty"`
	Admin         AdminStatus             `json:"admin"`
}

// AdminStatus counts the requests the admin listener refused.
type AdminStatus struct {
	// RefusedHost: requests whose Host is not accepted (answered 421).
	RefusedHost uint64 `json:"refused_host"`
}

// ReloadStatus counts configuration reloads.
type ReloadStatus struct {
	Count       uint64    `json:"count"`
	Failures    uint64    `json:"failures"`
	LastError   string    `json:"last_error,omitempty"`
	LastAttempt time.Time `json:"last_attempt,omitzero"`
	LastSuccess time.Time `json:"last_success,omitzero"`
}

// Server is the admin listener.
type Server struct {
	cfg      Config
	started  time.Time
	draining atomic.Bool
	serving  atomic.Bool
	srv      *http.Server
	ln       net.Listener
	done     chan struct{}

	reloadMu sync.Mutex // one reload at a time
	stMu     sync.Mutex
	reload   ReloadStatus

	// reg holds the admin listener's own metrics, served on /metrics
	// with the Gatherer's.
	reg         *prometheus.Registry
	refused     *prometheus.CounterVec
	refusedHost atomic.Uint64
	refuseLog   logLimit
}

// New returns a Server for cfg; Start binds and serves it.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, started: time.Now(), done: make(chan struct{}), reg: prometheus.NewRegistry()}
	s.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metrics.Namespace, Name: "admin_refused_total",
		Help: "Requests the admin listener refused, by reason (host: a Host it does not answer to).",
	}, []string{"reason"})
	s.refused.WithLabelValues(refusedHost)
	s.reg.MustRegister(s.refused)
	s.srv = &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          stdlog.New(&limitedLog{log: cfg.Log.With().Str("component", "admin").Logger()}, "", 0),
	}
	return s, nil
}

// Handler returns the admin endpoints behind the Host check (for tests or
// another listener).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	if s.cfg.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(prometheus.Gatherers{s.cfg.Gatherer, s.reg}, promhttp.HandlerOpts{
			ErrorHandling:       promhttp.ContinueOnError,
			MaxRequestsInFlight: 4,
			// OpenMetrics 1.0.0 or 0.0.1 to a scraper that asks for it in
			// Accept (Prometheus does by default); the text format 0.0.4
			// to any other, "*/*" and no Accept included. No _created
			// series: they would double the counters' series.
			EnableOpenMetrics: true,
		}))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.HandleFunc("GET /status", s.status)
	mux.HandleFunc("POST /reload", s.reloadHandler)
	return s.checkHost(mux)
}

// Start binds the address and serves in the background.
func (s *Server) Start() error {
	if !s.serving.CompareAndSwap(false, true) {
		return ErrAdminStarted
	}
	ln, err := net.Listen("tcp", s.cfg.Address)
	if err != nil {
		return fmt.Errorf("admin: listen %s: %w", s.cfg.Address, err)
	}
	s.ln = ln
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.cfg.Log.Error().Err(err).Str("address", s.cfg.Address).Msg("admin listener failed")
		}
	}()
	return nil
}

// Addr is the bound address (nil before Start).
func (s *Server) Addr() net.Addr {
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// SetDraining makes /readyz answer 503 from now on: the sidecar is
// shutting down and load balancers should stop sending traffic.
func (s *Server) SetDraining() { s.draining.Store(true) }

// Shutdown stops the listener, letting running admin requests finish
// within ctx.
func (s *Server) Shutdown(ctx context.Context) error {
	if s.ln == nil {
		return nil
	}
	err := s.srv.Shutdown(ctx)
	<-s.done
	return err
}

// Ready evaluates readiness as /readyz does.
func (s *Server) Ready() (bool, string) {
	if s.draining.Load() {
		return false, "shutting down"
	}
	if s.cfg.Ready == nil {
		return true, ""
	}
	return s.cfg.Ready()
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	ok, reason := s.Ready()
	if !ok {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "reason": reason})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ready": true})
}

// Status builds the /status document.
func (s *Server) Status() Status {
	st := Status{
		Version:       s.cfg.Version,
		Commit:        s.cfg.Build.Commit,
		CommitDate:    s.cfg.Build.Date,
		Started:       s.started.UTC().Truncate(time.Second),
		UptimeSeconds: time.Since(s.started).Truncate(time.Millisecond).Seconds(),
		Routes:        []string{},
		Agents:        []agentmux.AgentStatus{},
	}
	st.Ready, st.NotReady = s.Ready()
	if s.cfg.Routes != nil {
		st.Routes = s.cfg.Routes()
	}
	if s.cfg.Agents != nil {
		st.Agents = s.cfg.Agents()
	}
	if s.cfg.Stats != nil {
		x := s.cfg.Stats()
		st.Requests = &x
	}
	if s.cfg.Policy != nil {
		x := s.cfg.Policy()
		st.Policy = &x
	}
	s.stMu.Lock()
	st.Reload = s.reload
	s.stMu.Unlock()
	st.Admin.RefusedHost = s.refusedHost.Load()
	return st
}

func (s *Server) status(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.Status())
}

// Reload runs the configured reload function, one at a time, and records
// its outcome for /status. SIGHUP and POST /reload both come here.
func (s *Server) Reload() error {
	if s.cfg.Reload == nil {
		return ErrAdminNoReload
	}
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	err := s.cfg.Reload()
	now := time.Now().UTC()
	s.stMu.Lock()
	s.reload.Count++
	s.reload.LastAttempt = now
	if err != nil {
		s.reload.Failures++
		s.reload.LastError = err.Error()
	} else {
		s.reload.LastError = ""
		s.reload.LastSuccess = now
	}
	s.stMu.Unlock()
	if err != nil {
		s.cfg.Log.Error().Err(err).Msg("configuration reload failed; the previous configuration keeps serving")
	} else {
		s.cfg.Log.Info().Msg("configuration reloaded")
	}
	return err
}

// ReloadStatus returns the reload counters.
func (s *Server) ReloadStatus() ReloadStatus {
	s.stMu.Lock()
	defer s.stMu.Unlock()
	return s.reload
}

func (s *Server) reloadHandler(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Origin") != "" {
		// A browser's cross-site form post; operators' tools send none.
		writeJSON(w, http.StatusForbidden, map[string]string{"error": "cross-origin requests are not accepted"})
		return
	}
	if s.cfg.Reload == nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "reload is not available"})
		return
	}
	err := s.Reload()
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, map[string]any{"reloaded": true, "reloads": s.ReloadStatus().Count})
	case errors.Is(err, config.ErrConfigSyntax) || errors.Is(err, config.ErrConfigInvalid) || errors.Is(err, config.ErrConfigUnreadable):
		writeJSON(w, http.StatusBadRequest, map[string]any{"reloaded": false, "error": err.Error()})
	default:
		writeJSON(w, http.StatusInternalServerError, map[string]any{"reloaded": false, "error": err.Error()})
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		code = http.StatusInternalServerError
		b = []byte(`{"error":"encoding failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

// limitedLog is net/http's error log for the admin listener: at most one
// line per refuseLogEvery, the next one carrying how many were dropped.
// Out of file descriptors, net/http logs every accept retry ("Accept
// error: … retrying in 1s"), a line a second for as long as it lasts, and
// a client that opens and drops TLS or malformed connections can make it
// log one line per connection.
type limitedLog struct {
	log   zerolog.Logger
	limit logLimit
}

func (l *limitedLog) Write(p []byte) (int, error) {
	ok, suppressed := l.limit.allow(time.Now())
	if !ok {
		return len(p), nil
	}
	e := l.log.Warn()
	if suppressed > 0 {
		e = e.Int("suppressed", suppressed)
	}
	e.Msg(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
