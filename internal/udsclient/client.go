package udsclient

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/handshake"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/rawio"
	"github.com/zentinelproxy/sidecar/internal/redial"
	"github.com/zentinelproxy/sidecar/internal/udswriter"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

// ErrUDSConfig: the client configuration is invalid.
var ErrUDSConfig = errors.New("uds: invalid config")

// Connection errors.
var (
	// ErrUDSPingTimeout: the peer sent nothing within the ping timeout.
	ErrUDSPingTimeout = errors.New("uds: peer silent past ping timeout")
	// ErrUDSHandshake: the first frames were not a valid handshake.
	ErrUDSHandshake = errors.New("uds: handshake failed")
)

// Config is the proxy side of one UDS agent.
type Config struct {
	// Name is the agent's configured name.
	Name string
	// Path is the agent's socket.
	Path string
	// Conns is how many connections to keep open. One carries well over
	// 100k decisions/s; more help only when the agent serializes per
	// connection.
	Conns int
	// ClientName is sent in the handshake.
	ClientName string
	// DialTimeout and HandshakeTimeout bound connection setup.
	DialTimeout      time.Duration
	HandshakeTimeout time.Duration
	// MessageTimeout bounds the wait for each reply.
	MessageTimeout time.Duration
	// MaxInFlight caps requests in flight per connection (the agent's
	// max_concurrent_requests lowers it); MaxQueue caps how many wait.
	MaxInFlight int
	MaxQueue    int
	// WriteTimeout bounds each batched write.
	WriteTimeout time.Duration
	// MaxPendingBytes caps the bytes queued or being written per connection
	// (0: udswriter.DefaultMaxPendingBytes, 4 MiB); see LinkConfig.MaxPendingBytes.
	MaxPendingBytes int
	// PingInterval and PingTimeout: liveness of idle connections.
	PingInterval time.Duration
	PingTimeout  time.Duration
	// FrameTimeout bounds the time the rest of a frame may take once the
	// agent has begun it (0: uds.DefaultFrameTimeout); an agent that stalls
	// mid-frame loses the connection, failing the requests on it at once.
	FrameTimeout time.Duration
	// JSONOnly keeps the connections' payloads JSON: protobuf_payloads is
	// not offered in the handshake. By default it is, and an agent that
	// declares supports_protobuf_payloads gets protobuf payloads (the
	// AgentMessage of agent.proto), which cost both ends less to encode
	// and decode.
	JSONOnly bool
	// BackoffMin and BackoffMax bound the reconnect delay (doubling, with jitter).
	BackoffMin time.Duration
	BackoffMax time.Duration
	// Logger receives connection events. It carries the agent field (the
	// factories of internal/transports add it); the transport does not add it.
	Logger zerolog.Logger
}

// Ping liveness of a framed agent connection (a Link), on the UDS and
// reverse transports alike.
const (
	// DefaultPingInterval is how long a connection may be idle before the
	// proxy pings the agent.
	DefaultPingInterval = 5 * time.Second
	// DefaultPingTimeout closes a connection whose agent sent nothing for
	// this long.
	DefaultPingTimeout = 15 * time.Second
)

// DefaultConfig returns a Config with production defaults for the agent
// name at path.
func DefaultConfig(name, path string) Config {
	return Config{
		Name:             name,
		Path:             path,
		Conns:            1,
		ClientName:       "zentinel-sidecar/0.1",
		DialTimeout:      redial.DefaultConnectTimeout,
		HandshakeTimeout: redial.DefaultHandshakeTimeout,
		MessageTimeout:   agentmux.DefaultMessageTimeout,
		MaxInFlight:      agentmux.DefaultMaxInFlight,
		MaxQueue:         agentmux.DefaultMaxQueue,
		WriteTimeout:     udswriter.DefaultWriteTimeout,
		MaxPendingBytes:  udswriter.DefaultMaxPendingBytes,
		PingInterval:     DefaultPingInterval,
		PingTimeout:      DefaultPingTimeout,
		FrameTimeout:     uds.DefaultFrameTimeout,
		BackoffMin:       redial.DefaultMin,
		BackoffMax:       redial.DefaultMax,
		Logger:           zerolog.Nop(),
	}
}

