package grpcclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/zentinelproxy/sidecar/grpcagent/pb"
	"github.com/zentinelproxy/sidecar/handshake"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/grpcwire"
	"github.com/zentinelproxy/sidecar/internal/redial"
	"github.com/zentinelproxy/sidecar/protocol"
)

// More sentinel errors of the proxy side.
var (
	// ErrGRPCNotServing: the agent's HealthCheck says it is not ready.
	ErrGRPCNotServing = errors.New("grpcclient: agent not serving")
	// ErrGRPCCapabilities: GetCapabilities failed or its answer was refused.
	ErrGRPCCapabilities = errors.New("grpcclient: capability negotiation failed")
)

// Client keeps Conns connections to one gRPC agent, each carrying one
// long-lived ProcessStream that multiplexes many requests by request_id;
// it negotiates with GetCapabilities and checks HealthCheck before a
// connection takes requests, reconnects with backoff and hands out
var _ agentmux.Reporter = (*Client)(nil)

// exchanges on the least loaded connection. It implements agentmux.Agent;
// its report (agentmux.Reporter) is its pool's.
type Client struct {
	*agentmux.Pool
	cfg    Config
	conns  []*grpc.ClientConn
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	log    zerolog.Logger

	unknown atomic.Uint64
}

// NewClient validates cfg, reads its TLS files and starts connecting in
// the background; Begin fails with agentmux.ErrAgentUnavailable until a
// connection is up.
func NewClient(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxMessageSize == 0 {
		cfg.MaxMessageSize = grpcwire.MaxMessageSize
	}
	opts, err := dialOptions(&cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Client{
		Pool:   agentmux.NewPool(cfg.Name, "grpc"),
		cfg:    cfg,
		ctx:    ctx,
		cancel: cancel,
		log:    cfg.Logger.With().Str("address", cfg.Address).Logger(),
	}
	if c.conns, err = NewClientConns(cfg.Address, cfg.Conns, opts); err != nil {
		cancel()
		return nil, fmt.Errorf("%w: agent %q: address %q: %v", ErrGRPCConfig, cfg.Name, cfg.Address, err)
	}
	for i := range c.conns {
		c.wg.Add(1)
		go c.maintain(i)
	}
	return c, nil
}

// NewClientConns creates n client connections to address (each one
// HTTP/2 connection, dialled lazily by gRPC), or none: on an error the
// ones already made are closed.
func NewClientConns(address string, n int, opts []grpc.DialOption) ([]*grpc.ClientConn, error) {
	conns := make([]*grpc.ClientConn, 0, n)
	for range n {
		cc, err := grpc.NewClient(address, opts...)
		if err != nil {
			for _, cc := range conns {
				_ = cc.Close()
			}
			return nil, err
		}
		conns = append(conns, cc)
	}
	return conns, nil
}

func dialOptions(cfg *Config) ([]grpc.DialOption, error) {
	opts, err := DialOptions(&cfg.TLS, cfg.MaxMessageSize, cfg.DialTimeout, cfg.BackoffMin, cfg.BackoffMax, cfg.ClientName)
	if err != nil {
		return nil, fmt.Errorf("agent %q: %w", cfg.Name, err)
	}
	if cfg.KeepaliveTime > 0 {
		opts = append(opts, grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:                cfg.KeepaliveTime,
			Timeout:             cfg.KeepaliveTimeout,
			PermitWithoutStream: true,
		}))
	}
	return opts, nil
}

// DialOptions are the options of a connection to an agent, shared by
// transports grpc and ext_proc: credentials from t (its files are read
// now), messages capped at maxMsg both ways, reconnects backing off from
// backoffMin to backoffMax (doubling, with jitter), no transparent
// retries, fixed flow-control windows and user agent ua.
func DialOptions(t *TLSConfig, maxMsg int, dialTimeout, backoffMin, backoffMax time.Duration, ua string) ([]grpc.DialOption, error) {
	creds, err := Credentials(t)
	if err != nil {
		return nil, err
	}
	return DialOptionsWith(creds, maxMsg, dialTimeout, backoffMin, backoffMax, ua), nil
}

