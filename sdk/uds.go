package sdk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/handshake"
	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/internal/rawio"
	"github.com/zentinelproxy/sidecar/internal/udswriter"
	"github.com/zentinelproxy/sidecar/internal/unixsock"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

// Errors of the agent side.
var (
	// ErrSDKSocketInUse: another process is listening on the socket path.
	ErrSDKSocketInUse = unixsock.ErrInUse
	// ErrSDKNotSocket: the path exists and is not a socket; it is never removed.
	ErrSDKNotSocket = unixsock.ErrNotSocket
	// ErrSDKHandshake: the proxy's first frame was not an acceptable handshake.
	ErrSDKHandshake = errors.New("sdk: handshake failed")
	// ErrSDKSocketDir: the socket path's directory does not exist or is
	// not a directory. It is never created: its owner, group and mode
	// decide which processes may connect, a choice the SDK cannot make
	// (systemd's RuntimeDirectory=, a Kubernetes emptyDir make it).
	ErrSDKSocketDir = errors.New("sdk: socket directory missing")
)

// Options tune how an agent serves. The zero value is usable.
type Options struct {
	// Name is sent as agent_name in the handshake ("agent" if empty).
	Name string
	// HandshakeTimeout bounds the wait for the proxy's first frame (default 5s).
	HandshakeTimeout time.Duration
	// WriteTimeout bounds each batched write (default 5s).
	WriteTimeout time.Duration
	// MaxPendingBytes caps the bytes of a connection queued or being written
	// (default 4 MiB, udswriter.DefaultMaxPendingBytes). A reply that does not
	// fit waits for room until its request's context ends; the read
	// loop's own frames (Pong, errors for undecodable events) never wait.
	MaxPendingBytes int
	// FrameTimeout bounds the time the rest of a frame may take once the
	// proxy has begun it (default uds.DefaultFrameTimeout, 5s; negative:
	// no bound). A proxy that stalls mid-frame loses the connection instead
	// of holding the agent's reader forever.
	FrameTimeout time.Duration
	// JSONPayloads keeps a connection's payloads JSON even when the proxy
	// offers protobuf_payloads. By default the SDK declares
	// supports_protobuf_payloads, and a proxy that offered the feature
	// (or, on a reverse connection, accepted it) exchanges the AgentMessage
	// of agent.proto instead: less to encode and decode on both ends.
	JSONPayloads bool
	// NoClientRequest keeps the proxy's default view of each request:
	// the request as the proxy forwards it (hop-by-hop and framing
	// headers dropped, forwarding headers added). By default the SDK
	// declares supports_client_request, and a proxy that offers the
	// client_request feature shows handlers the request as the client
	// sent it: the client's header block byte for byte (with the host
	// the route matched), RequestTarget, and what the upstream receives
	// in Metadata (UpstreamHost, ForwardedFor, ForwardedProto,
	// ForwardedHost). Rules written for a web server's view (a WAF's)
	// want the client's.
	NoClientRequest bool
	// NoYieldOnWake keeps the CPU when the proxy's events wake a
	// connection's reader. By default an agent confined to one CPU (the
	// affinity of its main thread when a connection starts: pinned with
	// taskset, a one-CPU cpuset), on Linux, reads what woke it and, when
	// its buffer has room, yields the CPU once (sched_yield) and reads
	// again, so that a proxy sharing that CPU finishes the burst of
	// requests it was handling and their events join the same read: the
	// agent wakes less often and stops preempting its proxy mid-burst.
	// Yields go on while about one in nine finds more events, and are
	// tried on one wake-up in 16 otherwise. An agent that may run on
	// several CPUs never yields: there a yield moves threads between CPUs
	// (measured: one request in flight took 1.5x as long). It applies to
	// the Unix-socket and TCP connections ServeConn serves, not to TLS or
	// reverse connections. Set NoYieldOnWake when the agent's CPU also
	// runs unrelated busy work: a yield hands that work the rest of the
	// agent's time slice. Yields that long (1 ms or more) do not count as
	// paid, so they fall back to one wake-up in 16, but those still delay
	// their batch (docs/operations.md, "Sharing a core with an agent").
	NoYieldOnWake bool
	// Limiter, when set, bounds how many handler calls run at once over
	// the connections it is shared by (see Limiter); events beyond wait
	// for a slot, and those the proxy gave up on meanwhile are dropped.
	// Nil: no bound, every event is handled at once.
	Limiter *Limiter
	// SocketMode is the socket file's permission (default 0660: the proxy's
	// user or group only).
	SocketMode os.FileMode
	// Logger receives connection events (default: none).
	Logger *zerolog.Logger
}