// Validate reports the first invalid field.
func (c *Config) Validate() error {
	switch {
	case c.Name == "":
		return fmt.Errorf("%w: name is empty", ErrUDSConfig)
	case c.Path == "":
		return fmt.Errorf("%w: agent %q: path is empty", ErrUDSConfig, c.Name)
	case len(c.Path) > 107:
		return fmt.Errorf("%w: agent %q: socket path longer than 107 bytes", ErrUDSConfig, c.Name)
	case c.Conns < 1 || c.Conns > 64:
		return fmt.Errorf("%w: agent %q: conns %d not in 1..64", ErrUDSConfig, c.Name, c.Conns)
	case c.MaxInFlight < 1:
		return fmt.Errorf("%w: agent %q: max_in_flight must be positive", ErrUDSConfig, c.Name)
	case c.MaxQueue < 0:
		return fmt.Errorf("%w: agent %q: max_queue must not be negative", ErrUDSConfig, c.Name)
	case c.DialTimeout <= 0 || c.HandshakeTimeout <= 0:
		return fmt.Errorf("%w: agent %q: dial and handshake timeouts must be positive", ErrUDSConfig, c.Name)
	case c.BackoffMin <= 0 || c.BackoffMax < c.BackoffMin:
		return fmt.Errorf("%w: agent %q: backoff must satisfy 0 < min <= max", ErrUDSConfig, c.Name)
	case c.PingInterval > 0 && c.PingTimeout > 0 && c.PingTimeout < c.PingInterval:
		return fmt.Errorf("%w: agent %q: ping_timeout shorter than ping_interval", ErrUDSConfig, c.Name)
	case c.FrameTimeout < 0:
		return fmt.Errorf("%w: agent %q: frame timeout must not be negative", ErrUDSConfig, c.Name)
	case c.MaxPendingBytes < 0:
		return fmt.Errorf("%w: agent %q: max pending bytes must not be negative", ErrUDSConfig, c.Name)
	}
	return nil
}

var _ agentmux.Reporter = (*Client)(nil)