// Credentials are t's transport credentials: insecure when TLS is off,
// else TLS with t's files read.
func Credentials(t *TLSConfig) (credentials.TransportCredentials, error) {
	if !t.On() {
		return insecure.NewCredentials(), nil
	}
	tc, err := t.ClientTLS()
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(tc), nil
}

// DialOptionsWith is DialOptions with the transport credentials given
// (a transport that wraps them, as ext_proc's raw sockets do).
func DialOptionsWith(creds credentials.TransportCredentials, maxMsg int, dialTimeout, backoffMin, backoffMax time.Duration, ua string) []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(maxMsg),
			grpc.MaxCallSendMsgSize(maxMsg),
		),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  backoffMin,
				Multiplier: 2,
				Jitter:     0.25,
				MaxDelay:   backoffMax,
			},
			MinConnectTimeout: dialTimeout,
		}),
		// Streams are never replayed: replies are matched by request_id
		// (grpc) or a stream carries one request's exchange (ext_proc), so
		// a transparent retry would only buffer messages.
		grpc.WithDisableRetry(),
		// Fixed flow-control windows turn off gRPC's bandwidth estimator,
		// whose pings would otherwise follow the data of every new stream
		// (see grpcwire.WindowSize).
		grpc.WithInitialWindowSize(grpcwire.WindowSize),
		grpc.WithInitialConnWindowSize(grpcwire.WindowSize),
		grpc.WithUserAgent(ua),
	}
}

// Close stops reconnecting, sends CancelAll on every stream and closes the
// connections.
func (c *Client) Close() error {
	// CancelAll must go out before the streams are canceled.
	err := c.Pool.Close()
	c.cancel()
	c.wg.Wait()
	for _, cc := range c.conns {
		_ = cc.Close()
	}
	return err
}

// UnknownMessages counts stream messages of a type the proxy does not
// expect from an agent (skipped, for forward compatibility).
func (c *Client) UnknownMessages() uint64 { return c.unknown.Load() }

func (c *Client) maintain(slot int) {
	defer c.wg.Done()
	log := c.log.With().Int("conn", slot).Logger()
	cli := pb.NewAgentProcessorV2Client(c.conns[slot])
	redial.Loop(c.ctx, redial.Config{
		Min:    c.cfg.BackoffMin,
		Max:    c.cfg.BackoffMax,
		What:   "agent stream",
		Logger: log,
		OnError: func(err error) {
			if c.ctx.Err() == nil {
				c.SetLastError(err)
			}
		},
	}, func(context.Context) (func() error, error) {
		l, sess, err := c.open(cli)
		if err != nil {
			return nil, err
		}
		return func() error { return c.serve(cli, l, sess, log) }, nil
	})
}

// open negotiates capabilities, checks health and opens the stream.
func (c *Client) open(cli pb.AgentProcessorV2Client) (*link, *agentmux.Session, error) {
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.DialTimeout)
	defer cancel()
	req := handshake.NewRequest(c.cfg.ClientName)
	presp, err := cli.GetCapabilities(ctx, grpcwire.CapabilityRequestToPB(&req))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrGRPCCapabilities, rpcError(err))
	}
	resp := grpcwire.CapabilityResponseFromPB(presp)
	caps, err := handshake.CheckResponse(&req, &resp)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrGRPCCapabilities, err)
	}
	if _, err := c.checkHealth(ctx, cli); err != nil {
		return nil, nil, err
	}
	// Not derived from c.ctx: Close cancels the stream itself, after the
	// CancelAll went out.
	sctx, scancel := context.WithCancel(context.Background())
	stream, err := cli.ProcessStream(sctx, grpc.ForceCodecV2(grpcwire.Codec()))
	if err != nil {
		scancel()
		return nil, nil, fmt.Errorf("%w: open stream: %v", grpcwire.ErrGRPCClosed, rpcError(err))
	}
	l := &link{stream: stream, cancel: scancel}
	// In-flight events plus their cancels bound the queue.
	l.out = grpcwire.NewOutbox(stream.SendMsg, c.cfg.MaxMessageSize, 2*c.cfg.MaxInFlight+64)
	sess := agentmux.NewSession(l, caps, agentmux.SessionConfig{
		Name:           c.cfg.Name,
		MaxInFlight:    c.cfg.MaxInFlight,
		MaxQueue:       c.cfg.MaxQueue,
		MessageTimeout: c.cfg.MessageTimeout,
	})
	return l, sess, nil
}

