package sdk

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/handshake"
	"github.com/zentinelproxy/sidecar/internal/redial"
	"github.com/zentinelproxy/sidecar/internal/udswriter"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

// Errors of reverse connections.
var (
	// ErrSDKReverseConfig: the ReverseConfig is invalid.
	ErrSDKReverseConfig = errors.New("sdk: invalid reverse config")
	// ErrSDKRegistration: the proxy refused the registration or answered
	// with something else than a RegistrationResponse.
	ErrSDKRegistration = errors.New("sdk: registration failed")
)

// ReverseConfig configures DialAndServe: the agent dials the proxy,
// registers, and then serves the proxy's requests on that connection.
type ReverseConfig struct {
	// Network is "unix" or "tcp". Empty: "unix" when Address contains a
	// '/', "tcp" otherwise.
	Network string
	// Address is the proxy's reverse listener (socket path or host:port).
	Address string
	// AgentID identifies this instance ("waf-1"); the proxy maps it to an
	// agent pool by its configured id patterns.
	AgentID string
	// Token is sent as auth_token. TokenFile, when set, is read instead at
	// every connection attempt, so a rotated token is picked up.
	Token     string
	TokenFile string
	// TLS, when set, wraps the connection; set Certificates for mTLS and
	// RootCAs/ServerName to verify the proxy (see LoadClientTLS).
	TLS *tls.Config
	// Metadata is a JSON object sent as the registration's metadata (nil:
	// none).
	Metadata []byte
	// Conns is how many connections this instance keeps (default 1).
	Conns int
	// DialTimeout bounds connecting, TLS included (default 5s);
	// RegistrationTimeout bounds the wait for the proxy's answer (default
	// 10s: a proxy holds back its answer to a peer with recent
	// authentication failures).
	DialTimeout         time.Duration
	RegistrationTimeout time.Duration
	// BackoffMin and BackoffMax bound the reconnect delay, which doubles
	// with each failed attempt and carries ±25% jitter (defaults 100ms and
	// 30s). A refusal that retrying cannot fix (authentication failed,
	// unknown agent, version, invalid registration) waits BackoffMax.
	BackoffMin time.Duration
	BackoffMax time.Duration
	// IdleTimeout closes a connection on which the proxy sent nothing for
	// this long (0: off). The proxy pings idle connections (every 5s by
	// default), so three times its ping interval finds a dead proxy behind
	// a NAT that dropped the flow silently.
	IdleTimeout time.Duration
	// WriteTimeout bounds each batched write (default 5s).
	WriteTimeout time.Duration
	// MaxPendingBytes caps the bytes of a connection queued or being written
	// (default 4 MiB); see Options.MaxPendingBytes.
	MaxPendingBytes int
	// FrameTimeout bounds the time the rest of a frame may take once the
	// proxy has begun it (default uds.DefaultFrameTimeout, 5s; negative:
	// no bound); a stall ends the connection, which is then redialed.
	FrameTimeout time.Duration
	// JSONPayloads keeps the connection's payloads JSON: the registration
	// does not declare supports_protobuf_payloads (see Options.JSONPayloads).
	JSONPayloads bool
	// Limiter, when set, bounds how many handler calls run at once (see
	// Options.Limiter); share one with the agent's other transports.
	Limiter *Limiter
	// NoClientRequest: the registration does not declare
	// supports_client_request (see Options.NoClientRequest).
	NoClientRequest bool
	// OnRegistered, when set, is called with the proxy-assigned connection
	// id after each accepted registration.
	OnRegistered func(assignedID string)
	// Logger receives connection events (default: none). The token is
	// never logged.
	Logger *zerolog.Logger
}

