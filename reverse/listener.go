package reverse

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/handshake"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/internal/udswriter"
	"github.com/zentinelproxy/sidecar/internal/unixsock"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

// Listener errors. Wrapped with details; test with errors.Is.
var (
	// ErrReverseClosed: the listener is closed.
	ErrReverseClosed = errors.New("reverse: listener closed")
	// ErrReverseServing: Serve was called twice.
	ErrReverseServing = errors.New("reverse: already serving")
)

// Refusal reasons sent to agents. They are the prefixes of the "error"
// field of a refused RegistrationResponse.
const (
	ReasonVersion = "unsupported protocol version"
	ReasonInvalid = "invalid registration"
	// ReasonUnknown is never sent: an unknown agent_id is answered
	// ReasonAuth. It labels the cause in logs and Stats.RejectedUnknown.
	ReasonUnknown    = "unknown agent"
	ReasonAuth       = "authentication failed"
	ReasonIDLimit    = "too many connections for agent id"
	ReasonAgentLimit = "too many connections for agent"
	ReasonShutdown   = "proxy shutting down"
	ReasonFrame      = "expected RegistrationRequest"
)

// Transport is the transport name the pools report in their status.
const Transport = "reverse"

// lingerTime bounds how long a refused connection is drained after the
// answer, so that the peer reads the reason instead of a reset.
const lingerTime = 500 * time.Millisecond

// Stats are the listener's registration counters.
type Stats struct {
	// Accepted registrations.
	Accepted uint64 `json:"accepted"`
	// Refused registrations by reason. RejectedUnknown (agent_ids no agent
	// admits) and RejectedAuth (wrong or missing tokens) are answered alike.
	RejectedVersion    uint64 `json:"rejected_version"`
	RejectedInvalid    uint64 `json:"rejected_invalid"`
	RejectedUnknown    uint64 `json:"rejected_unknown_agent"`
	RejectedAuth       uint64 `json:"rejected_auth"`
	RejectedIDLimit    uint64 `json:"rejected_id_limit"`
	RejectedAgentLimit uint64 `json:"rejected_agent_limit"`
	RejectedShutdown   uint64 `json:"rejected_shutdown"`
	// Timeouts: no complete registration within the timeout.
	Timeouts uint64 `json:"timeouts"`
	// BadFrames: a first frame that is empty, oversized or of another type.
	BadFrames uint64 `json:"bad_frames"`
	// TLSErrors: failed TLS handshakes.
	TLSErrors uint64 `json:"tls_errors"`
	// Aborted: the peer closed before registering.
	Aborted uint64 `json:"aborted"`
	// Evicted: connections closed before they registered to make room
	// for a newer one, when MaxPending (or MaxPendingPerPeer from the same
	// peer) were registering; silent ones first (see admission).
	Evicted uint64 `json:"evicted"`
	// Busy: new connections closed at once because every connection
	// registering in their scope was being judged, none could give way.
	Busy uint64 `json:"busy"`
	// Delayed: refusals held back because of earlier authentication
	// failures of the same (peer, agent_id). Accepted registrations are
	// never held back.
	Delayed uint64 `json:"delayed"`
	// Unheld: refusals closed at once because MaxRefusing refused
	// connections were already held open: one that was to be held back is
	// closed without its answer, one answered at once is not drained.
	Unheld uint64 `json:"unheld"`
	// Pending, Refusing and Active are the connections registering,
	// refused (their answer held back or being drained) and registered now.
	Pending  int64 `json:"pending"`
	Refusing int64 `json:"refusing"`
	Active   int64 `json:"active"`
}

// Rejected is the total of refused registrations.
func (s Stats) Rejected() uint64 {
	return s.RejectedVersion + s.RejectedInvalid + s.RejectedUnknown + s.RejectedAuth +
		s.RejectedIDLimit + s.RejectedAgentLimit + s.RejectedShutdown
}