// checkHealth asks the agent whether it serves; answered is false when the
// RPC itself failed.
func (c *Client) checkHealth(ctx context.Context, cli pb.AgentProcessorV2Client) (answered bool, err error) {
	h, err := cli.HealthCheck(ctx, &pb.HealthRequest{})
	if err != nil {
		return false, fmt.Errorf("%w: health check: %v", ErrGRPCNotServing, rpcError(err))
	}
	if h.GetStatus() != pb.HealthResponse_SERVING {
		return true, fmt.Errorf("%w: %s %q", ErrGRPCNotServing, h.GetStatus(), clip(h.GetMessage()))
	}
	return true, nil
}

// serve runs one stream until it ends and returns why.
func (c *Client) serve(cli pb.AgentProcessorV2Client, l *link, sess *agentmux.Session, log zerolog.Logger) error {
	sendDone := make(chan struct{})
	go func() {
		defer close(sendDone)
		// io.EOF: the stream ended and RecvMsg reports the real reason.
		if err := l.out.Run(); err != nil && !errors.Is(err, io.EOF) {
			l.closeWith(err)
		}
	}()
	c.Add(sess)
	// Close may have run before Add: the session must not outlive it.
	stopClose := context.AfterFunc(c.ctx, func() { _ = l.Close() })
	defer stopClose()
	stopHealth := make(chan struct{})
	healthDone := make(chan struct{})
	go func() {
		defer close(healthDone)
		c.watchHealth(cli, l, sess, stopHealth, log)
	}()
	err := c.readLoop(l, sess, log)
	if why := l.why.Load(); why != nil {
		err = *why // a close we caused explains the end better than Canceled
	}
	if c.ctx.Err() == nil {
		c.SetLastError(err) // before the waiters learn of it
	}
	c.Remove(sess)
	l.closeWith(err)
	sess.Fail(err)
	close(stopHealth)
	<-healthDone
	<-sendDone
	return err
}

