package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// CircuitBreaker stops consulting an agent that keeps failing: after
// Failures consecutive failures (timeouts, lost or refused connections,
// overload) the circuit opens, and for Cooldown every request that would
// consult the agent gets its failure policy at once instead of waiting
// for it. After the cool-down one probe request is let through; its
// success closes the circuit, its failure opens it for another
// cool-down.
type CircuitBreaker struct {
	// Failures is how many consecutive failures open the circuit
	// (default 0: the breaker is off).
	Failures int `yaml:"failures"`
	// Cooldown is how long the circuit stays open before a probe
	// request is let through (default 5s).
	Cooldown time.Duration `yaml:"cooldown"`
}

// On reports whether the breaker is enabled.
func (b CircuitBreaker) On() bool { return b.Failures > 0 }

// Over-limit actions of a buffered body besides reject and skip
// (config.go).
const (
	// OverLimitPrefix lets the agent decide on the first limit bytes (the
	// last chunk it gets says is_last) and streams the rest to the next
	// hop without showing it to the agent, marked X-Sidecar-Inspection:
	// partial. Request bodies only; for a response body it acts as skip.
	OverLimitPrefix = "prefix"
	// OverLimitStream keeps inspecting a body over the limit by streaming
	// it to the agent chunk by chunk, as mode streaming does.
	OverLimitStream = "stream"
)

// Bounds of the policy features.
const (
	// MaxBreakerFailures bounds circuit_breaker.failures.
	MaxBreakerFailures = 100000
	// MaxBreakerCooldown bounds circuit_breaker.cooldown.
	MaxBreakerCooldown = 10 * time.Minute
	// MaxShadowQueue bounds shadow_queue.
	MaxShadowQueue = 1 << 20
	// MaxShadowWorkers bounds shadow_workers.
	MaxShadowWorkers = 1024
	// MinShadowQueueBytes and MaxShadowQueueBytes bound shadow_queue_bytes.
	MinShadowQueueBytes = 64 << 10
	MaxShadowQueueBytes = 1 << 30
)

// DecisionCache caches an agent's request-header decisions, keyed by the
// configured parts of the request as the agent would see it. A hit applies
// the cached decision (its header operations included) without asking the
// agent. Only agents that handle request headers alone are cached; the
// agent may set or forbid caching per answer (protocol Decision "cache").
type DecisionCache struct {
	// Key lists the request parts the key is made of: method, host, path
	// (without query), uri (path and query), path_prefix:N (the first N
	// path segments), header:NAME (all its values), client_ip. Empty
	// (default): the cache is off.
	Key []string `yaml:"key"`
	// TTL keeps an allow (default 10s).
	TTL time.Duration `yaml:"ttl"`
	// BlockTTL keeps a block or redirect (default 1m).
	BlockTTL time.Duration `yaml:"block_ttl"`
	// MaxTTL caps the TTL an agent asks for in its answer (default 1h).
	MaxTTL time.Duration `yaml:"max_ttl"`
	// MaxEntries bounds the cached decisions; the least recently used go
	// first (default 10000).
	MaxEntries int `yaml:"max_entries"`
	// MaxKeyBytes: a request whose key is longer is not cached (default
	// 4KiB).
	MaxKeyBytes Size `yaml:"max_key_bytes"`
	// FlushOnReload empties the cache when a reload applies (default
	// true); false keeps it while the agent and its cache settings stay.
	FlushOnReload *bool `yaml:"flush_on_reload"`
	// FlushOnReconnect empties the cache when the agent gets a new
	// connection, for example after a restart with new rules (default
	// true).
	FlushOnReconnect *bool `yaml:"flush_on_reconnect"`
}

// On reports whether the cache is configured.
func (c *DecisionCache) On() bool { return len(c.Key) > 0 }

// FlushReload reports whether a reload empties the cache.
func (c *DecisionCache) FlushReload() bool { return c.FlushOnReload == nil || *c.FlushOnReload }

// FlushReconnect reports whether a new agent connection empties the cache.
func (c *DecisionCache) FlushReconnect() bool {
	return c.FlushOnReconnect == nil || *c.FlushOnReconnect
}

// Decision cache key parts.
const (
	KeyMethod     = "method"
	KeyHost       = "host"
	KeyPath       = "path"
	KeyURI        = "uri"
	KeyClientIP   = "client_ip"
	KeyPathPrefix = "path_prefix:" // followed by a segment count
	KeyHeader     = "header:"      // followed by a header name
)

// Bounds of the decision cache.
const (
	MaxCacheEntries     = 10000000
	MaxCacheKeyBytes    = 64 << 10
	MaxCachePathSegment = 64
)

// ParseCacheKeyPart checks one decision_cache.key entry and returns its
// kind and argument (the header name in lower case, or the segment count).
func ParseCacheKeyPart(p string) (kind string, name string, n int, err error) {
	switch p {
	case KeyMethod, KeyHost, KeyPath, KeyURI, KeyClientIP:
		return p, "", 0, nil
	}
	if v, ok := strings.CutPrefix(p, KeyPathPrefix); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxCachePathSegment {
			return "", "", 0, fmt.Errorf("%q: path_prefix needs a segment count in 1..%d", p, MaxCachePathSegment)
		}
		return KeyPathPrefix, "", n, nil
	}
	if v, ok := strings.CutPrefix(p, KeyHeader); ok {
		if !validToken(v) {
			return "", "", 0, fmt.Errorf("%q: header needs a header name", p)
		}
		return KeyHeader, strings.ToLower(v), 0, nil
	}
	return "", "", 0, fmt.Errorf("unknown key part %q (want method, host, path, uri, path_prefix:N, header:NAME or client_ip)", p)
}

