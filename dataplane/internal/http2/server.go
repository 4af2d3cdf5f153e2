package http2

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/net/http2"

	"github.com/zentinelproxy/sidecar/dataplane/internal/exchange"
	"github.com/zentinelproxy/sidecar/dataplane/internal/h2conn"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/observe"
)

// Counters are the HTTP/2 front end's counters, shared by the listeners
// of one server (Stats).
type Counters struct {
	conns, streams, h2, h2c        atomic.Uint64
	connsOpen, streamsOpen         atomic.Int64
	refusedStreams, rapidResets    atomic.Uint64
	headerTooLarge, protocolErrors atomic.Uint64
	grpcAnswers, goAwaysOnShutdown atomic.Uint64
	idleClosed                     atomic.Uint64
	frameTooLarge, frameSize       atomic.Uint64
}

// Fill fills the HTTP/2 part of st.
func (c *Counters) Fill(st *observe.Stats) {
	st.HTTP2 = observe.HTTP2Stats{
		Connections:        c.conns.Load(),
		ConnectionsOpen:    c.connsOpen.Load(),
		Streams:            c.streams.Load(),
		StreamsOpen:        c.streamsOpen.Load(),
		RefusedStreams:     c.refusedStreams.Load(),
		RapidResets:        c.rapidResets.Load(),
		HeaderListTooLarge: c.headerTooLarge.Load(),
		ProtocolErrors:     c.protocolErrors.Load(),
		GRPCAnswers:        c.grpcAnswers.Load(),
		ShutdownGoAways:    c.goAwaysOnShutdown.Load(),
		IdleClosed:         c.idleClosed.Load(),
		FrameTooLarge:      c.frameTooLarge.Load(),
		FrameSizeErrors:    c.frameSize.Load(),
	}
	h2, h2c := c.h2.Load(), c.h2c.Load()
	st.RequestsByProtocol = map[string]uint64{
		"h2":  h2,
		"h2c": h2c,
		// Every other request the core counted came over HTTP/1.
		"http1": st.Requests - min(st.Requests, h2+h2c),
	}
}

// countError is x/net/http2's error hook: every error it answers on a
// connection or stream, by kind ("stream_REFUSED_STREAM_over_max_streams",
// or a frame's own token such as "frame_data_pad_too_big").
func (c *Counters) countError(kind string) {
	switch {
	case strings.HasSuffix(kind, "_over_max_streams"), strings.HasSuffix(kind, "_over_max_streams_race"):
		c.refusedStreams.Add(1)
	case strings.HasSuffix(kind, "_too_many_early_resets"):
		c.rapidResets.Add(1)
	case frameSizeKind(kind):
		c.frameSize.Add(1)
	default:
		c.protocolErrors.Add(1)
	}
}

// frameSizeKind reports the tokens of the frames x/net refuses with
// FRAME_SIZE_ERROR for a length their type does not allow (RFC 9113
// §4.2: a PING not 8 bytes long, a SETTINGS ACK with a payload, …).
func frameSizeKind(kind string) bool {
	switch kind {
	case "frame_settings_ack_with_length", "frame_settings_mod_6", "frame_ping_length", "frame_goaway_short",
		"frame_windowupdate_bad_len", "frame_priority_bad_length", "frame_priority_update_bad_length",
		"frame_rststream_bad_len":
		return true
	}
	return false
}

// frameWatch is a client connection as x/net's framer reads it. It
// follows the frame headers that go by to count a frame longer than
// max_read_frame_size, which x/net answers with a GOAWAY
// (FRAME_SIZE_ERROR) without calling CountError. x/net reads through a
// buffer (h2conn) that reads from this watch, so a Read holds the bytes of
// several frames: a few comparisons per frame header, the payloads
// skipped; once the count is made it looks no more.
type frameWatch struct {
	net.Conn
	stats *Counters
	max   uint32
	skip  uint32  // bytes of the preface or the current payload still to pass
	hn    int     // bytes of the current frame header seen
	hdr   [3]byte // the header's length field
	done  bool
}

func (w *frameWatch) Read(p []byte) (int, error) {
	n, err := w.Conn.Read(p)
	if !w.done && n > 0 {
		w.watch(p[:n])
	}
	return n, err
}

// watch follows the frames in b, the next bytes of the connection.
func (w *frameWatch) watch(b []byte) {
	for len(b) > 0 {
		if w.skip > 0 {
			k := uint32(min(len(b), int(min(w.skip, 1<<30))))
			w.skip -= k
			b = b[k:]
			continue
		}
		for w.hn < 9 && len(b) > 0 {
			if w.hn < 3 {
				w.hdr[w.hn] = b[0]
			}
			w.hn++
			b = b[1:]
		}
		if w.hn < 9 {
			return
		}
		w.hn = 0
		w.skip = uint32(w.hdr[0])<<16 | uint32(w.hdr[1])<<8 | uint32(w.hdr[2])
		if w.skip > w.max {
			w.stats.frameTooLarge.Add(1)
			w.done = true
			return
		}
	}
}

// tlsFrameWatch is a frameWatch over TLS: x/net checks the TLS version
// and cipher suite through ConnectionState (RFC 9113 §9.2).
type tlsFrameWatch struct {
	*frameWatch
	st interface{ ConnectionState() tls.ConnectionState }
}

func (w tlsFrameWatch) ConnectionState() tls.ConnectionState { return w.st.ConnectionState() }