type counters struct {
	accepted, version, invalid, unknown, auth, idLimit, agentLimit, shutdown atomic.Uint64
	timeouts, badFrames, tlsErrors, aborted, evicted, busy, delayed, unheld  atomic.Uint64
	pending, refusing, active                                                atomic.Int64
}

// agent is one configured agent name and its pool.
type agent struct {
	cfg    AgentConfig
	tokens tokenSet
	handle *pool
	conns  int  // live connections, guarded by Listener.mu
	closed bool // guarded by Listener.mu
}

// pool is the pool of one configured agent name, handed out by
// Listener.Agent; it implements agentmux.Agent. Closing it drains its
// connections and refuses further registrations for it.
type pool struct {
	*agentmux.Pool
	l *Listener
	a *agent
}

var _ agentmux.Reporter = (*pool)(nil)

// Snapshot implements agentmux.Reporter: the pool's connections and
// counters, and its listener, which every agent on the listener reports
// alike.
func (h *pool) Snapshot() agentmux.AgentStatus {
	st := h.Pool.Snapshot()
	ls := h.l.status()
	st.Listener = &ls
	return st
}

// Close implements agentmux.Agent: new registrations for this agent are
// refused, then CancelAll goes to every connection and they are closed.
func (h *pool) Close() error {
	h.l.mu.Lock()
	h.a.closed = true
	h.l.mu.Unlock()
	return h.Pool.Close()
}

// Listener accepts reverse agent connections on a Unix socket and/or a TCP
// address and registers them into per-agent pools.
type Listener struct {
	cfg    Config
	log    zerolog.Logger
	agents []*agent
	byName map[string]*agent
	fails  *failures
	lns    []net.Listener
	tlsLn  net.Listener // the TCP listener, TLS-wrapped or not
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	// pending holds the connections registering (see admission).
	pending *admission
	perID   map[string]int
	wg      sync.WaitGroup
	serving atomic.Bool
	logs    logGate

	c counters
}

// NewListener validates cfg, reads the agents' tokens, and binds the
// configured sockets. Agents can connect once Serve runs.
func NewListener(cfg Config, log zerolog.Logger) (*Listener, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Listener{
		cfg:     cfg,
		log:     log,
		byName:  make(map[string]*agent, len(cfg.Agents)),
		fails:   newFailures(cfg.FailureDelay, cfg.MaxFailureDelay, cfg.FailureMemory, cfg.MaxTrackedPeers),
		ctx:     ctx,
		cancel:  cancel,
		pending: newAdmission(cfg.MaxPending, cfg.MaxPendingPerPeer),
		perID:   make(map[string]int),
	}
	for i := range cfg.Agents {
		ac := cfg.Agents[i]
		ac.IDs = append([]string(nil), ac.IDs...)
		ts, err := loadTokens(&ac)
		if err != nil {
			cancel()
			return nil, err
		}
		a := &agent{cfg: ac, tokens: ts}
		a.handle = &pool{Pool: agentmux.NewPool(ac.Name, Transport), l: l, a: a}
		l.agents = append(l.agents, a)
		l.byName[ac.Name] = a
	}
	if err := l.listen(); err != nil {
		cancel()
		for _, ln := range l.lns {
			_ = ln.Close()
		}
		return nil, err
	}
	return l, nil
}

func (l *Listener) listen() error {
	if l.cfg.UnixPath != "" {
		ln, err := unixsock.Listen(l.cfg.UnixPath, l.cfg.UnixMode)
		if err != nil {
			return fmt.Errorf("reverse: listen on %s: %w", l.cfg.UnixPath, err)
		}
		l.lns = append(l.lns, ln)
	}
	if l.cfg.TCPAddr != "" {
		ln, err := net.Listen("tcp", l.cfg.TCPAddr)
		if err != nil {
			return fmt.Errorf("reverse: listen on %s: %w", l.cfg.TCPAddr, err)
		}
		l.lns = append(l.lns, ln)
		l.tlsLn = ln
		if l.cfg.TLS != nil {
			tc, err := loadTLS(l.cfg.TLS)
			if err != nil {
				return err
			}
			l.tlsLn = tls.NewListener(ln, tc)
			l.lns[len(l.lns)-1] = l.tlsLn
		}
	}
	return nil
}