func validToken(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return true
}

// FailoverOn reports whether requests fail over to another member.
func (a *Agent) FailoverOn() bool { return a.Failover == nil || *a.Failover }

// Members are the agent's addresses: Address, then Addresses.
func (a *Agent) Members() []string { return append([]string{a.Address}, a.Addresses...) }

// MaxAgentMembers bounds addresses.
const MaxAgentMembers = 16

func (a *Agent) setPolicyDefaults() {
	setDur(&a.CircuitBreaker.Cooldown, 5*time.Second)
	dc := &a.DecisionCache
	setDur(&dc.TTL, 10*time.Second)
	setDur(&dc.BlockTTL, time.Minute)
	setDur(&dc.MaxTTL, time.Hour)
	setInt(&dc.MaxEntries, 10000)
	setSize(&dc.MaxKeyBytes, 4<<10)
	setInt(&a.ShadowQueue, 1024)
	setInt(&a.ShadowWorkers, 16)
	setSize(&a.ShadowQueueBytes, 8<<20)
}

func (v *validator) agentPolicy(p string, a *Agent) {
	b := &a.CircuitBreaker
	if b.Failures < 0 || b.Failures > MaxBreakerFailures {
		v.failf(p+".circuit_breaker.failures", "%d is not in 0..%d (0: off)", b.Failures, MaxBreakerFailures)
	}
	if b.Cooldown <= 0 || b.Cooldown > MaxBreakerCooldown {
		v.failf(p+".circuit_breaker.cooldown", "%v is not in (0, %v]", b.Cooldown, MaxBreakerCooldown)
	}
	if a.ShadowQueue < 1 || a.ShadowQueue > MaxShadowQueue {
		v.failf(p+".shadow_queue", "%d is not in 1..%d", a.ShadowQueue, MaxShadowQueue)
	}
	if a.ShadowWorkers < 1 || a.ShadowWorkers > MaxShadowWorkers {
		v.failf(p+".shadow_workers", "%d is not in 1..%d", a.ShadowWorkers, MaxShadowWorkers)
	}
	if a.ShadowQueueBytes < MinShadowQueueBytes || a.ShadowQueueBytes > MaxShadowQueueBytes {
		v.failf(p+".shadow_queue_bytes", "%s is not in 64KiB..1GiB", a.ShadowQueueBytes)
	}
	dc := &a.DecisionCache
	dp := p + ".decision_cache"
	seen := map[string]bool{}
	for i, k := range dc.Key {
		if _, _, _, err := ParseCacheKeyPart(k); err != nil {
			v.failf(fmt.Sprintf("%s.key[%d]", dp, i), "%v", err)
		}
		if seen[k] {
			v.failf(fmt.Sprintf("%s.key[%d]", dp, i), "%q is listed twice", k)
		}
		seen[k] = true
	}
	v.positive(dp+".ttl", dc.TTL)
	v.positive(dp+".block_ttl", dc.BlockTTL)
	v.positive(dp+".max_ttl", dc.MaxTTL)
	if dc.MaxEntries < 1 || dc.MaxEntries > MaxCacheEntries {
		v.failf(dp+".max_entries", "%d is not in 1..%d", dc.MaxEntries, MaxCacheEntries)
	}
	if dc.MaxKeyBytes < 64 || dc.MaxKeyBytes > MaxCacheKeyBytes {
		v.failf(dp+".max_key_bytes", "%s is not in 64..%s", dc.MaxKeyBytes, Size(MaxCacheKeyBytes))
	}
	if len(a.Addresses) > 0 {
		if a.Transport != TransportUDS && a.Transport != TransportGRPC && a.Transport != TransportExtAuthz && a.Transport != TransportHTTPAuth {
			v.failf(p+".addresses", "addresses is for uds, grpc, ext_authz and http_auth agents (a reverse agent's members register themselves)")
		}
		if len(a.Addresses)+1 > MaxAgentMembers {
			v.failf(p+".addresses", "%d members (at most %d with address)", len(a.Addresses)+1, MaxAgentMembers)
		}
		seenAddr := map[string]bool{a.Address: true}
		for i, addr := range a.Addresses {
			ap := fmt.Sprintf("%s.addresses[%d]", p, i)
			switch {
			case addr == "":
				v.failf(ap, "address is required")
			case seenAddr[addr]:
				v.failf(ap, "%q is listed twice", addr)
			case a.Transport == TransportUDS && len(strings.TrimPrefix(addr, "unix:")) > 107:
				v.failf(ap, "socket path longer than 107 bytes")
			case a.Transport == TransportGRPC || a.Transport == TransportExtAuthz:
				v.address(ap, addr, false)
			case a.Transport == TransportHTTPAuth:
				v.authURL(ap, addr)
			}
			seenAddr[addr] = true
		}
	}
	if dc.On() && a.Shadow {
		v.failf(dp, "a shadow agent's decisions are not applied, so they are not cached")
	}
}