// watchHealth polls HealthCheck; when the agent stops serving, the
// connection leaves the rotation, its requests finish (bounded by the
// message timeout) and the stream is closed so that maintain reconnects.
func (c *Client) watchHealth(cli pb.AgentProcessorV2Client, l *link, sess *agentmux.Session, stop <-chan struct{}, log zerolog.Logger) {
	if c.cfg.HealthInterval <= 0 {
		return
	}
	t := time.NewTicker(c.cfg.HealthInterval)
	defer t.Stop()
	fails := 0
	for {
		select {
		case <-stop:
			return
		case <-sess.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(c.ctx, c.cfg.DialTimeout)
		answered, err := c.checkHealth(ctx, cli)
		cancel()
		if err == nil {
			fails = 0
			continue
		}
		fails++
		// A NOT_SERVING answer drains at once; a failing RPC on a stream
		// that still works gets three chances.
		if fails < 3 && !answered {
			continue
		}
		log.Warn().Err(err).Msg("agent not healthy; draining connection")
		c.Remove(sess)
		wait := 2*c.cfg.MessageTimeout + time.Second
		deadline := time.Now().Add(wait)
		for sess.InFlight() > 0 && time.Now().Before(deadline) {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
		l.closeWith(err)
		return
	}
}

func (c *Client) readLoop(l *link, sess *agentmux.Session, log zerolog.Logger) error {
	// Each message is received into the Buf of the spare reply it is
	// decoded into (the decision aliases it), so receiving allocates
	// nothing of ours; Deliver hands the buffer on with the reply.
	var f grpcwire.FrameInto
	r := new(agentmux.Reply)
	for {
		if cap(r.Buf) > 64<<10 {
			r.Buf = nil // one big reply should not stay pinned
		}
		f.Buf = r.Buf[:0]
		err := l.stream.RecvMsg(&f)
		r.Buf = f.Buf
		if err != nil {
			return streamError(err)
		}
		id := f.RequestID
		if f.Err != nil {
			log.Warn().Err(f.Err).Uint64("request_id", id).Msg("undecodable message from agent")
			if id == 0 {
				sess.CountProtocolError()
				continue
			}
			r = sess.DeliverError(r, id, f.Err)
			continue
		}
		switch f.Payload {
		case grpcwire.PayloadDecision:
			l.out.Answered(id)
			r.Type = protocol.TypeDecision
			r.Err = f.DecodeDecision(&r.Decision)
			r = sess.Deliver(r)
		case grpcwire.PayloadBodyMutation:
			l.out.Answered(id)
			r.Type = protocol.TypeBodyMutation
			r.Err = f.DecodeBodyMutation(&r.Mutation)
			r = sess.Deliver(r)
		case grpcwire.PayloadAgentError:
			l.out.Answered(id)
			msg, err := f.AgentError()
			if err == nil {
				err = fmt.Errorf("%w: %q", grpcwire.ErrGRPCAgentError, clip(msg))
			}
			r = sess.DeliverError(r, id, err)
		case grpcwire.PayloadPing:
			// Put only encodes and queues (it never waits: a full queue
			// drops the Pong), so the read loop never blocks on the peer.
			var p protocol.Pong
			if f.DecodePing((*protocol.Ping)(&p)) == nil {
				_ = l.out.Put(&p)
			}
		case grpcwire.PayloadPong:
		default:
			// Forward compatibility: a payload this proxy does not know, or
			// one only a proxy sends, is counted and skipped.
			if c.unknown.Add(1) == 1 {
				log.Warn().Uint64("request_id", id).Uint8("payload", uint8(f.Payload)).Msg("skipping stream message of unexpected type from agent")
			}
		}
	}
}

// streamError explains why a stream's RecvMsg failed.
func streamError(err error) error {
	if err == io.EOF {
		return fmt.Errorf("%w: agent ended the stream", grpcwire.ErrGRPCClosed)
	}
	if status.Code(err) == codes.ResourceExhausted {
		return fmt.Errorf("%w: %v", grpcwire.ErrGRPCMessageTooLarge, rpcError(err))
	}
	return fmt.Errorf("%w: %v", grpcwire.ErrGRPCClosed, rpcError(err))
}

// rpcError shortens a gRPC status error for logs and status pages.
func rpcError(err error) error {
	if s, ok := status.FromError(err); ok {
		return fmt.Errorf("%s: %s", s.Code(), clip(s.Message()))
	}
	return err
}

// link is the proxy side of one ProcessStream: agentmux.Link over a grpcwire.Outbox.
type link struct {
	stream grpc.ClientStream
	out    *grpcwire.Outbox
	cancel context.CancelFunc
	once   sync.Once
	why    atomic.Pointer[error]
}

// Send implements agentmux.Link. The Outbox never waits (its queue is
// bounded by count and fails when full), so w is not needed. An event
// that finds nothing else being sent goes to the stream from the calling
// goroutine when that cannot block (grpcwire.Outbox.SendEvent): the read
// loop reports the answers that prove earlier events were written.
func (l *link) Send(m protocol.Message, _ agentmux.Wait) error {
	return l.out.SendEvent(eventID(m), m)
}

// eventID is the request id of an event.
func eventID(m protocol.Message) uint64 {
	switch m := m.(type) {
	case *protocol.RequestHeaders:
		return m.RequestID
	case *protocol.ResponseHeaders:
		return m.RequestID
	case *protocol.RequestBodyChunk:
		return m.RequestID
	case *protocol.ResponseBodyChunk:
		return m.RequestID
	}
	return 0
}

// SendControl implements agentmux.Link.
func (l *link) SendControl(m protocol.Message) error { return l.out.Put(m) }

// Close implements agentmux.Link: queued messages (such as a CancelAll)
// get a moment to go out, then the stream is canceled.
func (l *link) Close() error {
	l.out.Drain(100 * time.Millisecond)
	l.closeWith(fmt.Errorf("%w by proxy", grpcwire.ErrGRPCClosed))
	return nil
}

func (l *link) closeWith(err error) {
	l.once.Do(func() {
		l.why.Store(&err)
		l.out.Close(err)
		l.cancel()
	})
}

// clip bounds peer-provided text before it reaches logs and errors.
func clip(s string) string {
	if len(s) > 256 {
		return s[:256] + "…"
	}
	return s
}