// loadTLS builds the server TLS config; a client CA file turns on mTLS.
func loadTLS(c *TLSConfig) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("%w: tls: %v", ErrReverseConfig, err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if c.ClientCAFile != "" {
		pem, err := os.ReadFile(c.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("%w: tls client ca: %v", ErrReverseConfig, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: tls client ca %s: no PEM certificate", ErrReverseConfig, c.ClientCAFile)
		}
		tc.ClientCAs = pool
		tc.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

// TCPAddr is the bound TCP address (nil without one); useful with port 0.
func (l *Listener) TCPAddr() net.Addr {
	if l.tlsLn == nil {
		return nil
	}
	return l.tlsLn.Addr()
}

// UnixPath is the Unix socket path agents dial ("" without one).
func (l *Listener) UnixPath() string { return l.cfg.UnixPath }

// Agent returns the pool of the configured agent name, or nil when no
// agent of that name is configured. The pool exists (empty) before any
// agent registers.
func (l *Listener) Agent(name string) agentmux.Agent {
	if a := l.byName[name]; a != nil {
		return a.handle
	}
	return nil
}

// Agents returns the configured agent names in configuration order.
func (l *Listener) Agents() []string {
	names := make([]string, len(l.agents))
	for i, a := range l.agents {
		names[i] = a.cfg.Name
	}
	return names
}

// Stats returns a snapshot of the registration counters.
func (l *Listener) Stats() Stats {
	c := &l.c
	return Stats{
		Accepted:           c.accepted.Load(),
		RejectedVersion:    c.version.Load(),
		RejectedInvalid:    c.invalid.Load(),
		RejectedUnknown:    c.unknown.Load(),
		RejectedAuth:       c.auth.Load(),
		RejectedIDLimit:    c.idLimit.Load(),
		RejectedAgentLimit: c.agentLimit.Load(),
		RejectedShutdown:   c.shutdown.Load(),
		Timeouts:           c.timeouts.Load(),
		BadFrames:          c.badFrames.Load(),
		TLSErrors:          c.tlsErrors.Load(),
		Aborted:            c.aborted.Load(),
		Evicted:            c.evicted.Load(),
		Busy:               c.busy.Load(),
		Delayed:            c.delayed.Load(),
		Unheld:             c.unheld.Load(),
		Pending:            c.pending.Load(),
		Refusing:           c.refusing.Load(),
		Active:             c.active.Load(),
	}
}

// name is the listener's address as its agents configure it:
// "unix:/path", or the bound host:port ("unbound" before it listens).
func (l *Listener) name() string {
	if l.cfg.UnixPath != "" {
		return "unix:" + l.cfg.UnixPath
	}
	if a := l.TCPAddr(); a != nil {
		return a.String()
	}
	return "unbound"
}

// status describes the listener for /status and the metrics: Stats under
// its name, the refusals by their stable label values (version, invalid,
// unknown_agent, auth, id_limit, agent_limit, shutdown, timeout,
// bad_frame, tls_error, evicted, busy).
func (l *Listener) status() agentmux.ListenerStatus {
	st := l.Stats()
	return agentmux.ListenerStatus{
		Address:  l.name(),
		Accepted: st.Accepted,
		Rejected: map[string]uint64{
			"version":       st.RejectedVersion,
			"invalid":       st.RejectedInvalid,
			"unknown_agent": st.RejectedUnknown,
			"auth":          st.RejectedAuth,
			"id_limit":      st.RejectedIDLimit,
			"agent_limit":   st.RejectedAgentLimit,
			"shutdown":      st.RejectedShutdown,
			"timeout":       st.Timeouts,
			"bad_frame":     st.BadFrames,
			"tls_error":     st.TLSErrors,
			"evicted":       st.Evicted,
			"busy":          st.Busy,
		},
		Delayed:  st.Delayed,
		Unheld:   st.Unheld,
		Pending:  st.Pending,
		Refusing: st.Refusing,
		Active:   st.Active,
	}
}

// Serve accepts connections until ctx ends or Close is called, then closes
// the listener (draining every pool) and returns. It returns nil after a
// normal close and the accept error when a socket fails.
func (l *Listener) Serve(ctx context.Context) error {
	if !l.serving.CompareAndSwap(false, true) {
		return ErrReverseServing
	}
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return ErrReverseClosed
	}
	errc := make(chan error, len(l.lns))
	for _, ln := range l.lns {
		go func() { errc <- l.acceptLoop(ln) }()
	}
	var err error
	select {
	case <-ctx.Done():
	case <-l.ctx.Done():
	case err = <-errc:
	}
	_ = l.Close()
	return err
}

func (l *Listener) acceptLoop(ln net.Listener) error {
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if l.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			if !temporary(err) {
				l.log.Error().Err(err).Str("addr", ln.Addr().String()).Msg("reverse listener failed")
				return fmt.Errorf("reverse: accept on %s: %w", ln.Addr(), err)
			}
			// Out of file descriptors and the like: back off as net/http does.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			l.log.Warn().Err(err).Dur("retry_in", delay).Msg("reverse accept failed")
			select {
			case <-time.After(delay):
			case <-l.ctx.Done():
				return nil
			}
			continue
		}
		delay = 0
		pc := &pconn{nc: nc, raw: nc, peer: peerKey(nc)}
		if tc, ok := nc.(*tls.Conn); ok {
			pc.raw = tc.NetConn()
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			_ = pc.raw.Close()
			return nil
		}
		victim, ok := l.pending.admit(pc)
		if !ok {
			l.mu.Unlock()
			l.c.busy.Add(1)
			_ = pc.raw.Close()
			continue
		}
		l.wg.Add(1)
		l.mu.Unlock()
		l.c.pending.Add(1)
		if victim != nil {
			l.c.pending.Add(-1)
			l.c.evicted.Add(1)
			_ = victim.raw.Close() // its goroutine ends without counting it again
			l.warn(&l.log).Str("remote", remoteString(victim.nc)).Bool("silent", victim.silent).
				Msg("reverse connection closed before registering, to make room for a newer one")
		}
		go l.serveConn(pc)
	}
}

