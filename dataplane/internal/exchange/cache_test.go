package exchange

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/dataplane/internal/clock"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/protocol"
)

// genAgent is an agent whose connection generation the test moves.
type genAgent struct {
	agentmux.Agent
	gen atomic.Uint64
}

func (g *genAgent) Generation() uint64 { return g.gen.Load() }

// An answer stored after the agent got a new connection empties the
// entries of the old one first, even when no lookup saw the change (a
// lookup is skipped while the agent's capabilities are unknown).
func TestDecisionCacheStoreFlushesOldGeneration(t *testing.T) {
	a := &genAgent{}
	c := config.DecisionCache{Key: []string{"path"}, TTL: time.Minute, BlockTTL: time.Minute, MaxTTL: time.Hour, MaxEntries: 100, MaxKeyBytes: 4096}
	dc, err := newDecisionCache(&c, a, false)
	if err != nil {
		t.Fatal(err)
	}
	allow := &protocol.Decision{Kind: protocol.DecisionAllow}
	dc.put([]byte("old"), allow, time.Minute)
	a.gen.Add(1) // the agent restarted
	dc.put([]byte("new"), allow, time.Minute)
	n := 0
	for i := range dc.shards {
		n += len(dc.shards[i].m)
	}
	if n != 1 || dc.flushes.Load() != 1 {
		t.Fatalf("%d entries, %d flushes after a new connection: want 1 entry (the new one), 1 flush", n, dc.flushes.Load())
	}
	if dc.get([]byte("new"), clock.Mono()) == nil {
		t.Fatal("the new connection's answer is gone")
	}
}