func (c *ReverseConfig) validate() error {
	if c.Network == "" {
		c.Network = "tcp"
		if strings.Contains(c.Address, "/") {
			c.Network = "unix"
		}
	}
	if c.Conns <= 0 {
		c.Conns = 1
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.RegistrationTimeout <= 0 {
		c.RegistrationTimeout = 10 * time.Second
	}
	if c.BackoffMin <= 0 {
		c.BackoffMin = 100 * time.Millisecond
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = 30 * time.Second
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = udswriter.DefaultWriteTimeout
	}
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	switch {
	case c.Network != "unix" && c.Network != "tcp":
		return fmt.Errorf("%w: network %q is neither unix nor tcp", ErrSDKReverseConfig, c.Network)
	case c.Address == "":
		return fmt.Errorf("%w: address is empty", ErrSDKReverseConfig)
	case c.AgentID == "":
		return fmt.Errorf("%w: agent id is empty", ErrSDKReverseConfig)
	case c.Conns > 64:
		return fmt.Errorf("%w: conns %d above 64", ErrSDKReverseConfig, c.Conns)
	case c.BackoffMax < c.BackoffMin:
		return fmt.Errorf("%w: backoff max below min", ErrSDKReverseConfig)
	case c.Token != "" && c.TokenFile != "":
		return fmt.Errorf("%w: both token and token file set", ErrSDKReverseConfig)
	}
	if c.Metadata != nil && (!json.Valid(c.Metadata) || !bytes.HasPrefix(bytes.TrimSpace(c.Metadata), []byte("{"))) {
		return fmt.Errorf("%w: metadata is not a JSON object", ErrSDKReverseConfig)
	}
	if c.TokenFile != "" {
		if _, err := readToken(c.TokenFile); err != nil {
			return fmt.Errorf("%w: %v", ErrSDKReverseConfig, err)
		}
	}
	return nil
}

func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token file: %v", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	return t, nil
}

// LoadClientTLS builds a client TLS config: caFile verifies the proxy
// (empty: the system roots), certFile/keyFile are the agent's certificate
// for mTLS (empty: none), serverName overrides the name checked in the
// proxy's certificate.
func LoadClientTLS(caFile, certFile, keyFile, serverName string) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("%w: ca: %v", ErrSDKReverseConfig, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: ca %s: no PEM certificate", ErrSDKReverseConfig, caFile)
		}
		tc.RootCAs = pool
	}
	if certFile != "" || keyFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: client certificate: %v", ErrSDKReverseConfig, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// DialAndServe connects to the proxy's reverse listener, registers as
// cfg.AgentID and serves h on the connection, reconnecting with backoff
// and jitter whenever it ends, until ctx is done. It returns nil then, and
// an error at once only for an invalid cfg.
func DialAndServe(ctx context.Context, cfg ReverseConfig, h Handler) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	var wg sync.WaitGroup
	for i := 0; i < cfg.Conns; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reverseLoop(ctx, &cfg, h, i)
		}()
	}
	wg.Wait()
	return nil
}

func reverseLoop(ctx context.Context, cfg *ReverseConfig, h Handler, slot int) {
	log := cfg.Logger.With().Str("proxy", cfg.Address).Str("agent_id", cfg.AgentID).Int("conn", slot).Logger()
	o := Options{Name: cfg.AgentID, WriteTimeout: cfg.WriteTimeout, MaxPendingBytes: cfg.MaxPendingBytes, FrameTimeout: cfg.FrameTimeout, Limiter: cfg.Limiter, Logger: &log}
	redial.Loop(ctx, redial.Config{Min: cfg.BackoffMin, Max: cfg.BackoffMax, What: "reverse connection", Logger: log},
		func(ctx context.Context) (func() error, error) {
			nc, fr, assigned, enc, err := dialRegister(ctx, cfg, h)
			if err != nil {
				if permanentRefusal(err) {
					// Retrying soon cannot help, but the proxy's config may
					// change: keep trying at the slowest pace, loudly.
					return nil, fmt.Errorf("%w (check agent id and token): %w", redial.ErrPermanent, err)
				}
				return nil, err
			}
			log.Info().Str("conn_id", assigned).Msg("registered with proxy")
			nc.idle = cfg.IdleTimeout
			return func() error { return serveFrames(ctx, nc, fr, enc, h, &o) }, nil
		})
}