func temporary(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.ENOBUFS) ||
		errors.Is(err, syscall.ENOMEM)
}

// Close stops accepting, closes connections still registering, drains
// every pool (CancelAll, then close) and waits for the connections'
// goroutines. It is safe to call more than once.
func (l *Listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.wg.Wait()
		return nil
	}
	l.closed = true
	for _, a := range l.agents {
		a.closed = true
	}
	pending := make([]net.Conn, 0, len(l.pending.all))
	for pc := range l.pending.all {
		pending = append(pending, pc.raw)
	}
	l.mu.Unlock()
	l.cancel()
	for _, ln := range l.lns {
		_ = ln.Close()
	}
	for _, nc := range pending {
		_ = nc.Close()
	}
	for _, a := range l.agents {
		_ = a.handle.Pool.Close()
	}
	l.wg.Wait()
	return nil
}

// logBurst is how many registration warnings per second reach the log;
// a flood of bad connections must not become a flood of log lines.
const logBurst = 20

// logGate lets logBurst warnings through per second and counts the rest.
type logGate struct {
	mu         sync.Mutex
	second     int64
	n          int
	suppressed int
}

func (g *logGate) allow(now time.Time) (bool, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if sec := now.Unix(); sec != g.second {
		g.second, g.n = sec, 0
	}
	if g.n >= logBurst {
		g.suppressed++
		return false, 0
	}
	g.n++
	s := g.suppressed
	g.suppressed = 0
	return true, s
}

