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
	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/dataplane/internal/upstream"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/unixsock"
)

// Errors of the dataplane.
var (
	// ErrDataplaneConfig: the configuration cannot be served (a missing
	// agent instance, too many agents on a route).
	ErrDataplaneConfig = errors.New("dataplane: invalid configuration")
	// ErrDataplaneClosed: the server was shut down.
	ErrDataplaneClosed = errors.New("dataplane: server closed")
)

// Config configures a Server.
type Config struct {
	// File is the validated configuration: listeners, upstreams, routes
	// and the agents' policies.
	File *config.Config
	// Observer receives per-request events for metrics (default: none).
	Observer Observer
}

// Server is the reverse proxy. Create it with New; it serves the
// listeners of its configuration (ListenAndServe) or any net.Listener
// (Serve), and swaps routes and agents atomically (Swap).
type Server struct {
	log   zerolog.Logger
	spans *spanExporter // trace span export (otlp.go); nil when off
	obs   Observer
	rec   RequestRecorder // obs, when it also wants request summaries
	tbl   atomic.Pointer[table]
	stats counters
	watch *watcher

	lsts []*listener

	mu     sync.Mutex
	agents map[string]agentmux.Agent
	closed bool
	serves sync.WaitGroup
	// addrs are the bound listener addresses; listening is set once they
	// accept and cleared when Shutdown starts (readiness).
	addrs     []net.Addr
	listening atomic.Bool
}

type listener struct {
	cfg   config.Listener
	srv   *fasthttp.Server
	tls   *listenerTLS // nil: plain HTTP
	tun   tunnelSet    // open Upgrade tunnels (upgrade.go)
	conns *connSet     // client connections (conn.go)
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
	s := &Server{log: log, obs: cfg.Observer, agents: agents}
	if s.obs == nil {
		s.obs = NopObserver{}
	}
	s.rec, _ = s.obs.(RequestRecorder)
	t, err := buildTable(cfg.File, agents, nil)
	if err != nil {
		return nil, err
	}
	s.obs.Reset(t.routeIDs.names, t.agentIDs.names)
	s.tbl.Store(t)
	upstream.WarnInsecure(cfg.File, log)
	interval := time.Duration(0)
	nofile := fdLimit()
	budget := connectionBudget(cfg.File, nofile)
	for _, lc := range cfg.File.Listeners {
		l := &listener{cfg: lc}
		if lc.TLS != nil {
			lt, err := newListenerTLS(lc.Name, *lc.TLS, log, &s.stats.tls)
			if err != nil {
				s.closeTLS()
				return nil, fmt.Errorf("dataplane: listener %s: %w", lc.Name, err)
			}
			l.tls = lt
		}
		explicit := l.cfg.MaxConnections != 0
		if clampConnections(&l.cfg, budget, nofile, log) {
			s.stats.connClamped.Add(1)
		}
		if clampTunnels(&l.cfg, budget, nofile, explicit, log) {
			s.stats.connClamped.Add(1)
		}
		l.conns = newConnSet(lc.Name, l.cfg.MaxConnections, lc.LingeringTimeout, int64(lc.MaxLingeringBytes))
		l.srv = s.newFastServer(l)
		s.lsts = append(s.lsts, l)
		if interval == 0 || lc.DisconnectCheck < interval {
			interval = lc.DisconnectCheck
		}
	}
	// Goroutines last: nothing is left running when New fails.
	if s.spans, err = newSpanExporter(cfg.File.Tracing, log); err != nil {
		s.closeTLS()
		return nil, err
	}
	if interval > 0 {
		s.watch = newWatcher(interval, func(rs *reqState) { rs.cancel() })
	}
	t.startUpstreams(&s.log)
	return s, nil
}

func (s *Server) newFastServer(l *listener) *fasthttp.Server {
	return &fasthttp.Server{
		Handler:                      func(ctx *fasthttp.RequestCtx) { s.handle(ctx, l) },
		ErrorHandler:                 s.parseError,
		Logger:                       fastLogger{log: s.log},
		Concurrency:                  fastConcurrency(l.cfg.MaxConnections),
		ReadBufferSize:               int(l.cfg.ReadBufferSize),
		WriteBufferSize:              int(l.cfg.WriteBufferSize),
		ReadTimeout:                  l.cfg.ReadTimeout,
		IdleTimeout:                  l.cfg.IdleTimeout,
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		NoDefaultServerHeader:        true,
		NoDefaultContentType:         true,
		CloseOnShutdown:              true,
		SecureErrorLogMessage:        true,
	}
}

