package grpcclient

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/grpcwire"
	"github.com/zentinelproxy/sidecar/internal/redial"
)

// ErrGRPCConfig: the client configuration is invalid.
var ErrGRPCConfig = errors.New("grpcclient: invalid config")

// TLSConfig secures the connection to the agent. The zero value is
// plaintext (loopback and trusted networks only).
type TLSConfig struct {
	// Enabled turns TLS on; setting CAFile or CertFile implies it.
	Enabled bool
	// CAFile is a PEM bundle of the CAs the agent's certificate must chain
	// to (empty: the system roots).
	CAFile string
	// CertFile and KeyFile are the proxy's client certificate for mTLS.
	CertFile string
	KeyFile  string
	// ServerName overrides the name checked in the agent's certificate
	// (default: the host of Address).
	ServerName string
}

// On reports whether TLS is used.
func (t *TLSConfig) On() bool { return t.Enabled || t.CAFile != "" || t.CertFile != "" }

// TLSOptions are the transport options (config agents[].options) that
// TLSConfig.ApplyOption reads.
var TLSOptions = []string{"tls", "tls_ca_file", "tls_cert_file", "tls_key_file", "tls_server_name"}

// ApplyOption sets the field of transport option k (one of TLSOptions)
// to v; ok is false, and t unchanged, when k is not a TLS option.
func (t *TLSConfig) ApplyOption(k, v string) (ok bool, err error) {
	switch k {
	case "tls":
		t.Enabled, err = strconv.ParseBool(v)
	case "tls_ca_file":
		t.CAFile = v
	case "tls_cert_file":
		t.CertFile = v
	case "tls_key_file":
		t.KeyFile = v
	case "tls_server_name":
		t.ServerName = v
	default:
		return false, nil
	}
	return true, err
}

// Config is the proxy side of one gRPC agent.
type Config struct {
	// Name is the agent's configured name.
	Name string
	// Address is the agent's host:port (any gRPC target, such as
	// "unix:///run/agent.sock", also works).
	Address string
	// Conns is how many connections (each with one ProcessStream) to keep.
	Conns int
	// ClientName is sent in the CapabilityRequest.
	ClientName string
	// DialTimeout bounds connecting plus GetCapabilities and HealthCheck.
	DialTimeout time.Duration
	// MessageTimeout bounds the wait for each reply.
	MessageTimeout time.Duration
	// MaxInFlight caps requests in flight per connection (the agent's
	// max_concurrent_requests lowers it); MaxQueue caps how many wait.
	MaxInFlight int
	MaxQueue    int
	// HealthInterval is how often HealthCheck is polled on a live
	// connection (0: only before use). A NOT_SERVING answer takes the
	// connection out of rotation, lets its requests finish and reconnects.
	HealthInterval time.Duration
	// KeepaliveTime and KeepaliveTimeout: HTTP/2 pings on idle connections.
	KeepaliveTime    time.Duration
	KeepaliveTimeout time.Duration
	// BackoffMin and BackoffMax bound the reconnect delay (doubling, with jitter).
	BackoffMin time.Duration
	BackoffMax time.Duration
	// MaxMessageSize caps messages both ways (at most 10 MiB, the default).
	MaxMessageSize int
	// TLS secures the connection.
	TLS TLSConfig
	// Logger receives connection events. It carries the agent field (the
	// factories of internal/transports add it); the transport does not add it.
	Logger zerolog.Logger
}

// DefaultConfig returns a Config with production defaults for the agent
// name at address.
func DefaultConfig(name, address string) Config {
	return Config{
		Name:             name,
		Address:          address,
		Conns:            1,
		ClientName:       "zentinel-sidecar/0.1",
		DialTimeout:      redial.DefaultConnectTimeout + redial.DefaultHandshakeTimeout,
		MessageTimeout:   agentmux.DefaultMessageTimeout,
		MaxInFlight:      agentmux.DefaultMaxInFlight,
		MaxQueue:         agentmux.DefaultMaxQueue,
		HealthInterval:   10 * time.Second,
		KeepaliveTime:    30 * time.Second,
		KeepaliveTimeout: 10 * time.Second,
		BackoffMin:       redial.DefaultMin,
		BackoffMax:       redial.DefaultMax,
		MaxMessageSize:   grpcwire.MaxMessageSize,
		Logger:           zerolog.Nop(),
	}
}

// Validate reports the first invalid field.
func (c *Config) Validate() error {
	switch {
	case c.Name == "":
		return fmt.Errorf("%w: name is empty", ErrGRPCConfig)
	case c.Address == "":
		return fmt.Errorf("%w: agent %q: address is empty", ErrGRPCConfig, c.Name)
	case c.Conns < 1 || c.Conns > 64:
		return fmt.Errorf("%w: agent %q: conns %d not in 1..64", ErrGRPCConfig, c.Name, c.Conns)
	case c.MaxInFlight < 1:
		return fmt.Errorf("%w: agent %q: max_in_flight must be positive", ErrGRPCConfig, c.Name)
	case c.MaxQueue < 0:
		return fmt.Errorf("%w: agent %q: max_queue must not be negative", ErrGRPCConfig, c.Name)
	case c.DialTimeout <= 0:
		return fmt.Errorf("%w: agent %q: dial timeout must be positive", ErrGRPCConfig, c.Name)
	case c.MessageTimeout < 0 || c.HealthInterval < 0:
		return fmt.Errorf("%w: agent %q: timeouts must not be negative", ErrGRPCConfig, c.Name)
	case c.BackoffMin <= 0 || c.BackoffMax < c.BackoffMin:
		return fmt.Errorf("%w: agent %q: backoff must satisfy 0 < min <= max", ErrGRPCConfig, c.Name)
	case c.KeepaliveTime < 0 || c.KeepaliveTimeout < 0:
		return fmt.Errorf("%w: agent %q: keepalive must not be negative", ErrGRPCConfig, c.Name)
	case c.KeepaliveTime > 0 && c.KeepaliveTime < 10*time.Second:
		// gRPC raises shorter intervals to 10s; say so instead of surprising.
		return fmt.Errorf("%w: agent %q: keepalive_time below 10s", ErrGRPCConfig, c.Name)
	case c.MaxMessageSize < 0 || c.MaxMessageSize > grpcwire.MaxMessageSize:
		return fmt.Errorf("%w: agent %q: max_message_size not in 0..%d", ErrGRPCConfig, c.Name, grpcwire.MaxMessageSize)
	case (c.TLS.CertFile == "") != (c.TLS.KeyFile == ""):
		return fmt.Errorf("%w: agent %q: tls cert_file and key_file go together", ErrGRPCConfig, c.Name)
	case !c.TLS.On() && c.TLS.ServerName != "":
		return fmt.Errorf("%w: agent %q: tls server_name without tls", ErrGRPCConfig, c.Name)
	}
	return nil
}

// ClientTLS builds the client-side tls.Config of t, reading its files.
func (t *TLSConfig) ClientTLS() (*tls.Config, error) {
	// An empty ServerName makes gRPC check the host of the target.
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%w: tls ca_file: %v", ErrGRPCConfig, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: tls ca_file %s holds no PEM certificate", ErrGRPCConfig, t.CAFile)
		}
		tc.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: tls client certificate: %v", ErrGRPCConfig, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