// warn is log.Warn() through the listener's log gate; a nil event (the
// gate closed) discards everything chained on it.
func (l *Listener) warn(log *zerolog.Logger) *zerolog.Event {
	ok, suppressed := l.logs.allow(time.Now())
	if !ok {
		return nil
	}
	e := log.Warn()
	if suppressed > 0 {
		e = e.Int("suppressed_since", suppressed)
	}
	return e
}

// registration is an accepted registration, not yet serving.
type registration struct {
	a      *agent
	id     string
	connID string
	caps   protocol.Capabilities
	enc    uds.Encoding
	fr     *uds.FrameReader
}

// serveConn registers pc and, once accepted, serves it until it ends. A
// refusal is answered after the connection has left the pending table, so
// that neither its delay nor its drain holds a registration slot.
func (l *Listener) serveConn(pc *pconn) {
	defer l.wg.Done()
	reg, ref := l.register(pc)
	l.mu.Lock()
	left := l.pending.remove(pc)
	l.mu.Unlock()
	if left {
		l.c.pending.Add(-1)
	}
	switch {
	case ref != nil:
		l.answerRefusal(pc.nc, ref)
	case reg != nil:
		l.serveRegistered(pc.nc, reg)
	}
}

// moveTo moves pc to a tier of the pending table; false when it gave way
// to a newer connection meanwhile (or the listener closed).
func (l *Listener) moveTo(pc *pconn, tier int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pending.move(pc, tier)
}

// evicted reports whether pc was closed to make room for a newer one.
func (l *Listener) evicted(pc *pconn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return pc.evicted
}

func (l *Listener) serveRegistered(nc net.Conn, reg *registration) {
	a := reg.a
	log := l.log.With().Str("agent", a.cfg.Name).Str("agent_id", reg.id).Str("conn_id", reg.connID).
		Str("remote", remoteString(nc)).Logger()
	pingInterval := l.cfg.PingInterval
	if l.cfg.NoPing {
		pingInterval = 0
	}
	link := udsclient.NewLink(nc, udsclient.LinkConfig{
		Name:            a.cfg.Name,
		WriteTimeout:    l.cfg.WriteTimeout,
		MaxPendingBytes: a.cfg.MaxPending,
		PingInterval:    pingInterval,
		PingTimeout:     l.cfg.PingTimeout,
		FrameTimeout:    a.cfg.FrameTimeout,
		Encoding:        reg.enc,
		Reader:          reg.fr,
		Logger:          log,
	})
	sc := agentmux.SessionConfig{
		Name:           a.cfg.Name,
		MaxInFlight:    l.cfg.MaxInFlight,
		MaxQueue:       l.cfg.MaxQueue,
		MessageTimeout: l.cfg.MessageTimeout,
	}
	if a.cfg.MaxInFlight > 0 {
		sc.MaxInFlight = a.cfg.MaxInFlight
	}
	if a.cfg.MaxQueue > 0 {
		sc.MaxQueue = a.cfg.MaxQueue
	}
	if a.cfg.MessageTimeout > 0 {
		sc.MessageTimeout = a.cfg.MessageTimeout
	}
	sess := agentmux.NewSession(link, reg.caps, sc)
	l.mu.Lock()
	if a.closed {
		// Closed between the answer and now: the agent sees the connection
		// end and reconnects elsewhere or later.
		l.mu.Unlock()
		_ = link.Close()
		sess.Fail(ErrReverseClosed)
		l.release(reg)
		return
	}
	a.handle.Add(sess)
	a.handle.SetLastError(nil)
	l.mu.Unlock()
	l.c.active.Add(1)
	log.Info().Uint32("max_concurrent_requests", reg.caps.MaxConcurrentRequests).Str("payload_encoding", reg.enc.String()).
		Bool("request_body", reg.caps.HandlesRequestBody).Bool("response_headers", reg.caps.HandlesResponseHeaders).
		Bool("response_body", reg.caps.HandlesResponseBody).Msg("reverse agent registered")
	err := link.Serve(sess)
	// Slots first: once the pool no longer shows the connection, its
	// successor's registration must find them free.
	l.release(reg)
	l.c.active.Add(-1)
	a.handle.Remove(sess)
	if l.ctx.Err() != nil || errors.Is(err, udswriter.ErrClosed) && a.isClosed(l) {
		log.Debug().Err(err).Msg("reverse agent connection closed")
		return
	}
	a.handle.SetLastError(err)
	log.Warn().Err(err).Msg("reverse agent connection lost")
}