// fastConcurrency is fasthttp's worker limit for a listener of maxConns
// connections. The listener enforces max_connections itself (conn.go);
// fasthttp's limit, which answers 503 past it, only has to stay out of
// its way. A worker outlives its connection's place by the moment
// between Close and its return to the pool, so the limit is well above
// maxConns (a limit costs fasthttp nothing until workers are used).
func fastConcurrency(maxConns int) int {
	return max(fasthttp.DefaultConcurrency, 2*maxConns)
}

// Serve serves HTTP on ln with the settings of the first configured
// listener. It returns when ln fails or the server shuts down.
func (s *Server) Serve(ln net.Listener) error {
	s.markListening(ln)
	return s.serve(s.lsts[0], ln)
}

// markListening records bound listeners: the kernel queues connections
// from here on, so the server counts as listening.
func (s *Server) markListening(lns ...net.Listener) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	for _, ln := range lns {
		s.addrs = append(s.addrs, ln.Addr())
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
	return append([]net.Addr(nil), s.addrs...)
}

func (s *Server) serve(l *listener, ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = ln.Close()
		return ErrDataplaneClosed
	}
	s.serves.Add(1)
	s.mu.Unlock()
	defer s.serves.Done()
	return l.srv.Serve(&eofListener{Listener: ln, hdrBuf: int(l.cfg.ReadBufferSize), tls: l.tls, conns: l.conns, log: s.log, stats: &s.stats})
}

