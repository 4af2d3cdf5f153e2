package sdk

import (
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
)

func TestCacheDirectiveHelpers(t *testing.T) {
	var d protocol.Decision
	for _, c := range []struct {
		ttl  time.Duration
		want uint32
	}{{30 * time.Second, 30000}, {time.Microsecond, 1}, {-time.Second, 1}, {100 * 24 * time.Hour, 1<<32 - 1}} {
		CacheFor(&d, c.ttl)
		if d.Cache != (protocol.CacheDirective{TTLMs: c.want}) {
			t.Errorf("CacheFor(%v): %+v, want ttl_ms %d", c.ttl, d.Cache, c.want)
		}
	}
	NoStore(&d)
	if !d.Cache.NoStore || d.Cache.TTLMs != 0 {
		t.Errorf("NoStore: %+v", d.Cache)
	}
	if got := string(protocol.AppendDecision(nil, &d)); got != `{"request_id":0,"decision":"allow","request_headers":[],"response_headers":[],"cache":"no_store"}` {
		t.Errorf("encoded %s", got)
	}
}