// dialRegister connects and registers; the returned reader continues the
// connection after the RegistrationResponse.
func dialRegister(ctx context.Context, cfg *ReverseConfig, h Handler) (*idleConn, *uds.FrameReader, string, uds.Encoding, error) {
	token := cfg.Token
	if cfg.TokenFile != "" {
		t, err := readToken(cfg.TokenFile)
		if err != nil {
			return nil, nil, "", 0, err
		}
		token = t
	}
	dctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	var raw net.Conn
	var err error
	if cfg.TLS != nil {
		d := tls.Dialer{NetDialer: &net.Dialer{}, Config: cfg.TLS}
		raw, err = d.DialContext(dctx, cfg.Network, cfg.Address)
	} else {
		var d net.Dialer
		raw, err = d.DialContext(dctx, cfg.Network, cfg.Address)
	}
	if err != nil {
		return nil, nil, "", 0, err
	}
	// The frame reader must read through the wrapper, so that the idle
	// timeout (set once registered) covers the serving reads.
	nc := &idleConn{Conn: raw}
	stop := context.AfterFunc(ctx, func() { _ = nc.Close() })
	defer stop()
	_ = nc.SetDeadline(time.Now().Add(cfg.RegistrationTimeout))
	caps := DeclaredCapabilities(h)
	caps.SupportsProtobufPayloads = !cfg.JSONPayloads
	if cfg.NoClientRequest {
		caps.SupportsClientRequest = false
	}
	req := protocol.RegistrationRequest{
		ProtocolVersion: protocol.Version,
		AgentID:         cfg.AgentID,
		Capabilities:    caps,
		AuthToken:       token,
		Metadata:        cfg.Metadata,
	}
	if err := uds.WriteFrame(nc, &req); err != nil {
		_ = nc.Close()
		return nil, nil, "", 0, fmt.Errorf("%w: send: %v", ErrSDKRegistration, err)
	}
	fr := uds.NewFrameReader(nc)
	t, payload, err := fr.Next()
	if err != nil {
		_ = nc.Close()
		return nil, nil, "", 0, fmt.Errorf("%w: read answer: %v", ErrSDKRegistration, err)
	}
	if t != protocol.TypeRegistrationResponse && t != protocol.TypeHandshakeResponse {
		_ = nc.Close()
		return nil, nil, "", 0, fmt.Errorf("%w: expected RegistrationResponse, got type 0x%02x", ErrSDKRegistration, uint8(t))
	}
	var resp protocol.RegistrationResponse
	if err := protocol.DecodeRegistrationResponse(payload, &resp); err != nil {
		_ = nc.Close()
		return nil, nil, "", 0, fmt.Errorf("%w: %v", ErrSDKRegistration, err)
	}
	if err := handshake.CheckRegistrationResponse(&resp); err != nil {
		_ = nc.Close()
		return nil, nil, "", 0, fmt.Errorf("%w: %w", ErrSDKRegistration, err)
	}
	protobuf, err := handshake.RegistrationProtobuf(&resp, caps.SupportsProtobufPayloads)
	if err != nil {
		_ = nc.Close()
		return nil, nil, "", 0, fmt.Errorf("%w: %w", ErrSDKRegistration, err)
	}
	enc := uds.JSON
	if protobuf {
		enc = uds.Protobuf
	}
	_ = nc.SetDeadline(time.Time{})
	if cfg.OnRegistered != nil {
		cfg.OnRegistered(resp.AssignedID)
	}
	return nc, fr, resp.AssignedID, enc, nil
}

// permanentRefusal reports a refusal that only a configuration change on
// either side can fix.
func permanentRefusal(err error) bool {
	if !errors.Is(err, handshake.ErrHandshakeRefused) {
		return false
	}
	s := err.Error()
	for _, r := range []string{"authentication failed", "unknown agent", "unsupported protocol version", "invalid registration"} {
		if strings.Contains(s, r) {
			return true
		}
	}
	return false
}

// idleConn fails a read when the proxy sent nothing for idle (0: off).
// The frame reader's deadline for a started frame (set through
// SetReadDeadline) is kept when it is the earlier one. Only the one
// reading goroutine touches idle and frame.
type idleConn struct {
	net.Conn
	idle  time.Duration
	frame time.Time
}

func (c *idleConn) SetReadDeadline(t time.Time) error {
	c.frame = t
	return c.Conn.SetReadDeadline(t)
}

func (c *idleConn) Read(p []byte) (int, error) {
	if c.idle > 0 {
		d := time.Now().Add(c.idle)
		if !c.frame.IsZero() && c.frame.Before(d) {
			d = c.frame
		}
		_ = c.Conn.SetReadDeadline(d)
	}
	return c.Conn.Read(p)
}