// ListenAndServe listens on every configured listener and serves until
// Shutdown (nil) or a listener fails (its error).
func (s *Server) ListenAndServe() error {
	lns := make([]net.Listener, 0, len(s.lsts))
	for _, l := range s.lsts {
		ln, err := listen(l.cfg.Address)
		if err != nil {
			for _, o := range lns {
				_ = o.Close()
			}
			return fmt.Errorf("dataplane: listener %s: %w", l.cfg.Name, err)
		}
		lns = append(lns, ln)
	}
	s.markListening(lns...)
	errs := make(chan error, len(lns))
	for i, l := range s.lsts {
		go func() { errs <- s.serve(l, lns[i]) }()
	}
	var first error
	for range lns {
		if err := <-errs; err != nil && first == nil {
			first = err
			for _, o := range lns {
				_ = o.Close()
			}
		}
	}
	return first
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
	s.mu.Unlock()
	var first error
	for _, l := range s.lsts {
		if err := l.srv.ShutdownWithContext(ctx); err != nil && first == nil {
			first = err
		}
	}
	done := make(chan struct{})
	go func() { s.serves.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		if first == nil {
			first = ctx.Err()
		}
	}
	s.waitLingering(ctx)
	s.drainTunnels(ctx)
	s.stopShadows(ctx)
	s.closeTLS()
	if s.watch != nil {
		s.watch.close()
	}
	if s.spans != nil {
		if err := s.spans.shutdown(ctx); err != nil && first == nil {
			first = err
		}
	}
	t := s.tbl.Load()
	t.stopUpstreams()
	for _, up := range t.upstreams {
		up.CloseIdle()
	}
	s.mu.Lock()
	agents := s.agents
	s.agents = nil
	s.mu.Unlock()
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
		for l.conns.lingering.Load() > 0 {
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

// stopShadows stops the shadow agents' workers and waits for them to
// leave (or ctx to end).
func (s *Server) stopShadows(ctx context.Context) {
	t := s.tbl.Load()
	for _, e := range t.agents {
		if e.shadow != nil {
			e.shadow.stop()
		}
	}
	for _, e := range t.agents {
		if e.shadow != nil {
			e.shadow.waitStopped(ctx)
		}
	}
}

// Swap atomically replaces the routes, upstreams and agent policies with
// those of cfg and the agent instances with agents. Requests already
// running finish on the old table; agents of the old set that are not in
// the new one are closed once no request uses them. Listener settings are
// not changed by a swap.
func (s *Server) Swap(cfg *config.Config, agents map[string]agentmux.Agent) error {
	if cfg == nil {
		return fmt.Errorf("%w: no configuration", ErrDataplaneConfig)
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrDataplaneClosed
	}
	old := s.tbl.Load()
	t, err := buildTable(cfg, agents, old)
	if err != nil {
		return err
	}
	s.obs.Reset(t.routeIDs.names, t.agentIDs.names)
	t.startUpstreams(&s.log) // before requests can see t
	s.tbl.Store(t)
	s.reloadTLS(cfg)
	upstream.WarnInsecure(cfg, s.log)
	old.stopUpstreams()
	oldAgents := s.agents
	s.agents = agents
	keep := make(map[agentmux.Agent]bool, len(agents))
	for _, a := range agents {
		keep[a] = true
	}
	keepUp := upstream.Kept(t.upstreams)
	log := s.log
	keepShadow := make(map[*shadowRunner]bool)
	for _, e := range t.agents {
		if e.shadow != nil {
			keepShadow[e.shadow] = true
		}
	}
	old.retire(func() {
		// Shadow runners the new table does not carry over stop.
		for _, e := range old.agents {
			if e.shadow != nil && !keepShadow[e.shadow] {
				e.shadow.stop()
			}
		}
		for name, a := range oldAgents {
			if !keep[a] {
				if err := a.Close(); err != nil {
					log.Warn().Str("agent", name).Err(err).Msg("closing replaced agent")
				}
			}
		}
		upstream.CloseReplaced(old.upstreams, keepUp)
	})
	return nil
}

// Stats returns the server's counters.
func (s *Server) Stats() Stats {
	st := s.stats.snapshot()
	st.Connections = make([]ConnStats, len(s.lsts))
	for i, l := range s.lsts {
		st.Connections[i] = l.conns.snapshot()
	}
	return st
}

// Upstreams returns a snapshot of the current upstreams.
func (s *Server) Upstreams() []UpstreamStatus {
	t := s.tbl.Load()
	out := make([]UpstreamStatus, 0, len(t.upstreams))
	for _, up := range t.upstreams {
		out = append(out, up.Status())
	}
	return out
}

// Routes returns the route names of the current table, in configuration
// order.
func (s *Server) Routes() []string { return s.tbl.Load().routeNames() }

// Agents returns the agent names of the current table, in configuration
// order.
func (s *Server) Agents() []string { return s.tbl.Load().agentNames() }

// AgentStatus returns a snapshot of every current agent.
func (s *Server) AgentStatus() []agentmux.AgentStatus {
	t := s.tbl.Load()
	out := make([]agentmux.AgentStatus, 0, len(t.agents))
	for _, a := range t.agents {
		out = append(out, a.agent.Snapshot())
	}
	return out
}

// acquireTable pins the current table for one request; the re-check
// makes sure a concurrent Swap cannot retire it unnoticed.
func (s *Server) acquireTable() *table {
	for {
		t := s.tbl.Load()
		t.acquire()
		if s.tbl.Load() == t {
			return t
		}
		t.release()
	}
}

func (s *Server) handle(ctx *fasthttp.RequestCtx, l *listener) {
	t := s.acquireTable()
	s.stats.requests.Add(1)
	s.stats.inflight.Add(1)
	rs := acquireReqState(s, t, ctx, l)
	if s.watch != nil {
		s.watch.add(rs)
	}
	defer s.recoverPanic(rs)
	streaming := rs.serve()
	if rs.closeConn || (rs.hasReqBody && !rs.reqBodyEOF) {
		// Asked for, a refused head, or unread body bytes that would be
		// parsed as the next request: closed lingeringly, the client may
		// still be sending.
		ctx.SetConnectionClose()
		if ec, ok := rs.conn.(*eofConn); ok {
			ec.markLinger()
		}
	}
	if !streaming {
		rs.finish()
	}
}

// recoverPanic keeps one broken request from taking the process down.
// The request's state is abandoned, not pooled.
func (s *Server) recoverPanic(rs *reqState) {
	r := recover()
	if r == nil {
		return
	}
	s.log.Error().Uint64("req", rs.id).Bytes("corr", rs.corr).Interface("panic", r).Msg("request handler panicked")
	if s.watch != nil {
		s.watch.remove(rs)
	}
	rs.abandon()
	rs.ctx.Response.Reset()
	rs.ctx.SetStatusCode(fasthttp.StatusInternalServerError)
	rs.ctx.SetBodyString("internal error")
	rs.ctx.SetConnectionClose()
	if ec, ok := rs.ctx.Conn().(*eofConn); ok {
		ec.markLinger()
	}
	s.stats.inflight.Add(-1)
	rs.tbl.release()
}

// parseError answers a request fasthttp could not parse, generically.
//
// A connection on which no byte of a request arrived is closed without
// an answer, as nginx and net/http do: at read_timeout that is an idle
// connection, and a client that picked it for its next request at that
// moment would read a 408 for a request it never sent. (fasthttp itself
// closes a kept-alive connection silently at idle_timeout.)
func (s *Server) parseError(ctx *fasthttp.RequestCtx, err error) {
	ec, _ := ctx.Conn().(*eofConn)
	if ec != nil && ec.handshakeFailed() {
		// No request was ever read: counted as a handshake error (tls.go).
		ctx.SetConnectionClose()
		return
	}
	if ec != nil && !ec.got {
		if isTimeout(err) && ec.conns != nil {
			ec.conns.idleClosed.Add(1)
		}
		// Closed now, the answer fasthttp writes next goes nowhere.
		_ = ec.Close()
		ctx.SetConnectionClose()
		return
	}
	status, body, reason := fasthttp.StatusBadRequest, "bad request", rejectParse
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.As(err, &small):
		status, body, reason = fasthttp.StatusRequestHeaderFieldsTooLarge, "request header fields too large", rejectHeaderTooLarge
		if ec, ok := ctx.Conn().(*eofConn); ok && ec.requestLineTooLong() {
			status, body, reason = fasthttp.StatusRequestURITooLong, "request URI too long", rejectURITooLong
		}
	case isTimeout(err):
		status, body, reason = fasthttp.StatusRequestTimeout, "request timeout", rejectHeadTimeout
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		status, body = fasthttp.StatusRequestEntityTooLarge, "request entity too large"
	}
	if reason != rejectHeadTimeout && ec != nil {
		// The rest of the request may still be arriving. (A head that
		// timed out stalled: nothing is on its way.)
		ec.markLinger()
	}
	s.stats.rejected[reason].Add(1)
	s.log.Debug().Err(err).Int("status", status).Msg("unparsable request")
	ctx.Response.Reset()
	ctx.SetStatusCode(status)
	ctx.SetContentType("text/plain; charset=utf-8")
	ctx.SetBodyString(body)
	ctx.SetConnectionClose()
}

// fastLogger routes fasthttp's own messages (mostly connection errors of
// clients that went away) to debug.
type fastLogger struct{ log zerolog.Logger }

func (f fastLogger) Printf(format string, args ...any) {
	if e := f.log.Debug(); e != nil {
		e.Msgf(format, args...)
	}
}

// logFields adds the request's identity to a log event.
func (rs *reqState) logFields(e *zerolog.Event) *zerolog.Event {
	if e == nil {
		return nil
	}
	e = e.Uint64("req", rs.id).Bytes("corr", rs.corr)
	if rs.rt != nil {
		e = e.Str("route", rs.rt.name)
	}
	if rs.ctx != nil {
		e = e.Bytes("method", rs.ctx.Method()).Bytes("path", clip(rs.ctx.Path(), 256))
	}
	return e
}

func clip(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

type stampCache struct {
	sec int64
	b   []byte
}

var stamp atomic.Pointer[stampCache]

// timestamp is t in RFC 3339 (UTC, seconds), formatted once per second.
func timestamp(t time.Time) []byte {
	sec := t.Unix()
	if c := stamp.Load(); c != nil && c.sec == sec {
		return c.b
	}
	c := &stampCache{sec: sec, b: t.UTC().AppendFormat(nil, time.RFC3339)}
	stamp.Store(c)
	return c.b
}
