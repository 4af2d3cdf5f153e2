package udsclient

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/internal/udswriter"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

// LinkConfig tunes one proxy-side connection.
type LinkConfig struct {
	// Name is the agent's name. Log lines get it from Logger, not from
	// here.
	Name string
	// WriteTimeout bounds each batched write.
	WriteTimeout time.Duration
	// MaxPendingBytes caps the bytes queued or being written on the connection
	// (0: udswriter.DefaultMaxPendingBytes, 4 MiB). An event that does not fit
	// waits for room within its exchange's deadline; control frames
	// (Pong, Ping, CancelRequest, CancelAll) have reserved room and never
	// wait. See udswriter.Config.
	MaxPendingBytes int
	// PingInterval is how long the link may be idle before it sends a Ping
	// (0 disables pings).
	PingInterval time.Duration
	// PingTimeout closes the link when the agent sent nothing for this long.
	PingTimeout time.Duration
	// FrameTimeout bounds the time the rest of a frame may take once the
	// agent has begun it (0: no bound); a stall closes the link with
	// uds.ErrUDSFrameTimeout. See uds.FrameReader.SetFrameTimeout.
	FrameTimeout time.Duration
	// Encoding is the payload encoding negotiated in the handshake or
	// registration (uds.JSON by default).
	Encoding uds.Encoding
	// Reader continues a uds.FrameReader that already read the handshake or
	// registration, so no buffered byte is lost. Nil: a new one.
	Reader *uds.FrameReader
	// Logger receives connection-level events. It carries the agent field
	// (whoever builds the link adds it); the link does not add it.
	Logger zerolog.Logger
}

// LinkStats are a link's connection-level counters.
type LinkStats struct {
	FramesIn     uint64
	UnknownTypes uint64
	PingsSent    uint64
	PongsSent    uint64
	// FrameTimeouts counts frames the agent began and did not finish in
	// time (at most 1: the link closes).
	FrameTimeouts uint64
	// Writer is the state of the connection's writer: pending bytes and
	// their cap, waits for room, dropped control frames.
	Writer udswriter.Stats
}

// Link is the proxy side of one agent connection: it implements
// agentmux.Link and runs the read loop that feeds an agentmux.Session.
type Link struct {
	nc  net.Conn
	fr  *uds.FrameReader
	w   *udswriter.Writer
	cfg LinkConfig

	framesIn      atomic.Uint64
	unknown       atomic.Uint64
	pingsSent     atomic.Uint64
	pongsSent     atomic.Uint64
	frameTimeouts atomic.Uint64

	closeOnce sync.Once
	closed    chan struct{}
	why       atomic.Pointer[error]
}

// NewLink wraps a connection whose handshake (or registration) is done.
func NewLink(nc net.Conn, cfg LinkConfig) *Link {
	l := &Link{nc: nc, cfg: cfg, fr: cfg.Reader, closed: make(chan struct{})}
	if l.fr == nil {
		l.fr = uds.NewFrameReader(nc)
	}
	l.fr.SetFrameTimeout(cfg.FrameTimeout)
	l.w = udswriter.NewWriter(nc, udswriter.Config{WriteTimeout: cfg.WriteTimeout, MaxPendingBytes: cfg.MaxPendingBytes, Encoding: cfg.Encoding},
		func(err error) { l.closeWith(fmt.Errorf("%w: write: %v", udswriter.ErrClosed, err)) })
	return l
}

// Send implements agentmux.Link: m is queued for the connection's writer
// (see udswriter.Writer), waiting for room while the connection is backed
// up, at most until w's deadline or cancel.
func (l *Link) Send(m protocol.Message, w agentmux.Wait) error {
	err := l.w.SendWait(m, w.Deadline, w.Cancel)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, udswriter.ErrWaitDeadline):
		return fmt.Errorf("%w: %s: %v", agentmux.ErrAgentTimeout, l.cfg.Name, err)
	case errors.Is(err, udswriter.ErrWaitCanceled):
		return fmt.Errorf("%w: %s: %v", agentmux.ErrAgentCanceled, l.cfg.Name, err)
	}
	return err
}

// SendControl implements agentmux.Link: it never waits.
func (l *Link) SendControl(m protocol.Message) error { return l.w.Send(m) }

// Close implements agentmux.Link. Frames already queued (a CancelAll
// before a shutdown) get a short, bounded chance to leave first.
func (l *Link) Close() error {
	l.w.Drain(drainTimeout)
	l.closeWith(udswriter.ErrClosed)
	return nil
}

