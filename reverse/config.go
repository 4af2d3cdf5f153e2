package reverse

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/internal/udswriter"
	"github.com/zentinelproxy/sidecar/uds"
)

// Config configures a Listener.
type Config struct {
	// UnixPath is a Unix socket path agents dial ("" for none). A stale
	// socket file left by a previous run is removed; any other file there
	// is an error.
	UnixPath string
	// UnixMode is the permission of the socket file (default 0660): on a
	// Unix socket the file system decides who may dial at all.
	UnixMode os.FileMode
	// TCPAddr is a host:port agents dial ("" for none).
	TCPAddr string
	// TLS, when set, wraps the TCP listener (not the Unix one, which the
	// file system protects).
	TLS *TLSConfig

	// Agents are the agents that may register. A connection joins the
	// first agent, in this order, one of whose IDs patterns matches its
	// agent_id.
	Agents []AgentConfig

	// RegistrationTimeout bounds the time from accept to a complete
	// RegistrationRequest (default 5s).
	RegistrationTimeout time.Duration
	// MaxRegistrationSize bounds the first frame (default 64 KiB; a
	// registration is small, the 16 MiB frame limit is for traffic).
	MaxRegistrationSize int
	// MaxPending bounds connections accepted but not yet registered
	// (default 128), MaxPendingPerPeer those of one peer (default 16; an
	// IPv4 address, an IPv6 /64, a Unix user; at most MaxPending). A connection that arrives
	// at a limit is not turned away: the connection of its scope that has
	// waited longest without sending a byte is closed to make room, else
	// the oldest still receiving its registration (counted as evicted);
	// see admission. Refused connections do not count (see MaxRefusing).
	MaxPending        int
	MaxPendingPerPeer int
	// MaxRefusing bounds the refused connections held open at once, their
	// answer held back by the failure slow-down or being drained (default
	// 256). Beyond it a refusal is not held: one that was to wait is
	// closed without an answer, one answered at once is not drained
	// (counted as unheld).
	MaxRefusing int
	// MaxConnsPerID bounds the live connections of one agent_id (default
	// 8): an instance may open several for throughput, a registration
	// beyond the limit is refused with "too many connections for agent id".
	MaxConnsPerID int
	// MaxConnsPerAgent bounds the live connections of one configured agent
	// over all its ids (default 256).
	MaxConnsPerAgent int

	// MaxInFlight is the proxy's in-flight limit per connection (default
	// 256); an agent's max_concurrent_requests lowers it when smaller.
	MaxInFlight int
	// MaxQueue is how many requests may wait for a slot per connection
	// (default 1024).
	MaxQueue int
	// MessageTimeout bounds the wait for each reply (default 1s).
	MessageTimeout time.Duration
	// WriteTimeout bounds each batched write to an agent (default 5s).
	WriteTimeout time.Duration
	// MaxPendingBytes caps the bytes queued or being written per agent
	// connection (0: 4 MiB); see udsclient.LinkConfig.MaxPendingBytes.
	MaxPendingBytes int
	// PingInterval is how long a connection may be idle before the proxy
	// pings the agent (default 5s); PingTimeout closes a connection whose
	// agent sent nothing for that long (default 15s). Together they find a
	// dead agent behind a NAT that dropped the flow without a reset.
	PingInterval time.Duration
	PingTimeout  time.Duration
	// NoPing turns Ping liveness off.
	NoPing bool
	// FrameTimeout bounds the time the rest of a frame may take once an
	// agent has begun it (default uds.DefaultFrameTimeout, 5s); an agent
	// that stalls mid-frame loses the connection at once instead of holding
	// every request on it until the ping timeout.
	FrameTimeout time.Duration

	// FailureDelay is how long a refusal is held back after the first
	// authentication failure (unknown agent_id or wrong token) of the same
	// (peer, agent_id) (default 200ms); it doubles with each further
	// failure up to MaxFailureDelay (default 2s, below the SDK's
	// registration timeout so that a held-back answer still arrives). Only
	// refusals wait: a registration with a valid token is answered at
	// once, whatever failed before it from the same address.
	FailureDelay    time.Duration
	MaxFailureDelay time.Duration
	// FailureMemory is how long failures are remembered after the last
	// one of their (peer, agent_id) (default 10m). A successful
	// registration does not reset them.
	FailureMemory time.Duration
	// MaxTrackedPeers bounds the failure table's (peer, agent_id) entries
	// (default 4096). When it is full, keys not yet in it share one more
	// entry, so that many addresses or ids cannot buy many fresh budgets.
	MaxTrackedPeers int
}