func (o *Options) defaults() Options {
	r := Options{}
	if o != nil {
		r = *o
	}
	if r.Name == "" {
		r.Name = "agent"
	}
	if r.HandshakeTimeout <= 0 {
		r.HandshakeTimeout = 5 * time.Second
	}
	if r.WriteTimeout <= 0 {
		r.WriteTimeout = udswriter.DefaultWriteTimeout
	}
	if r.FrameTimeout == 0 {
		r.FrameTimeout = uds.DefaultFrameTimeout
	}
	if r.SocketMode == 0 {
		r.SocketMode = 0o660
	}
	if r.Logger == nil {
		nop := zerolog.Nop()
		r.Logger = &nop
	}
	return r
}

// ListenUDS listens on a Unix socket at path with mode 0660. A stale socket
// file left by a dead agent is replaced; a live one (something accepts on
// it) or a non-socket file is an error, never deleted. A missing
// directory is ErrSDKSocketDir, naming it; it is not created.
func ListenUDS(path string, opts *Options) (net.Listener, error) {
	o := opts.defaults()
	dir := filepath.Dir(path)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		why := "not a directory"
		if err != nil {
			why = err.Error()
		}
		return nil, fmt.Errorf("%w: %s (for socket %s): %s; create it with the owner and group that may connect", ErrSDKSocketDir, dir, path, why)
	}
	ln, err := unixsock.Listen(path, o.SocketMode)
	if err != nil {
		return nil, fmt.Errorf("sdk: %w", err)
	}
	return ln, nil
}

// ServeUDS listens on path and serves h until ctx ends, then removes the
// socket file (a process killed outright leaves it; the next ListenUDS
// replaces it, as a stale socket).
func ServeUDS(ctx context.Context, path string, h Handler, opts *Options) error {
	ln, err := ListenUDS(path, opts)
	if err != nil {
		return err
	}
	if ul, ok := ln.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(true)
	}
	return Serve(ctx, ln, h, opts)
}

// Serve accepts proxy connections on ln and serves each until ctx ends.
// It closes ln and waits for the connections' handlers before returning.
func Serve(ctx context.Context, ln net.Listener, h Handler, opts *Options) error {
	o := opts.defaults()
	var wg sync.WaitGroup
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	var err error
	for {
		var nc net.Conn
		nc, err = ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				err = nil
			}
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := ServeConn(ctx, nc, h, &o); err != nil && !errors.Is(err, io.EOF) && ctx.Err() == nil {
				o.Logger.Warn().Err(err).Msg("proxy connection ended")
			}
		}()
	}
	_ = ln.Close()
	wg.Wait()
	return err
}