// drainTimeout bounds how long a deliberate close waits for queued frames.
const drainTimeout = 200 * time.Millisecond

func (l *Link) closeWith(err error) {
	l.closeOnce.Do(func() {
		l.why.Store(&err)
		l.w.Close()
		close(l.closed)
		_ = l.nc.Close()
	})
}

// Stats returns the link's counters.
func (l *Link) Stats() LinkStats {
	return LinkStats{FramesIn: l.framesIn.Load(), UnknownTypes: l.unknown.Load(), PingsSent: l.pingsSent.Load(),
		PongsSent: l.pongsSent.Load(), FrameTimeouts: l.frameTimeouts.Load(), Writer: l.w.Stats()}
}

// Backpressure implements agentmux.BackpressureReporter.
func (l *Link) Backpressure() (sendWaits, controlDropped uint64) {
	st := l.w.Stats()
	return st.Waits, st.ControlDropped
}

// Batching implements agentmux.BatchReporter.
func (l *Link) Batching() (writes, frames uint64) {
	st := l.w.Stats()
	return st.Batches, st.Frames
}

// Encoding is the payload encoding of the connection's frames.
func (l *Link) Encoding() uds.Encoding { return l.cfg.Encoding }

// RemoteAddr is the peer's address.
func (l *Link) RemoteAddr() net.Addr { return l.nc.RemoteAddr() }

// Serve runs the read loop until the connection ends, then fails sess with
// the reason, which it also returns.
func (l *Link) Serve(sess *agentmux.Session) error {
	if l.cfg.PingInterval > 0 {
		go l.pinger()
	}
	err := l.readLoop(sess)
	if p := l.why.Load(); p != nil && (errors.Is(err, net.ErrClosed) || err == io.EOF) {
		err = *p // a close we caused explains the read error better
	}
	l.closeWith(err)
	sess.Fail(err)
	return err
}

func (l *Link) readLoop(sess *agentmux.Session) error {
	if l.cfg.Encoding == uds.Protobuf {
		return l.readLoopProtobuf(sess)
	}
	spare := new(agentmux.Reply)
	pong := new(protocol.Pong) // encoded before Send returns: reused
	for {
		t, payload, err := l.next(sess)
		if err != nil {
			return err
		}
		switch t {
		case protocol.TypeDecision:
			spare.Type, spare.Err = t, nil
			if derr := spare.Decision.Decode(payload); derr != nil {
				id, known := protocol.PeekRequestID(payload)
				if spare, err = l.badReply(sess, spare, id, known, derr); err != nil {
					return err
				}
				continue
			}
			spare = sess.Deliver(spare)
		case protocol.TypeBodyMutation:
			spare.Type, spare.Err = t, nil
			if derr := spare.Mutation.Decode(payload); derr != nil {
				id, known := protocol.PeekRequestID(payload)
				if spare, err = l.badReply(sess, spare, id, known, derr); err != nil {
					return err
				}
				continue
			}
			spare = sess.Deliver(spare)
		case protocol.TypePing:
			// The read loop never writes: the Pong is queued for the
			// writer goroutine (or dropped if the connection is backed up
			// past the control reserve), so a peer that stops reading
			// cannot stall the delivery of replies.
			if (*protocol.Ping)(pong).Decode(payload) == nil && l.w.Send(pong) == nil {
				l.pongsSent.Add(1)
			}
		case protocol.TypePong:
			// Any frame proves liveness; framesIn already counted it.
		default:
			// Forward compatibility: unknown (or misdirected) types are
			// counted and skipped, never fatal after the handshake.
			if l.unknown.Add(1) == 1 {
				l.cfg.Logger.Warn().Uint8("type", uint8(t)).Msg("skipping frame of unexpected type from agent")
			}
		}
	}
}

// next reads the next frame; a frame timeout closes the connection.
func (l *Link) next(sess *agentmux.Session) (protocol.MsgType, []byte, error) {
	t, payload, err := l.fr.Next()
	if err != nil {
		if errors.Is(err, uds.ErrUDSFrameTimeout) {
			// Every request on the connection would wait behind the
			// stalled frame: drop the connection, which fails them now.
			l.frameTimeouts.Add(1)
			sess.CountProtocolError()
			l.cfg.Logger.Warn().Err(err).Msg("agent stalled mid-frame; closing connection")
		}
		return 0, nil, err
	}
	l.framesIn.Add(1)
	return t, payload, nil
}