// AgentConfig is one agent name that reverse connections can register into.
type AgentConfig struct {
	// Name is the agent's configured name: the pool routes refer to.
	Name string
	// IDs are the agent_id patterns admitted into this agent, in path.Match
	// syntax ("waf-1", "waf-*", "waf-[0-9]"; "*" does not match "/").
	// Empty means {Name, Name+"-*"}.
	IDs []string
	// Tokens are accepted auth tokens (several during a rotation).
	Tokens []string
	// TokenEnv names an environment variable holding one more token.
	TokenEnv string
	// TokenFile is a file holding one more token (surrounding white space
	// is trimmed).
	TokenFile string
	// AllowNoToken admits registrations without any token. It must be set
	// explicitly when no token source is configured; meant for Unix
	// sockets whose file mode already restricts who can dial.
	AllowNoToken bool

	// MaxInFlight, MaxQueue and MessageTimeout override the listener's
	// per-connection values for this agent's connections (0: inherit).
	MaxInFlight    int
	MaxQueue       int
	MessageTimeout time.Duration
	// FrameTimeout overrides the listener's FrameTimeout for this agent's
	// connections (0: inherit; Validate fills it in).
	FrameTimeout time.Duration
	// JSONOnly refuses protobuf payloads to this agent's connections: a
	// registration that declares supports_protobuf_payloads is answered
	// without payload_encoding, so the connection stays JSON.
	JSONOnly bool
	// MaxPending overrides the listener's MaxPendingBytes for this agent's
	// connections (0: inherit; Validate fills it in).
	MaxPending int
}

// TLSConfig enables TLS on the TCP listener.
type TLSConfig struct {
	// CertFile and KeyFile are the proxy's certificate and key (PEM).
	CertFile string
	KeyFile  string
	// ClientCAFile, when set, requires every agent to present a client
	// certificate signed by one of these CAs (mTLS).
	ClientCAFile string
}

// Config errors. Wrapped with details; test with errors.Is.
var (
	// ErrReverseConfig: the configuration is invalid.
	ErrReverseConfig = errors.New("reverse: invalid config")
)

// DefaultConfig returns a Config with every limit set and no listener or
// agent configured.
func DefaultConfig() Config {
	return Config{
		UnixMode:            0o660,
		RegistrationTimeout: 5 * time.Second,
		MaxRegistrationSize: 64 << 10,
		MaxPending:          128,
		MaxPendingPerPeer:   16,
		MaxRefusing:         256,
		MaxConnsPerID:       8,
		MaxConnsPerAgent:    256,
		MaxInFlight:         256,
		MaxQueue:            agentmux.DefaultMaxQueue,
		MessageTimeout:      agentmux.DefaultMessageTimeout,
		WriteTimeout:        udswriter.DefaultWriteTimeout,
		PingInterval:        udsclient.DefaultPingInterval,
		PingTimeout:         udsclient.DefaultPingTimeout,
		FrameTimeout:        uds.DefaultFrameTimeout,
		FailureDelay:        200 * time.Millisecond,
		MaxFailureDelay:     2 * time.Second,
		FailureMemory:       10 * time.Minute,
		MaxTrackedPeers:     4096,
	}
}