// ServeConn answers the proxy's handshake on nc and then serves h on it
// until the connection or ctx ends.
func ServeConn(ctx context.Context, nc net.Conn, h Handler, opts *Options) error {
	o := opts.defaults()
	nc = rawio.Wrap(nc)
	_ = nc.SetReadDeadline(time.Now().Add(o.HandshakeTimeout))
	fr := uds.NewFrameReader(nc)
	t, payload, err := fr.Next()
	if err != nil {
		_ = nc.Close()
		return fmt.Errorf("%w: %v", ErrSDKHandshake, err)
	}
	if t != protocol.TypeHandshakeRequest {
		_ = nc.Close()
		return fmt.Errorf("%w: first frame has type 0x%02x", ErrSDKHandshake, uint8(t))
	}
	var req protocol.HandshakeRequest
	if err := protocol.DecodeHandshakeRequest(payload, &req); err != nil {
		_ = nc.Close()
		return fmt.Errorf("%w: %v", ErrSDKHandshake, err)
	}
	caps := DeclaredCapabilities(h)
	caps.SupportsProtobufPayloads = !o.JSONPayloads
	if o.NoClientRequest {
		caps.SupportsClientRequest = false
	}
	resp, herr := handshake.Answer(&req, o.Name, caps)
	_ = nc.SetWriteDeadline(time.Now().Add(o.WriteTimeout))
	werr := uds.WriteFrame(nc, &resp)
	_ = nc.SetDeadline(time.Time{})
	if herr != nil || werr != nil {
		_ = nc.Close()
		return fmt.Errorf("%w: %v", ErrSDKHandshake, errors.Join(herr, werr))
	}
	enc := uds.JSON
	if resp.Capabilities.SupportsProtobufPayloads {
		enc = uds.Protobuf
	}
	if rc, ok := nc.(*rawio.Conn); ok && !o.NoYieldOnWake && oneCPU() {
		rc.YieldOnWake()
	}
	return serveFrames(ctx, nc, fr, enc, h, &o)
}

// udsSender answers over a udswriter.Writer: replies are data frames that
// wait for room (bounded by their request's context), agent errors are
// control frames that never wait.
type udsSender struct {
	w   *udswriter.Writer
	enc uds.Encoding
}

func (s udsSender) Send(ctx context.Context, m protocol.Message) error {
	return s.w.SendContext(ctx, m)
}

// queue is Send for a reply made by the read loop while more of the
// proxy's frames are buffered (see queuer): the reply joins the pending
// batch for the writer goroutine instead of being written at once, so the
// replies to a burst of events leave together. When the connection is
// backed up (replies waiting for room, or no room for this one) it is
// Send, which waits for room.
func (s udsSender) queue(ctx context.Context, m protocol.Message) error {
	if err := s.w.Queue(m); !errors.Is(err, udswriter.ErrBackedUp) {
		return err
	}
	return s.w.SendContext(ctx, m)
}

func (s udsSender) SendError(id uint64, reason string) error {
	if s.enc == uds.Protobuf {
		// An AgentMessage with agent_error, in a Decision frame.
		return s.w.SendRaw(protocol.TypeDecision, pbwire.AppendAgentError(make([]byte, 0, 32+len(reason)), id, reason))
	}
	// "error" is not a decision kind the proxy accepts, so its failure
	// policy decides; the reason reaches the proxy's log only.
	b := make([]byte, 0, 96)
	b = append(b, `{"request_id":`...)
	b = strconv.AppendUint(b, id, 10)
	b = append(b, `,"decision":{"error":{"reason":`...)
	b = strconv.AppendQuote(b, reason)
	b = append(b, `}}}`...)
	return s.w.SendRaw(protocol.TypeDecision, b)
}