// readLoopProtobuf is readLoop for protobuf payloads: each frame carries
// an AgentMessage whose payload must be of the frame's type (an
// agent_error travels in a Decision frame). A reply is copied into the
// Buf of the spare Reply it is decoded into, since the decoded fields
// alias their bytes and the frame reader reuses its buffer.
func (l *Link) readLoopProtobuf(sess *agentmux.Session) error {
	spare := new(agentmux.Reply)
	pong := new(protocol.Pong)
	var f pbwire.Frame
	for {
		t, payload, err := l.next(sess)
		if err != nil {
			return err
		}
		switch t {
		case protocol.TypeDecision, protocol.TypeBodyMutation:
			if cap(spare.Buf) > 64<<10 {
				spare.Buf = nil // one big reply should not stay pinned
			}
			spare.Buf = append(spare.Buf[:0], payload...)
			f.ParseAs(t, spare.Buf)
			spare.Type, spare.Err = t, nil
			var derr error
			switch {
			case f.Err != nil:
				derr = f.Err
			case f.Payload == pbwire.PayloadDecision:
				derr = f.DecodeDecision(&spare.Decision)
			case f.Payload == pbwire.PayloadBodyMutation:
				derr = f.DecodeBodyMutation(&spare.Mutation)
			default: // an agent_error in a Decision frame
				msg, aerr := f.AgentError()
				if aerr == nil {
					aerr = fmt.Errorf("%w: agent error: %q", agentmux.ErrAgentProtocol, clip(msg))
				}
				derr = aerr
			}
			if derr != nil {
				if spare, err = l.badReply(sess, spare, f.RequestID, f.RequestID != 0, derr); err != nil {
					return err
				}
				continue
			}
			spare = sess.Deliver(spare)
		case protocol.TypePing:
			f.ParseAs(t, payload)
			if f.Err == nil && f.DecodePing((*protocol.Ping)(pong)) == nil && l.w.Send(pong) == nil {
				l.pongsSent.Add(1)
			}
		case protocol.TypePong:
		default:
			if l.unknown.Add(1) == 1 {
				l.cfg.Logger.Warn().Uint8("type", uint8(t)).Msg("skipping frame of unexpected type from agent")
			}
		}
	}
}

// clip bounds agent-provided text before it reaches logs and errors.
func clip(s string) string {
	if len(s) > 256 {
		return s[:256] + "…"
	}
	return s
}

// badReply routes an undecodable reply to its request when its id could
// be read (known: from a JSON payload by protocol.PeekRequestID, from a
// protobuf envelope as far as it parsed), so that request fails with a
// protocol error and the others go on. Without an id nobody can be told,
// so the connection is dropped: every waiter then fails at once instead
// of waiting for its deadline.
func (l *Link) badReply(sess *agentmux.Session, r *agentmux.Reply, id uint64, known bool, derr error) (*agentmux.Reply, error) {
	l.cfg.Logger.Warn().Err(derr).Bool("request_known", known).Msg("undecodable reply from agent")
	if !known {
		sess.CountProtocolError()
		return r, fmt.Errorf("%w: undecodable %s without request_id: %v", agentmux.ErrAgentProtocol, r.Type, derr)
	}
	return sess.DeliverError(r, id, derr), nil
}

func (l *Link) pinger() {
	t := time.NewTicker(l.cfg.PingInterval)
	defer t.Stop()
	var seq uint64
	last := l.framesIn.Load()
	silentSince := time.Now()
	for {
		select {
		case <-l.closed:
			return
		case now := <-t.C:
			n := l.framesIn.Load()
			if n != last {
				last, silentSince = n, now
				continue
			}
			if l.cfg.PingTimeout > 0 && now.Sub(silentSince) >= l.cfg.PingTimeout {
				l.cfg.Logger.Warn().Dur("silent", now.Sub(silentSince)).Msg("agent silent past ping timeout; closing connection")
				l.closeWith(fmt.Errorf("%w (%v)", ErrUDSPingTimeout, l.cfg.PingTimeout))
				return
			}
			seq++
			if l.w.Send(&protocol.Ping{Sequence: seq, TimestampMs: now.UnixMilli()}) == nil {
				l.pingsSent.Add(1)
			}
		}
	}
}