func (a *agent) isClosed(l *Listener) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return a.closed
}

// release gives back reg's slots in the per-id and per-agent limits.
func (l *Listener) release(reg *registration) {
	l.mu.Lock()
	if n := l.perID[reg.id] - 1; n > 0 {
		l.perID[reg.id] = n
	} else {
		delete(l.perID, reg.id)
	}
	reg.a.conns--
	l.mu.Unlock()
}

// refusal is a refused registration's answer, and how long to hold it
// back.
type refusal struct {
	t      protocol.MsgType
	reason string
	delay  time.Duration
}

// register reads and judges the first frame. It returns the registration
// (its slots reserved, its deadlines cleared, its answer sent), or the
// refusal to answer, or neither when the connection is closed already.
func (l *Listener) register(pc *pconn) (*registration, *refusal) {
	nc := pc.nc
	remote := remoteString(nc)
	log := l.log.With().Str("remote", remote).Logger()
	_ = nc.SetDeadline(time.Now().Add(l.cfg.RegistrationTimeout))
	// Until something arrives the connection is among the first to give
	// way to a newcomer; then it goes to the back of the receiving ones.
	err := awaitData(pc.raw, func() { l.moveTo(pc, tierSilent) })
	if err == nil && !l.moveTo(pc, tierReceiving) {
		err = net.ErrClosed
	}
	if tc, ok := nc.(*tls.Conn); ok && err == nil {
		if err := tc.HandshakeContext(l.ctx); err != nil {
			if !l.evicted(pc) && l.ctx.Err() == nil {
				l.c.tlsErrors.Add(1)
				l.warn(&log).Err(err).Msg("reverse connection: TLS handshake failed")
			}
			_ = pc.raw.Close()
			return nil, nil
		}
	}
	fr := uds.NewFrameReader(nc)
	fr.SetMaxFrameSize(l.cfg.MaxRegistrationSize)
	var t protocol.MsgType
	var payload []byte
	if err == nil {
		t, payload, err = fr.Next()
	}
	if err == nil && !l.moveTo(pc, tierJudged) {
		err = net.ErrClosed
	}
	if err != nil {
		switch {
		case l.evicted(pc):
		case errors.Is(err, os.ErrDeadlineExceeded):
			l.c.timeouts.Add(1)
			l.warn(&log).Dur("timeout", l.cfg.RegistrationTimeout).Msg("reverse connection: no registration within the timeout; closing")
		case errors.Is(err, uds.ErrUDSFrameTooLarge), errors.Is(err, uds.ErrUDSFrameEmpty):
			l.c.badFrames.Add(1)
			l.warn(&log).Err(err).Msg("reverse connection: invalid first frame; closing")
		case l.ctx.Err() != nil:
		default:
			l.c.aborted.Add(1)
			log.Debug().Err(err).Msg("reverse connection closed before registering")
		}
		_ = pc.raw.Close()
		return nil, nil
	}
	respType := protocol.TypeRegistrationResponse
	switch t {
	case protocol.TypeRegistrationRequest:
	case protocol.TypeHandshakeRequest:
		// Compatibility: a registration in a handshake frame is answered
		// in a handshake-response frame.
		respType = protocol.TypeHandshakeResponse
	default:
		l.c.badFrames.Add(1)
		l.warn(&log).Str("type", fmt.Sprintf("0x%02x", uint8(t))).Msg("reverse connection: first frame is not a RegistrationRequest; closing")
		return nil, &refusal{t: respType, reason: ReasonFrame}
	}
	var req protocol.RegistrationRequest
	if err := protocol.DecodeRegistrationRequest(payload, &req); err != nil {
		l.c.invalid.Add(1)
		l.warn(&log).Err(err).Msg("reverse connection: undecodable registration; closing")
		return nil, &refusal{t: respType, reason: ReasonInvalid + ": undecodable payload"}
	}
	log = log.With().Str("agent_id", clip(req.AgentID)).Logger()
	a, reason := l.judge(&req)
	if reason == ReasonUnknown || reason == ReasonAuth {
		// The log names the cause (never the token); the peer only learns
		// that it failed, after the delay its key has earned.
		l.warn(&log).Str("reason", reason).Msg("reverse registration refused")
		return nil, &refusal{t: respType, reason: ReasonAuth, delay: l.fails.penalize(failKey(pc.peer, req.AgentID), time.Now())}
	}
	if reason != "" {
		l.warn(&log).Str("reason", reason).Msg("reverse registration refused")
		return nil, &refusal{t: respType, reason: reason}
	}
	connID := newConnID()
	_ = nc.SetWriteDeadline(time.Now().Add(l.cfg.WriteTimeout))
	resp := answer{t: respType, RegistrationResponse: protocol.RegistrationResponse{Accepted: true, AssignedID: connID}}
	caps, protobuf := handshake.AcceptRegistration(&req, !a.cfg.JSONOnly, respType != protocol.TypeRegistrationResponse)
	reg := &registration{a: a, id: req.AgentID, connID: connID, caps: caps, fr: fr}
	if protobuf {
		resp.PayloadEncoding, reg.enc = protocol.EncodingProtobuf, uds.Protobuf
	}
	l.c.accepted.Add(1)
	if err := uds.WriteFrame(nc, &resp); err != nil {
		log.Warn().Err(err).Msg("reverse registration: answer failed")
		l.release(reg)
		_ = pc.raw.Close()
		return nil, nil
	}
	_ = nc.SetDeadline(time.Time{})
	fr.SetMaxFrameSize(protocol.MaxFrameSize)
	return reg, nil
}