// serveFrames is the agent's read loop after the handshake or registration.
func serveFrames(ctx context.Context, nc net.Conn, fr *uds.FrameReader, enc uds.Encoding, h Handler, o *Options) error {
	var once sync.Once
	closeConn := func() { once.Do(func() { _ = nc.Close() }) }
	w := udswriter.NewWriter(nc, udswriter.Config{WriteTimeout: o.WriteTimeout, MaxPendingBytes: o.MaxPendingBytes, Encoding: enc}, func(error) { closeConn() })
	out := udsSender{w: w, enc: enc}
	d := NewDispatcher(ctx, h, out)
	d.SetLimiter(o.Limiter)
	stop := context.AfterFunc(ctx, closeConn)
	defer func() {
		stop()
		d.Close()
		w.Close()
		closeConn()
	}()
	// The handshake's read deadline is over: frames are bounded from here.
	fr.SetFrameTimeout(o.FrameTimeout)
	pong := new(protocol.Pong) // encoded before Send returns: reused
	dec := &frameDecoder{enc: enc}
	// The read loop: Serve dispatches the events next returns and may run
	// a lone request's handler in the reading goroutine (see Serve). Its
	// own frames (Pongs, agent errors) only ever queue.
	next := func() (*Event, error) {
		for {
			t, payload, err := fr.Next()
			if err != nil {
				return nil, err
			}
			switch t {
			case protocol.TypeRequestHeaders, protocol.TypeRequestBodyChunk,
				protocol.TypeResponseHeaders, protocol.TypeResponseBodyChunk:
				ev, id, idOK, err := dec.event(t, payload)
				if err == nil {
					return ev, nil
				}
				if !idOK {
					return nil, fmt.Errorf("sdk: undecodable %s without request_id: %w", t, err)
				}
				o.Logger.Warn().Err(err).Uint64("request_id", id).Msg("undecodable event from proxy")
				_ = out.SendError(id, "undecodable event")
			case protocol.TypeCancelRequest:
				if id, ok := dec.cancel(payload); ok {
					d.Cancel(id)
				}
			case protocol.TypeCancelAll:
				d.CancelAll()
			case protocol.TypePing:
				// Queued for the writer goroutine, never written here.
				if dec.ping(payload, (*protocol.Ping)(pong)) {
					_ = w.Send(pong)
				}
			case protocol.TypePong:
			default:
				o.Logger.Debug().Uint8("type", uint8(t)).Msg("skipping frame of unknown type")
			}
		}
	}
	if err := d.Serve(next, fr.Buffered); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

// frameDecoder decodes the payloads of one connection's frames in its
// encoding. With protobuf, each frame carries an AgentMessage whose
// payload field must be the frame type's, and an event is copied into the
// Buffer of its pooled Event, since the decoded fields alias their bytes
// and the frame reader reuses its buffer.
type frameDecoder struct {
	enc uds.Encoding
	f   pbwire.Frame
}

// event decodes an event frame into a pooled Event. On failure it says
// the event's request id when the payload gave it.
func (c *frameDecoder) event(t protocol.MsgType, payload []byte) (ev *Event, id uint64, idOK bool, err error) {
	ev = AcquireEvent()
	if c.enc == uds.JSON {
		if err = ev.Decode(t, payload); err == nil {
			return ev, 0, false, nil
		}
		ReleaseEvent(ev)
		id, idOK = protocol.PeekRequestID(payload)
		return nil, id, idOK, err
	}
	buf := ev.Buffer()
	*buf = append((*buf)[:0], payload...)
	f := &c.f
	f.ParseAs(t, *buf)
	ev.Type = t
	err = f.Err
	if err == nil {
		switch t {
		case protocol.TypeRequestHeaders:
			err = f.DecodeRequestHeaders(&ev.RequestHeaders)
		case protocol.TypeResponseHeaders:
			err = f.DecodeResponseHeaders(&ev.ResponseHeaders)
		default:
			err = f.DecodeBodyChunk(&ev.Chunk)
		}
	}
	if err == nil {
		return ev, 0, false, nil
	}
	ReleaseEvent(ev)
	return nil, f.RequestID, f.RequestID != 0, err
}

// cancel decodes a CancelRequest's request id.
func (c *frameDecoder) cancel(payload []byte) (uint64, bool) {
	var m protocol.CancelRequest
	var ok bool
	if c.enc == uds.JSON {
		ok = m.Decode(payload) == nil
	} else {
		c.f.ParseAs(protocol.TypeCancelRequest, payload)
		ok = c.f.Err == nil && c.f.DecodeCancel(&m) == nil
	}
	return m.RequestID, ok
}

// ping decodes a Ping into p.
func (c *frameDecoder) ping(payload []byte, p *protocol.Ping) bool {
	if c.enc == uds.JSON {
		return p.Decode(payload) == nil
	}
	c.f.ParseAs(protocol.TypePing, payload)
	return c.f.Err == nil && c.f.DecodePing(p) == nil
}
