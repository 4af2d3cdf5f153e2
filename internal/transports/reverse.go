package transports

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/reverse"
)

// ReverseSpec is one agent of transport reverse as the sidecar's
// configuration file describes it: a name, the address its instances dial,
// the session limits shared with the other transports, and the
// transport-specific options.
type ReverseSpec struct {
	Name string
	// Address is "unix:/path" or host:port (port 0 picks a free one).
	Address        string
	MaxInFlight    int
	MaxQueue       int
	MessageTimeout time.Duration
	// FrameTimeout bounds a started frame (0: the listener's default).
	FrameTimeout time.Duration
	// MaxPending caps the bytes queued per connection (0: the listener's).
	MaxPending int
	// JSONOnly keeps the agent's connections JSON (reverse.AgentConfig.JSONOnly).
	JSONOnly bool
	// Options are the agent's options; see ReverseListenerConfigs for the keys.
	Options map[string]string
}

// Option keys of a reverse agent. Agent keys apply to the agent alone;
// listener keys apply to the listener at its address and must agree among
// the agents that share it.
var (
	agentKeys    = []string{"ids", "tokens", "token_env", "token_file", "allow_no_token"}
	listenerKeys = []string{
		"tls_cert_file", "tls_key_file", "tls_client_ca_file", "socket_mode",
		"registration_timeout", "max_conns_per_id", "max_conns_per_agent",
		"ping_interval", "ping_timeout", "max_pending", "max_pending_per_peer", "max_refusing",
	}
)

// ReverseListenerConfigs groups reverse agents by address into one listener
// reverse.Config each (in order of first appearance), starting from
// reverse.DefaultConfig and validated. Options:
//
//	ids                  comma-separated agent_id patterns (default: name, name-*)
//	tokens               comma-separated tokens (prefer token_env or token_file)
//	token_env            environment variable holding a token
//	token_file           file holding a token
//	allow_no_token       "true" to admit registrations without a token
//	tls_cert_file        proxy certificate (TCP only), with tls_key_file
//	tls_key_file         proxy key
//	tls_client_ca_file   CA bundle; set to require client certificates (mTLS)
//	socket_mode          octal permission of a Unix socket (default 0660)
//	registration_timeout Go duration (default 5s)
//	max_conns_per_id     connections one agent_id may hold (default 8)
//	max_conns_per_agent  connections of one configured agent (default 256)
//	ping_interval        Go duration (default 5s; "0" turns pings off)
//	ping_timeout         Go duration (default 15s)
//	max_pending          connections registering at once (default 128)
//	max_pending_per_peer the same from one address (default 16)
//	max_refusing         refused connections held open at once (default 256)
//
// An unknown key is an error, so that a typo does not silently drop a
// security setting.
func ReverseListenerConfigs(specs []ReverseSpec) ([]reverse.Config, error) {
	var cfgs []reverse.Config
	index := map[string]int{} // address → cfgs index
	type setter struct{ agent, value string }
	owner := map[string]setter{} // address+key → who set it to what
	for _, s := range specs {
		for k := range s.Options {
			if !slices.Contains(agentKeys, k) && !slices.Contains(listenerKeys, k) {
				return nil, fmt.Errorf("%w: agent %q: unknown option %q", reverse.ErrReverseConfig, s.Name, k)
			}
		}
		i, ok := index[s.Address]
		if !ok {
			c := reverse.DefaultConfig()
			if p, isUnix := strings.CutPrefix(s.Address, "unix:"); isUnix {
				c.UnixPath = p
			} else {
				c.TCPAddr = s.Address
			}
			cfgs = append(cfgs, c)
			i = len(cfgs) - 1
			index[s.Address] = i
		}
		c := &cfgs[i]
		for _, k := range listenerKeys {
			v, set := s.Options[k]
			if !set {
				continue
			}
			if prev, seen := owner[s.Address+"\x00"+k]; seen {
				if prev.value != v {
					return nil, fmt.Errorf("%w: agents %q and %q share %s but set %s differently", reverse.ErrReverseConfig, prev.agent, s.Name, s.Address, k)
				}
				continue
			}
			owner[s.Address+"\x00"+k] = setter{s.Name, v}
			if err := setListenerOption(c, k, v); err != nil {
				return nil, fmt.Errorf("%w: agent %q: option %s: %v", reverse.ErrReverseConfig, s.Name, k, err)
			}
		}
		a := reverse.AgentConfig{
			Name:           s.Name,
			TokenEnv:       s.Options["token_env"],
			TokenFile:      s.Options["token_file"],
			MaxInFlight:    s.MaxInFlight,
			MaxQueue:       s.MaxQueue,
			MessageTimeout: s.MessageTimeout,
			FrameTimeout:   s.FrameTimeout,
			MaxPending:     s.MaxPending,
			JSONOnly:       s.JSONOnly,
		}
		if v := s.Options["ids"]; v != "" {
			a.IDs = splitList(v)
		}
		if v := s.Options["tokens"]; v != "" {
			a.Tokens = splitList(v)
		}
		if v, set := s.Options["allow_no_token"]; set {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return nil, fmt.Errorf("%w: agent %q: option allow_no_token: %v", reverse.ErrReverseConfig, s.Name, err)
			}
			a.AllowNoToken = b
		}
		c.Agents = append(c.Agents, a)
	}
	for i := range cfgs {
		if err := cfgs[i].Validate(); err != nil {
			return nil, err
		}
	}
	return cfgs, nil
}

