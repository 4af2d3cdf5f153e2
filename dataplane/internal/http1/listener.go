package http1

import (
	"context"
	"errors"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/dataplane/internal/exchange"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/observe"
)

// Counters are the front end's counters, shared by the listeners of one
// server (Stats).
type Counters struct {
	acceptErrors, absoluteForm atomic.Uint64
	tls                        tlsCounters
	tun                        tunnelCounters
}

// Fill fills the front end's part of st.
func (c *Counters) Fill(st *observe.Stats) {
	st.AcceptErrors = c.acceptErrors.Load()
	st.AbsoluteForm = c.absoluteForm.Load()
	st.TLS = c.tls.snapshot()
	st.Tunnels = c.tun.snapshot()
}

// Listener serves one configured listener over HTTP/1.1: a fasthttp
// server whose every request goes through the exchange core.
type Listener struct {
	cfg   config.Listener
	core  *exchange.Core
	log   zerolog.Logger
	stats *Counters
	srv   *fasthttp.Server
	tls   *listenerTLS // nil: plain HTTP
	tun   tunnelSet    // open Upgrade tunnels (upgrade.go)
	conns *connSet     // client connections (conn.go)
	// el is the socket being served (Serve), for Detach; detach is set
	// by Detach (a Serve that starts after it returns at once).
	el     atomic.Pointer[eofListener]
	detach atomic.Bool
	// facts is what the exchange knows of the listener.
	facts exchange.Listener
	// h2 serves its HTTP/2 connections (sniff.go); nil: HTTP/1 only.
	h2 HTTP2
}

// NewListener makes the listener of cfg (its limits already clamped to
// the descriptor budget) for core. It starts the certificate watcher of
// a TLS listener (Close stops it); it accepts nothing until Serve.
func NewListener(cfg config.Listener, core *exchange.Core, log zerolog.Logger, stats *Counters) (*Listener, error) {
	l := &Listener{cfg: cfg, core: core, log: log, stats: stats}
	if cfg.TLS != nil {
		lt, err := newListenerTLS(cfg.Name, *cfg.TLS, alpnProtos(&cfg), log, &stats.tls)
		if err != nil {
			return nil, err
		}
		l.tls = lt
	}
	l.facts = exchange.Listener{
		Name:           []byte(cfg.Name),
		TLS:            l.tls != nil,
		TrustForwarded: cfg.TrustForwarded,
		MaxRequestBody: int64(cfg.MaxRequestBody),
		BodyTimeout:    cfg.BodyTimeout,
		MinBodyRate:    int64(cfg.MinBodyRate()),
	}
	l.conns = newConnSet(cfg.Name, cfg.MaxConnections, cfg.LingeringTimeout, int64(cfg.MaxLingeringBytes))
	l.srv = &fasthttp.Server{
		Handler:                      l.handle,
		ErrorHandler:                 l.parseError,
		Logger:                       fastLogger{log: log},
		Concurrency:                  fastConcurrency(cfg.MaxConnections),
		ReadBufferSize:               int(cfg.ReadBufferSize),
		WriteBufferSize:              int(cfg.WriteBufferSize),
		ReadTimeout:                  cfg.ReadTimeout,
		IdleTimeout:                  cfg.IdleTimeout,
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		NoDefaultServerHeader:        true,
		NoDefaultContentType:         true,
		CloseOnShutdown:              true,
		SecureErrorLogMessage:        true,
	}
	return l, nil
}

// Config is the listener's configuration (limits clamped).
func (l *Listener) Config() *config.Listener { return &l.cfg }

// fastConcurrency is fasthttp's worker limit for a listener of maxConns
// connections. The listener enforces max_connections itself (conn.go);
// fasthttp's limit, which answers 503 past it, only has to stay out of
// its way. A worker outlives its connection's place by the moment
// between Close and its return to the pool, so the limit is well above
// maxConns (a limit costs fasthttp nothing until workers are used).
func fastConcurrency(maxConns int) int {
	return max(fasthttp.DefaultConcurrency, 2*maxConns)
}

