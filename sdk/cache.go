package sdk

import (
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
)

// CacheFor asks the proxy's decision cache to keep this header decision
// for ttl ("cache": {"ttl_ms": N}); the proxy caps it at its configured
// maximum, and a proxy without a cache for the agent ignores it. A ttl
// below 1ms is 1ms; above 2^32-1 ms it is capped there.
func CacheFor(d *protocol.Decision, ttl time.Duration) {
	ms := ttl.Milliseconds()
	switch {
	case ms < 1:
		ms = 1
	case ms > 1<<32-1:
		ms = 1<<32 - 1
	}
	d.Cache = protocol.CacheDirective{TTLMs: uint32(ms)}
}

// NoStore forbids the proxy's decision cache to keep this decision
// ("cache": "no_store"): the next matching request asks the agent again.
func NoStore(d *protocol.Decision) { d.Cache = protocol.CacheDirective{NoStore: true} }