// Validate fills zero limits with their defaults and checks the rest.
func (c *Config) Validate() error {
	d := DefaultConfig()
	if c.UnixMode == 0 {
		c.UnixMode = d.UnixMode
	}
	setDur(&c.RegistrationTimeout, d.RegistrationTimeout)
	setInt(&c.MaxRegistrationSize, d.MaxRegistrationSize)
	setInt(&c.MaxPending, d.MaxPending)
	setInt(&c.MaxPendingPerPeer, d.MaxPendingPerPeer)
	setInt(&c.MaxRefusing, d.MaxRefusing)
	setInt(&c.MaxConnsPerID, d.MaxConnsPerID)
	setInt(&c.MaxConnsPerAgent, d.MaxConnsPerAgent)
	setInt(&c.MaxInFlight, d.MaxInFlight)
	setInt(&c.MaxQueue, d.MaxQueue)
	setDur(&c.MessageTimeout, d.MessageTimeout)
	setDur(&c.WriteTimeout, d.WriteTimeout)
	setDur(&c.PingInterval, d.PingInterval)
	setDur(&c.PingTimeout, d.PingTimeout)
	setDur(&c.FrameTimeout, d.FrameTimeout)
	setDur(&c.FailureDelay, d.FailureDelay)
	setDur(&c.MaxFailureDelay, d.MaxFailureDelay)
	setDur(&c.FailureMemory, d.FailureMemory)
	setInt(&c.MaxTrackedPeers, d.MaxTrackedPeers)

	if c.UnixPath == "" && c.TCPAddr == "" {
		return fmt.Errorf("%w: neither unix_path nor tcp_addr is set", ErrReverseConfig)
	}
	if c.TLS != nil {
		if c.TCPAddr == "" {
			return fmt.Errorf("%w: tls needs tcp_addr", ErrReverseConfig)
		}
		if c.TLS.CertFile == "" || c.TLS.KeyFile == "" {
			return fmt.Errorf("%w: tls needs cert_file and key_file", ErrReverseConfig)
		}
	}
	if c.MaxRegistrationSize > 1<<20 {
		return fmt.Errorf("%w: max_registration_size %d above 1 MiB", ErrReverseConfig, c.MaxRegistrationSize)
	}
	// A peer's share cannot exceed the whole (max_pending set below the
	// default share is not an error).
	c.MaxPendingPerPeer = min(c.MaxPendingPerPeer, c.MaxPending)
	if c.MaxConnsPerID > c.MaxConnsPerAgent {
		return fmt.Errorf("%w: max_conns_per_id %d above max_conns_per_agent %d", ErrReverseConfig, c.MaxConnsPerID, c.MaxConnsPerAgent)
	}
	if c.PingTimeout < c.PingInterval {
		return fmt.Errorf("%w: ping_timeout shorter than ping_interval", ErrReverseConfig)
	}
	if c.MaxFailureDelay < c.FailureDelay {
		return fmt.Errorf("%w: max_failure_delay below failure_delay", ErrReverseConfig)
	}
	if len(c.Agents) == 0 {
		return fmt.Errorf("%w: no agents", ErrReverseConfig)
	}
	seen := make(map[string]bool, len(c.Agents))
	for i := range c.Agents {
		a := &c.Agents[i]
		if a.Name == "" {
			return fmt.Errorf("%w: agents[%d]: empty name", ErrReverseConfig, i)
		}
		if seen[a.Name] {
			return fmt.Errorf("%w: agent %q configured twice", ErrReverseConfig, a.Name)
		}
		seen[a.Name] = true
		if a.MaxInFlight < 0 || a.MaxQueue < 0 || a.MessageTimeout < 0 || a.FrameTimeout < 0 || a.MaxPending < 0 {
			return fmt.Errorf("%w: agent %q: negative limit", ErrReverseConfig, a.Name)
		}
		if len(a.IDs) == 0 {
			a.IDs = []string{a.Name, a.Name + "-*"}
		}
		if a.FrameTimeout == 0 {
			a.FrameTimeout = c.FrameTimeout
		}
		if a.MaxPending == 0 {
			a.MaxPending = c.MaxPendingBytes
		}
		for _, p := range a.IDs {
			if p == "" || strings.TrimSpace(p) != p {
				return fmt.Errorf("%w: agent %q: empty or padded id pattern %q", ErrReverseConfig, a.Name, p)
			}
			if _, err := path.Match(p, ""); err != nil {
				return fmt.Errorf("%w: agent %q: id pattern %q: %v", ErrReverseConfig, a.Name, p, err)
			}
		}
		for _, t := range a.Tokens {
			if t == "" {
				return fmt.Errorf("%w: agent %q: empty token", ErrReverseConfig, a.Name)
			}
		}
		if len(a.Tokens) == 0 && a.TokenEnv == "" && a.TokenFile == "" && !a.AllowNoToken {
			return fmt.Errorf("%w: agent %q: no token configured (set tokens, token_env or token_file, or allow_no_token)", ErrReverseConfig, a.Name)
		}
	}
	return nil
}

func setInt(p *int, d int) {
	if *p <= 0 {
		*p = d
	}
}

func setDur(p *time.Duration, d time.Duration) {
	if *p <= 0 {
		*p = d
	}
}

// matchID reports whether id matches one of the patterns.
func matchID(patterns []string, id string) bool {
	for _, p := range patterns {
		if ok, _ := path.Match(p, id); ok {
			return true
		}
	}
	return false
}