// Serve serves ln until it fails or the listener shuts down.
func (l *Listener) Serve(ln net.Listener) error {
	if d, ok := ln.(deadliner); ok {
		_ = d.SetDeadline(time.Time{}) // a socket handed over by Detach
	}
	el := &eofListener{Listener: ln, hdrBuf: int(l.cfg.ReadBufferSize), tls: l.tls, conns: l.conns, log: l.log, stats: l.stats}
	l.el.Store(el)
	if l.detach.Load() {
		return nil
	}
	if l.h2 != nil {
		return l.srv.Serve(l.sniffer(el))
	}
	return l.srv.Serve(el)
}

// Detach makes Serve return without closing its socket, so that another
// Listener can serve it (a listener's settings changed by a reload, at
// the same address): connections arriving meanwhile wait in the
// socket's backlog. Shutdown then drains the listener's connections and
// leaves the socket open. It reports false when the socket cannot be
// woken that way (not a *net.TCPListener or *net.UnixListener).
func (l *Listener) Detach() bool {
	l.detach.Store(true)
	if el := l.el.Load(); el != nil {
		return el.detach()
	}
	return true
}

// Shutdown stops accepting and waits for the requests being served to
// end (or ctx to end); it closes idle connections. HTTP/2 connections
// get a GOAWAY at once and are waited for alongside.
func (l *Listener) Shutdown(ctx context.Context) error {
	if l.h2 == nil {
		return l.srv.ShutdownWithContext(ctx)
	}
	h2err := make(chan error, 1)
	go func() { h2err <- l.h2.Shutdown(ctx) }()
	err := l.srv.ShutdownWithContext(ctx)
	if e := <-h2err; err == nil {
		err = e
	}
	return err
}

// Lingering is the number of connections in a lingering close now
// (Shutdown's caller waits for them, within its bound).
func (l *Listener) Lingering() int64 { return l.conns.lingering.Load() }

// ConnStats counts the listener's client connections.
func (l *Listener) ConnStats() observe.ConnStats { return l.conns.snapshot() }

// parseError answers a request fasthttp could not parse, generically.
//
// A connection on which no byte of a request arrived is closed without
// an answer, as nginx and net/http do: at read_timeout that is an idle
// connection, and a client that picked it for its next request at that
// moment would read a 408 for a request it never sent. (fasthttp itself
// closes a kept-alive connection silently at idle_timeout.)
func (l *Listener) parseError(ctx *fasthttp.RequestCtx, err error) {
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
	status, body, reason := fasthttp.StatusBadRequest, "bad request", observe.RejectParse
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.As(err, &small):
		status, body, reason = fasthttp.StatusRequestHeaderFieldsTooLarge, "request header fields too large", observe.RejectHeaderTooLarge
		if ec != nil && ec.requestLineTooLong() {
			status, body, reason = fasthttp.StatusRequestURITooLong, "request URI too long", observe.RejectURITooLong
		}
	case isTimeout(err):
		status, body, reason = fasthttp.StatusRequestTimeout, "request timeout", observe.RejectHeadTimeout
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		status, body = fasthttp.StatusRequestEntityTooLarge, "request entity too large"
	}
	if reason != observe.RejectHeadTimeout && ec != nil {
		// The rest of the request may still be arriving. (A head that
		// timed out stalled: nothing is on its way.)
		ec.markLinger()
	}
	l.core.Reject(reason)
	l.log.Debug().Err(err).Int("status", status).Msg("unparsable request")
	ctx.Response.Reset()
	ctx.SetStatusCode(status)
	ctx.SetContentType("text/plain; charset=utf-8")
	ctx.SetBodyString(body)
	ctx.SetConnectionClose()
}

// isTimeout reports an error of a deadline or timeout, fasthttp's
// included.
func isTimeout(err error) bool {
	if errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, fasthttp.ErrDialTimeout) || errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// fastLogger routes fasthttp's own messages (mostly connection errors of
// clients that went away) to debug.
type fastLogger struct{ log zerolog.Logger }

func (f fastLogger) Printf(format string, args ...any) {
	if e := f.log.Debug(); e != nil {
		e.Msgf(format, args...)
	}
}