// answerRefusal holds ref back for its delay, answers it and drains the
// connection (see refuse), in one of MaxRefusing places. When they are all
// taken the refusal is not held: one that was to wait is closed without an
// answer, one answered at once is closed without the drain. Either way
// the peer learns nothing it would not learn from the answer itself, and
// the refused connections held open stay bounded.
func (l *Listener) answerRefusal(nc net.Conn, ref *refusal) {
	for {
		n := l.c.refusing.Load()
		if n >= int64(l.cfg.MaxRefusing) {
			l.c.unheld.Add(1)
			l.warn(&l.log).Str("remote", remoteString(nc)).Int("max_refusing", l.cfg.MaxRefusing).
				Msg("reverse registration refused without holding the connection: too many refused connections held open")
			if ref.delay <= 0 {
				_ = nc.SetWriteDeadline(time.Now().Add(l.cfg.WriteTimeout))
				_ = uds.WriteFrame(nc, &answer{t: ref.t, RegistrationResponse: protocol.RegistrationResponse{Accepted: false, Error: ref.reason}})
			}
			_ = nc.Close()
			return
		}
		if l.c.refusing.CompareAndSwap(n, n+1) {
			break
		}
	}
	defer l.c.refusing.Add(-1)
	if !l.hold(ref.delay) {
		_ = nc.Close()
		return
	}
	l.refuse(nc, ref.t, ref.reason)
}

// hold waits d before a refusal is answered, counting it as delayed; false
// when the listener closed meanwhile.
func (l *Listener) hold(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	l.c.delayed.Add(1)
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-l.ctx.Done():
		return false
	}
}