// watchFrames wraps c in a frameWatch; sawPreface: the client's preface
// was read from c already.
func (s *Server) watchFrames(c net.Conn, sawPreface bool) net.Conn {
	w := &frameWatch{Conn: c, stats: s.stats, max: s.h2.MaxReadFrameSize}
	if w.max == 0 {
		w.max = 16 << 10 // x/net's default
	}
	if !sawPreface {
		w.skip = uint32(len(http2.ClientPreface))
	}
	if st, ok := c.(interface{ ConnectionState() tls.ConnectionState }); ok {
		return tlsFrameWatch{w, st}
	}
	return w
}

// Server serves the HTTP/2 connections of one listener.
type Server struct {
	core  *exchange.Core
	log   zerolog.Logger
	stats *Counters
	// facts is the listener as the exchange knows it; Duplex set.
	facts exchange.Listener
	cfg   config.ListenerHTTP2
	h2    *http2.Server
	// base carries the settings http2.Server takes from net/http's
	// (MaxHeaderBytes) and its graceful shutdown (GOAWAY to every
	// connection, in-flight streams finishing).
	base *http.Server

	mu     sync.Mutex
	conns  map[net.Conn]*connTrack
	closed bool
	wg     sync.WaitGroup
}

// NewServer makes the HTTP/2 server of listener cfg, whose exchange facts
// are facts, for core.
func NewServer(cfg *config.Listener, facts exchange.Listener, core *exchange.Core, log zerolog.Logger, stats *Counters) (*Server, error) {
	s := &Server{core: core, log: log, stats: stats, facts: facts, cfg: cfg.HTTP2, conns: map[net.Conn]*connTrack{}}
	s.facts.Duplex = true
	s.h2 = &http2.Server{
		MaxConcurrentStreams: uint32(cfg.HTTP2.MaxConcurrentStreams),
		MaxReadFrameSize:     uint32(cfg.HTTP2.MaxReadFrameSize),
		IdleTimeout:          cfg.IdleTimeout,
		CountError:           stats.countError,
	}
	s.base = &http.Server{
		// The bound x/net advertises is this plus 320 bytes of slack;
		// the handler holds requests to the configured bound itself, so
		// that they are counted (serveStream).
		MaxHeaderBytes: int(cfg.HTTP2.MaxHeaderListSize),
		IdleTimeout:    cfg.IdleTimeout,
		ConnState:      s.connState,
	}
	if err := http2.ConfigureServer(s.base, s.h2); err != nil {
		return nil, fmt.Errorf("http2: %w", err)
	}
	return s, nil
}

// ServeConn serves c, an HTTP/2 connection whose facts are info, until it
// ends; sawPreface: the client's connection preface was read from c
// already (h2c). c is closed when it returns.
func (s *Server) ServeConn(nc net.Conn, info *exchange.Conn, sawPreface bool) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = nc.Close()
		return
	}
	// x/net reads and writes c: reads buffered, writes coalesced (h2conn),
	// over the watch of the frames read.
	w, c := h2conn.New(s.watchFrames(nc, sawPreface))
	track := &connTrack{c: w}
	s.conns[c] = track
	s.wg.Add(1)
	s.mu.Unlock()
	s.stats.conns.Add(1)
	s.stats.connsOpen.Add(1)
	defer func() {
		s.stats.connsOpen.Add(-1)
		_ = c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		if !s.closed && !track.idleSince.IsZero() && time.Since(track.idleSince) >= s.h2.IdleTimeout {
			// Ended while idle for idle_timeout: the server's GOAWAY
			// (or the client's close at the same moment).
			s.stats.idleClosed.Add(1)
		}
		s.mu.Unlock()
		s.wg.Done()
	}()
	// The deadline of the handshake or the preface read is over: the
	// server keeps its own.
	_ = c.SetDeadline(time.Time{})
	// The connection's requests are HTTP/2 streams (Duplex).
	info.Listener = &s.facts
	h := &connHandler{s: s, info: info}
	s.h2.ServeConn(c, &http2.ServeConnOpts{
		BaseConfig:       s.base,
		Handler:          h,
		SawClientPreface: sawPreface,
	})
}

// Facts is the listener as the exchange's streams see it.
func (s *Server) Facts() *exchange.Listener { return &s.facts }

// Shutdown sends every connection a GOAWAY and waits for their streams
// to end (or ctx to end: the connections left are closed).
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	n := len(s.conns)
	s.mu.Unlock()
	s.stats.goAwaysOnShutdown.Add(uint64(n))
	// http.Server.Shutdown runs the GOAWAY hook ConfigureServer
	// registered; it has no connections of its own to wait for.
	_ = s.base.Shutdown(ctx)
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	for _, t := range s.conns {
		// At once: Close would wait for a client that does not read,
		// one connection after another.
		t.c.Abort()
	}
	s.mu.Unlock()
	<-done
	return ctx.Err()
}

// connTrack is what the server follows of a connection's state.
type connTrack struct {
	c *h2conn.Conn
	// idleSince is when its last stream ended (zero: streams open).
	idleSince time.Time
}

// connState is x/net's hook on a connection going idle (no stream open)
// or active.
func (s *Server) connState(c net.Conn, st http.ConnState) {
	s.mu.Lock()
	if t := s.conns[c]; t != nil {
		switch st {
		case http.StateIdle:
			t.idleSince = time.Now()
		case http.StateActive:
			t.idleSince = time.Time{}
		}
	}
	s.mu.Unlock()
}

// connHandler is the handler of one connection's streams.
type connHandler struct {
	s    *Server
	info *exchange.Conn
}

func (h *connHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.s.serveStream(w, r, h.info)
}