// Client keeps Conns handshaken connections to one agent, reconnecting
// with backoff, and hands out exchanges on the least loaded one. It
// implements agentmux.Agent; its report (agentmux.Reporter) is its
// pool's: connections, in flight, counters, writes and frames.
type Client struct {
	*agentmux.Pool
	cfg    Config
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewClient validates cfg and starts connecting in the background; Begin
// fails with agentmux.ErrAgentUnavailable until a connection is up.
func NewClient(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Client{Pool: agentmux.NewPool(cfg.Name, "uds"), cfg: cfg, ctx: ctx, cancel: cancel}
	for i := 0; i < cfg.Conns; i++ {
		c.wg.Add(1)
		go c.maintain(i)
	}
	return c, nil
}

// Close stops reconnecting, sends CancelAll and closes every connection.
func (c *Client) Close() error {
	c.cancel()
	err := c.Pool.Close()
	c.wg.Wait()
	return err
}

func (c *Client) maintain(slot int) {
	defer c.wg.Done()
	redial.Loop(c.ctx, redial.Config{
		Min:     c.cfg.BackoffMin,
		Max:     c.cfg.BackoffMax,
		What:    "agent connection",
		Logger:  c.cfg.Logger.With().Str("socket", c.cfg.Path).Int("conn", slot).Logger(),
		OnError: c.SetLastError, // kept after a reconnect: it explains the last outage
	}, func(ctx context.Context) (func() error, error) {
		link, caps, err := Dial(ctx, c.cfg)
		if err != nil {
			return nil, err
		}
		sess := agentmux.NewSession(link, caps, agentmux.SessionConfig{
			Name:           c.cfg.Name,
			MaxInFlight:    c.cfg.MaxInFlight,
			MaxQueue:       c.cfg.MaxQueue,
			MessageTimeout: c.cfg.MessageTimeout,
		})
		return func() error {
			c.Add(sess)
			// Close may run before Add: the session must not outlive it.
			stop := context.AfterFunc(ctx, func() { _ = link.Close() })
			err := link.Serve(sess)
			stop()
			c.Remove(sess)
			return err
		}, nil
	})
}

// Dial connects to the agent at cfg.Path and performs the handshake. The
// returned link is not serving yet.
func Dial(ctx context.Context, cfg Config) (*Link, protocol.Capabilities, error) {
	d := net.Dialer{Timeout: cfg.DialTimeout}
	nc, err := d.DialContext(ctx, "unix", cfg.Path)
	if err != nil {
		return nil, protocol.Capabilities{}, err
	}
	nc = rawio.Wrap(nc)
	fr, caps, err := Handshake(nc, cfg.ClientName, cfg.HandshakeTimeout, !cfg.JSONOnly)
	if err != nil {
		_ = nc.Close()
		return nil, protocol.Capabilities{}, err
	}
	enc := uds.JSON
	if caps.SupportsProtobufPayloads {
		enc = uds.Protobuf
	}
	link := NewLink(nc, LinkConfig{
		Name:            cfg.Name,
		WriteTimeout:    cfg.WriteTimeout,
		MaxPendingBytes: cfg.MaxPendingBytes,
		PingInterval:    cfg.PingInterval,
		PingTimeout:     cfg.PingTimeout,
		FrameTimeout:    cmp.Or(cfg.FrameTimeout, uds.DefaultFrameTimeout),
		Reader:          fr,
		Encoding:        enc,
		Logger:          cfg.Logger,
	})
	return link, caps, nil
}

// ClientHandshake sends the proxy's HandshakeRequest on nc and checks the
// answer within timeout. The returned reader continues the connection. It
// does not offer protobuf_payloads: the connection stays JSON.
func ClientHandshake(nc net.Conn, clientName string, timeout time.Duration) (*uds.FrameReader, protocol.Capabilities, error) {
	return Handshake(nc, clientName, timeout, false)
}

// Handshake is ClientHandshake, offering protobuf_payloads when protobuf
// is set: the payloads after it are protobuf exactly when the returned
// capabilities say SupportsProtobufPayloads.
func Handshake(nc net.Conn, clientName string, timeout time.Duration, protobuf bool) (*uds.FrameReader, protocol.Capabilities, error) {
	_ = nc.SetDeadline(time.Now().Add(timeout))
	defer func() { _ = nc.SetDeadline(time.Time{}) }()
	req := handshake.NewRequest(clientName)
	if protobuf {
		req = handshake.NewRequestWith(clientName, protocol.FeatureProtobufPayloads)
	}
	if err := uds.WriteFrame(nc, &req); err != nil {
		return nil, protocol.Capabilities{}, fmt.Errorf("%w: send: %v", ErrUDSHandshake, err)
	}
	fr := uds.NewFrameReader(nc)
	t, payload, err := fr.Next()
	if err != nil {
		return nil, protocol.Capabilities{}, fmt.Errorf("%w: read: %v", ErrUDSHandshake, err)
	}
	if t != protocol.TypeHandshakeResponse {
		return nil, protocol.Capabilities{}, fmt.Errorf("%w: expected HandshakeResponse, got type 0x%02x", ErrUDSHandshake, uint8(t))
	}
	var resp protocol.HandshakeResponse
	if err := protocol.DecodeHandshakeResponse(payload, &resp); err != nil {
		return nil, protocol.Capabilities{}, fmt.Errorf("%w: %v", ErrUDSHandshake, err)
	}
	caps, err := handshake.CheckResponse(&req, &resp)
	if err != nil {
		return nil, protocol.Capabilities{}, fmt.Errorf("%w: %v", ErrUDSHandshake, err)
	}
	return fr, caps, nil
}