// judge applies the registration checks in the documented order and, on
// success, reserves the connection's slots. It returns a refusal reason or
// "": ReasonUnknown and ReasonAuth are authentication failures, which the
// caller penalizes and answers alike. A valid token is judged without
// consulting the failure table.
func (l *Listener) judge(req *protocol.RegistrationRequest) (*agent, string) {
	if err := handshake.CheckRegistration(req); err != nil {
		if errors.Is(err, handshake.ErrHandshakeVersion) {
			l.c.version.Add(1)
			return nil, fmt.Sprintf("%s: proxy speaks %d", ReasonVersion, protocol.Version)
		}
		l.c.invalid.Add(1)
		return nil, ReasonInvalid + ": " + strings.TrimPrefix(err.Error(), handshake.ErrHandshakeInvalid.Error()+": ")
	}
	if !printable(req.AgentID) {
		l.c.invalid.Add(1)
		return nil, ReasonInvalid + ": agent_id has control or invalid characters"
	}
	var a *agent
	for _, x := range l.agents {
		if matchID(x.cfg.IDs, req.AgentID) {
			a = x
			break
		}
	}
	if a == nil {
		noTokens.check(req.AuthToken) // the same work as a known id's check
		l.c.unknown.Add(1)
		return nil, ReasonUnknown
	}
	if !a.tokens.check(req.AuthToken) {
		l.c.auth.Add(1)
		return nil, ReasonAuth
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed || a.closed:
		l.c.shutdown.Add(1)
		return nil, ReasonShutdown
	case l.perID[req.AgentID] >= l.cfg.MaxConnsPerID:
		l.c.idLimit.Add(1)
		return nil, fmt.Sprintf("%s (limit %d)", ReasonIDLimit, l.cfg.MaxConnsPerID)
	case a.conns >= l.cfg.MaxConnsPerAgent:
		l.c.agentLimit.Add(1)
		return nil, fmt.Sprintf("%s (limit %d)", ReasonAgentLimit, l.cfg.MaxConnsPerAgent)
	}
	l.perID[req.AgentID]++
	a.conns++
	return a, ""
}

// answer is a RegistrationResponse sent in the frame type that answers the
// registration's: a registration that came in a handshake frame
// (compatibility) is answered in a handshake-response frame.
type answer struct {
	t protocol.MsgType
	protocol.RegistrationResponse
}

// MsgType implements protocol.Message (AppendJSON is the response's).
func (a *answer) MsgType() protocol.MsgType { return a.t }

// refuse answers with reason and closes the connection after a short
// drain, so that the peer reads the answer rather than a reset.
func (l *Listener) refuse(nc net.Conn, t protocol.MsgType, reason string) {
	_ = nc.SetWriteDeadline(time.Now().Add(l.cfg.WriteTimeout))
	resp := answer{t: t, RegistrationResponse: protocol.RegistrationResponse{Accepted: false, Error: reason}}
	if err := uds.WriteFrame(nc, &resp); err != nil {
		_ = nc.Close()
		return
	}
	type closeWriter interface{ CloseWrite() error }
	if cw, ok := nc.(closeWriter); ok && cw.CloseWrite() == nil {
		_ = nc.SetReadDeadline(time.Now().Add(lingerTime))
		_, _ = io.Copy(io.Discard, io.LimitReader(nc, 64<<10))
	}
	_ = nc.Close()
}

func newConnID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "conn-" + hex.EncodeToString(b[:])
}

func remoteString(nc net.Conn) string {
	if a := nc.RemoteAddr(); a != nil && a.String() != "" && a.String() != "@" {
		return a.String()
	}
	return "unix"
}

// printable reports whether id is valid UTF-8 without control characters
// (it reaches logs and status pages).
func printable(id string) bool {
	if !utf8.ValidString(id) {
		return false
	}
	for _, r := range id {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// clip bounds peer-provided text before it reaches logs.
func clip(s string) string {
	if len(s) > 256 {
		s = s[:256] + "…"
	}
	return s
}
