package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/zentinelproxy/sidecar/internal/observe"
)

// The policy collector exports what PolicyStatus says, series by series.
func TestPolicyCollector(t *testing.T) {
	m, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(m.Registry(), "sidecar_agent_circuit_state"); err != nil || n != 0 {
		t.Fatalf("without a source: %d series (%v)", n, err)
	}
	m.SetPolicy(func() observe.PolicyStatus {
		return observe.PolicyStatus{
			Circuits: []observe.BreakerStatus{{Agent: "waf", State: observe.CircuitHalfOpen, Opens: 3, Rejected: 40, Probes: 2}},
			Shadows: []observe.ShadowStatus{{Agent: "next", Queued: 10, Dropped: 5, Failed: 1, Allowed: 6, WouldBlock: 3,
				ByStatus: map[string]uint64{"403": 3}, ByRule: map[string]uint64{"942100": 2, "(other)": 1}, Waiting: 4}},
			Caches:    []observe.CacheStatus{{Agent: "authz", Entries: 7, Hits: 100, Misses: 9, Skipped: 1, Stores: 8, Evictions: 1, Expired: 2, Flushes: 1}},
			Failovers: []observe.FailoverStatus{{Agent: "pair", Retried: 3, Recovered: 2, Members: 5}},
			Bodies:    []observe.BodyStatus{{Agent: "waf", Prefix: 4, Stream: 1}},
		}
	})
	want := `
# HELP sidecar_agent_circuit_state Circuit breaker state per agent: 0 closed, 1 open, 2 half_open (a probe request is out).
# TYPE sidecar_agent_circuit_state gauge
sidecar_agent_circuit_state{agent="waf"} 2
# HELP sidecar_agent_circuit_rejected_total Requests that got the agent's failure policy at once because its circuit was open.
# TYPE sidecar_agent_circuit_rejected_total counter
sidecar_agent_circuit_rejected_total{agent="waf"} 40
# HELP sidecar_shadow_events_total Events for shadow agents by result: queued, dropped (queue full), failed (no answer: timeout, connection, overload).
# TYPE sidecar_shadow_events_total counter
sidecar_shadow_events_total{agent="next",result="dropped"} 5
sidecar_shadow_events_total{agent="next",result="failed"} 1
sidecar_shadow_events_total{agent="next",result="queued"} 10
# HELP sidecar_shadow_would_block_rules_total Audit rule ids of the blocks and redirects of shadow agents (at most 64 per agent, then "(other)").
# TYPE sidecar_shadow_would_block_rules_total counter
sidecar_shadow_would_block_rules_total{agent="next",rule="(other)"} 1
sidecar_shadow_would_block_rules_total{agent="next",rule="942100"} 2
# HELP sidecar_decision_cache_lookups_total Decision cache lookups by result: hit (answered without the agent), miss (asked the agent), skipped (the agent handles more than request headers, or the key is over max_key_bytes).
# TYPE sidecar_decision_cache_lookups_total counter
sidecar_decision_cache_lookups_total{agent="authz",result="hit"} 100
sidecar_decision_cache_lookups_total{agent="authz",result="miss"} 9
sidecar_decision_cache_lookups_total{agent="authz",result="skipped"} 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want),
		"sidecar_agent_circuit_state", "sidecar_agent_circuit_rejected_total", "sidecar_shadow_events_total",
		"sidecar_shadow_would_block_rules_total", "sidecar_decision_cache_lookups_total"); err != nil {
		t.Fatal(err)
	}
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(`
# HELP sidecar_decision_cache_evictions_total Decision cache entries removed by reason: lru (max_entries reached), expired (found past its TTL).
# TYPE sidecar_decision_cache_evictions_total counter
sidecar_decision_cache_evictions_total{agent="authz",reason="expired"} 2
sidecar_decision_cache_evictions_total{agent="authz",reason="lru"} 1
# HELP sidecar_agent_failovers_total Agent failovers by stage: event (a request-header event sent again after its connection was lost), member (an exchange opened on another member).
# TYPE sidecar_agent_failovers_total counter
sidecar_agent_failovers_total{agent="pair",stage="event"} 3
sidecar_agent_failovers_total{agent="pair",stage="member"} 5
# HELP sidecar_agent_body_over_limit_total Request bodies over an agent's buffer limit that it inspected in part (action prefix) or had streamed to it (action stream).
# TYPE sidecar_agent_body_over_limit_total counter
sidecar_agent_body_over_limit_total{action="prefix",agent="waf"} 4
sidecar_agent_body_over_limit_total{action="stream",agent="waf"} 1
`), "sidecar_decision_cache_evictions_total", "sidecar_agent_failovers_total", "sidecar_agent_body_over_limit_total"); err != nil {
		t.Fatal(err)
	}
}
