package config_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/config"
)

func TestPolicyDefaults(t *testing.T) {
	c, err := config.Parse([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	a := c.Agents[0]
	if a.CircuitBreaker.On() || a.CircuitBreaker.Cooldown != 5*time.Second {
		t.Errorf("breaker defaults %+v", a.CircuitBreaker)
	}
	if a.Shadow || a.ShadowQueue != 1024 || a.ShadowWorkers != 16 || a.ShadowQueueBytes != 8<<20 {
		t.Errorf("shadow defaults %v %d %d %s", a.Shadow, a.ShadowQueue, a.ShadowWorkers, a.ShadowQueueBytes)
	}
	dc := a.DecisionCache
	if dc.On() || dc.TTL != 10*time.Second || dc.BlockTTL != time.Minute || dc.MaxTTL != time.Hour ||
		dc.MaxEntries != 10000 || dc.MaxKeyBytes != 4<<10 || !dc.FlushReload() || !dc.FlushReconnect() {
		t.Errorf("decision cache defaults %+v", dc)
	}
}

func TestPolicyKeys(t *testing.T) {
	doc := strings.Replace(base, "    address: /run/waf.sock\n", `    address: /run/waf.sock
    circuit_breaker:
      failures: 5
      cooldown: 30s
    decision_cache:
      key: [method, host, "path_prefix:2", "header:Authorization", client_ip]
      ttl: 2s
      block_ttl: 5m
      max_entries: 50
      flush_on_reload: false
`, 1)
	c, err := config.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	a := c.Agents[0]
	if !a.CircuitBreaker.On() || a.CircuitBreaker.Failures != 5 || a.CircuitBreaker.Cooldown != 30*time.Second {
		t.Errorf("breaker %+v", a.CircuitBreaker)
	}
	dc := a.DecisionCache
	if !dc.On() || len(dc.Key) != 5 || dc.TTL != 2*time.Second || dc.BlockTTL != 5*time.Minute || dc.MaxEntries != 50 ||
		dc.FlushReload() || !dc.FlushReconnect() {
		t.Errorf("decision cache %+v", dc)
	}
	kind, name, _, err := config.ParseCacheKeyPart("header:Authorization")
	if err != nil || kind != config.KeyHeader || name != "authorization" {
		t.Errorf("header part: %q %q %v", kind, name, err)
	}
}

func TestPolicyInvalid(t *testing.T) {
	cases := []struct{ add, want string }{
		{"    circuit_breaker:\n      failures: -1\n", "circuit_breaker.failures"},
		{"    circuit_breaker:\n      failures: 3\n      cooldown: 11m\n", "circuit_breaker.cooldown"},
		{"    shadow: true\n    shadow_queue: -4\n", "shadow_queue"},
		{"    shadow_workers: 5000\n", "shadow_workers"},
		{"    shadow: true\n    shadow_queue_bytes: 1KiB\n", "shadow_queue_bytes"},
		{"    shadow_queue_bytes: 2GiB\n", "shadow_queue_bytes"},
		{"    decision_cache:\n      key: [method, cookie]\n", "decision_cache.key[1]"},
		{"    decision_cache:\n      key: [\"path_prefix:0\"]\n", "decision_cache.key[0]"},
		{"    decision_cache:\n      key: [\"header:a b\"]\n", "decision_cache.key[0]"},
		{"    decision_cache:\n      key: [method, method]\n", "listed twice"},
		{"    decision_cache:\n      key: [method]\n      max_entries: -1\n", "decision_cache.max_entries"},
		{"    decision_cache:\n      key: [method]\n      max_key_bytes: 1MiB\n", "decision_cache.max_key_bytes"},
		{"    decision_cache:\n      key: [method]\n      ttl: -1s\n", "decision_cache.ttl"},
		{"    shadow: true\n    decision_cache:\n      key: [method]\n", "shadow agent"},
		{"    circuit_breaker:\n      threshold: 3\n", "threshold"},
	}
	for _, c := range cases {
		doc := strings.Replace(base, "    address: /run/waf.sock\n", "    address: /run/waf.sock\n"+c.add, 1)
		_, err := config.Parse([]byte(doc))
		if err == nil {
			t.Errorf("%q: accepted", c.add)
			continue
		}
		if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "line ") {
			t.Errorf("%q: error %v does not name %q with a line", c.add, err, c.want)
		}
		if !errors.Is(err, config.ErrConfigInvalid) && !errors.Is(err, config.ErrConfigSyntax) {
			t.Errorf("%q: %v wraps no config error", c.add, err)
		}
	}
}

// FuzzParseCacheKeyPart: any string is accepted as a known part or
// refused with an error, never a panic; an accepted header part has a
// lower-case name and a path prefix a count in range.
func FuzzParseCacheKeyPart(f *testing.F) {
	for _, s := range []string{"method", "host", "path", "uri", "client_ip", "path_prefix:3", "path_prefix:0", "path_prefix:x",
		"header:X-User", "header:", "header:a b", "cookie", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		kind, name, n, err := config.ParseCacheKeyPart(s)
		if err != nil {
			if kind != "" {
				t.Fatalf("%q: error %v with kind %q", s, err, kind)
			}
			return
		}
		switch kind {
		case config.KeyHeader:
			if name == "" || name != strings.ToLower(name) || !strings.EqualFold("header:"+name, s) {
				t.Fatalf("%q: header name %q", s, name)
			}
		case config.KeyPathPrefix:
			if n < 1 || n > config.MaxCachePathSegment {
				t.Fatalf("%q: segments %d", s, n)
			}
		case config.KeyMethod, config.KeyHost, config.KeyPath, config.KeyURI, config.KeyClientIP:
			if kind != s {
				t.Fatalf("%q: kind %q", s, kind)
			}
		default:
			t.Fatalf("%q: unknown kind %q", s, kind)
		}
	})
}