func setListenerOption(c *reverse.Config, k, v string) error {
	dur := func(p *time.Duration) error {
		d, err := time.ParseDuration(v)
		if err == nil && d < 0 {
			err = fmt.Errorf("negative")
		}
		*p = d
		return err
	}
	num := func(p *int) error {
		n, err := strconv.Atoi(v)
		if err == nil && n < 1 {
			err = fmt.Errorf("must be at least 1")
		}
		*p = n
		return err
	}
	tlsCfg := func() *reverse.TLSConfig {
		if c.TLS == nil {
			c.TLS = &reverse.TLSConfig{}
		}
		return c.TLS
	}
	switch k {
	case "tls_cert_file":
		tlsCfg().CertFile = v
	case "tls_key_file":
		tlsCfg().KeyFile = v
	case "tls_client_ca_file":
		tlsCfg().ClientCAFile = v
	case "socket_mode":
		m, err := strconv.ParseUint(v, 8, 32)
		if err != nil || m == 0 || m > 0o777 {
			return fmt.Errorf("%q is not an octal permission", v)
		}
		c.UnixMode = os.FileMode(m)
	case "registration_timeout":
		return dur(&c.RegistrationTimeout)
	case "max_conns_per_id":
		return num(&c.MaxConnsPerID)
	case "max_conns_per_agent":
		return num(&c.MaxConnsPerAgent)
	case "max_pending":
		return num(&c.MaxPending)
	case "max_pending_per_peer":
		return num(&c.MaxPendingPerPeer)
	case "max_refusing":
		return num(&c.MaxRefusing)
	case "ping_interval":
		if err := dur(&c.PingInterval); err != nil {
			return err
		}
		if c.PingInterval == 0 {
			c.NoPing = true
		}
	case "ping_timeout":
		return dur(&c.PingTimeout)
	}
	return nil
}

func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// ReverseSpecs collects the agents of transport reverse, for
// ReverseListenerConfigs.
func ReverseSpecs(cfg *config.Config) []ReverseSpec {
	var specs []ReverseSpec
	for i := range cfg.Agents {
		a := &cfg.Agents[i]
		if a.Transport != config.TransportReverse {
			continue
		}
		specs = append(specs, ReverseSpec{
			Name:           a.Name,
			Address:        a.Address,
			MaxInFlight:    a.MaxInFlight,
			MaxQueue:       a.MaxQueue,
			MessageTimeout: a.Timeouts.Message,
			FrameTimeout:   a.Timeouts.Frame,
			MaxPending:     int(a.MaxPendingBytes),
			JSONOnly:       a.PayloadEncoding == config.EncodingJSON,
			Options:        a.Options,
		})
	}
	return specs
}
