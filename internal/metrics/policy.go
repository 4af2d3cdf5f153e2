package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/zentinelproxy/sidecar/internal/observe"
)

// Policy feature metrics, read at scrape time from
// dataplane.Server.PolicyStatus: they cost the request path nothing.
var (
	descCircuitState = prometheus.NewDesc(Namespace+"_agent_circuit_state",
		"Circuit breaker state per agent: 0 closed, 1 open, 2 half_open (a probe request is out).", []string{"agent"}, nil)
	descCircuitOpens = prometheus.NewDesc(Namespace+"_agent_circuit_opens_total",
		"Times an agent's circuit opened (a failed probe included).", []string{"agent"}, nil)
	descCircuitRejected = prometheus.NewDesc(Namespace+"_agent_circuit_rejected_total",
		"Requests that got the agent's failure policy at once because its circuit was open.", []string{"agent"}, nil)
	descCircuitProbes = prometheus.NewDesc(Namespace+"_agent_circuit_probes_total",
		"Probe requests let through to an agent whose circuit's cool-down had passed.", []string{"agent"}, nil)
	descShadowEvents = prometheus.NewDesc(Namespace+"_shadow_events_total",
		"Events for shadow agents by result: queued, dropped (queue full), failed (no answer: timeout, connection, overload).", []string{"agent", "result"}, nil)
	descShadowDecisions = prometheus.NewDesc(Namespace+"_shadow_decisions_total",
		"Answers of shadow agents (never applied) by decision: allow, block, redirect, mutate (a body chunk changed; also counted as allow).", []string{"agent", "decision"}, nil)
	descShadowByStatus = prometheus.NewDesc(Namespace+"_shadow_would_block_total",
		"Requests a shadow agent would have blocked or redirected, by status.", []string{"agent", "status"}, nil)
	descShadowByRule = prometheus.NewDesc(Namespace+"_shadow_would_block_rules_total",
		"Audit rule ids of the blocks and redirects of shadow agents (at most 64 per agent, then \"(other)\").", []string{"agent", "rule"}, nil)
	descShadowWaiting = prometheus.NewDesc(Namespace+"_shadow_queue_length",
		"Events waiting in a shadow agent's queue.", []string{"agent"}, nil)
	descShadowBytes = prometheus.NewDesc(Namespace+"_shadow_queue_bytes",
		"Body bytes waiting in a shadow agent's queue (at most its shadow_queue_bytes).", []string{"agent"}, nil)
	descShadowPeak = prometheus.NewDesc(Namespace+"_shadow_queue_bytes_peak",
		"The most body bytes that ever waited in a shadow agent's queue at once.", []string{"agent"}, nil)
	descFailovers = prometheus.NewDesc(Namespace+"_agent_failovers_total",
		"Agent failovers by stage: event (a request-header event sent again after its connection was lost), member (an exchange opened on another member).", []string{"agent", "stage"}, nil)
	descFailoverOK = prometheus.NewDesc(Namespace+"_agent_failovers_recovered_total",
		"Request-header events sent again after a lost connection that the retry answered.", []string{"agent"}, nil)
	descBodyOver = prometheus.NewDesc(Namespace+"_agent_body_over_limit_total",
		"Request bodies over an agent's buffer limit that it inspected in part (action prefix) or had streamed to it (action stream).", []string{"agent", "action"}, nil)
	descCacheLookups = prometheus.NewDesc(Namespace+"_decision_cache_lookups_total",
		"Decision cache lookups by result: hit (answered without the agent), miss (asked the agent), skipped (the agent handles more than request headers, or the key is over max_key_bytes).", []string{"agent", "result"}, nil)
	descCacheStores = prometheus.NewDesc(Namespace+"_decision_cache_stores_total",
		"Agent decisions stored in the decision cache.", []string{"agent"}, nil)
	descCacheEvictions = prometheus.NewDesc(Namespace+"_decision_cache_evictions_total",
		"Decision cache entries removed by reason: lru (max_entries reached), expired (found past its TTL).", []string{"agent", "reason"}, nil)
	descCacheFlushes = prometheus.NewDesc(Namespace+"_decision_cache_flushes_total",
		"Decision cache flushes because the agent got a new connection.", []string{"agent"}, nil)
	descCacheEntries = prometheus.NewDesc(Namespace+"_decision_cache_entries",
		"Decisions in the cache now.", []string{"agent"}, nil)
)

// SetPolicy sets where scrapes read the policy features' state
// (dataplane.Server.PolicyStatus); nil stops those metrics.
func (m *Metrics) SetPolicy(f func() observe.PolicyStatus) {
	if f == nil {
		m.policy.Store(nil)
		return
	}
	m.policy.Store(&f)
}

type policyCollector struct{ m *Metrics }

func (c *policyCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCircuitState, descCircuitOpens, descCircuitRejected, descCircuitProbes,
		descShadowEvents, descShadowDecisions, descShadowByStatus, descShadowByRule, descShadowWaiting, descShadowBytes, descShadowPeak,
		descCacheLookups, descCacheStores, descCacheEvictions, descCacheFlushes, descCacheEntries,
		descFailovers, descFailoverOK, descBodyOver} {
		ch <- d
	}
}

func (c *policyCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.m.policy.Load()
	if f == nil {
		return
	}
	st := (*f)()
	for _, b := range st.Circuits {
		state := 0.0
		switch b.State {
		case observe.CircuitOpen:
			state = 1
		case observe.CircuitHalfOpen:
			state = 2
		}
		ch <- prometheus.MustNewConstMetric(descCircuitState, prometheus.GaugeValue, state, b.Agent)
		ch <- prometheus.MustNewConstMetric(descCircuitOpens, prometheus.CounterValue, float64(b.Opens), b.Agent)
		ch <- prometheus.MustNewConstMetric(descCircuitRejected, prometheus.CounterValue, float64(b.Rejected), b.Agent)
		ch <- prometheus.MustNewConstMetric(descCircuitProbes, prometheus.CounterValue, float64(b.Probes), b.Agent)
	}
	for _, sh := range st.Shadows {
		a := sh.Agent
		ch <- prometheus.MustNewConstMetric(descShadowEvents, prometheus.CounterValue, float64(sh.Queued), a, "queued")
		ch <- prometheus.MustNewConstMetric(descShadowEvents, prometheus.CounterValue, float64(sh.Dropped), a, "dropped")
		ch <- prometheus.MustNewConstMetric(descShadowEvents, prometheus.CounterValue, float64(sh.Failed), a, "failed")
		ch <- prometheus.MustNewConstMetric(descShadowDecisions, prometheus.CounterValue, float64(sh.Allowed), a, "allow")
		ch <- prometheus.MustNewConstMetric(descShadowDecisions, prometheus.CounterValue, float64(sh.WouldBlock), a, "block")
		ch <- prometheus.MustNewConstMetric(descShadowDecisions, prometheus.CounterValue, float64(sh.WouldRedirect), a, "redirect")
		ch <- prometheus.MustNewConstMetric(descShadowDecisions, prometheus.CounterValue, float64(sh.WouldMutate), a, "mutate")
		for status, n := range sh.ByStatus {
			ch <- prometheus.MustNewConstMetric(descShadowByStatus, prometheus.CounterValue, float64(n), a, status)
		}
		for rule, n := range sh.ByRule {
			ch <- prometheus.MustNewConstMetric(descShadowByRule, prometheus.CounterValue, float64(n), a, rule)
		}
		ch <- prometheus.MustNewConstMetric(descShadowWaiting, prometheus.GaugeValue, float64(sh.Waiting), a)
		ch <- prometheus.MustNewConstMetric(descShadowBytes, prometheus.GaugeValue, float64(sh.WaitingBytes), a)
		ch <- prometheus.MustNewConstMetric(descShadowPeak, prometheus.GaugeValue, float64(sh.PeakWaitingBytes), a)
	}
	for _, c := range st.Caches {
		a := c.Agent
		ch <- prometheus.MustNewConstMetric(descCacheLookups, prometheus.CounterValue, float64(c.Hits), a, "hit")
		ch <- prometheus.MustNewConstMetric(descCacheLookups, prometheus.CounterValue, float64(c.Misses), a, "miss")
		ch <- prometheus.MustNewConstMetric(descCacheLookups, prometheus.CounterValue, float64(c.Skipped), a, "skipped")
		ch <- prometheus.MustNewConstMetric(descCacheStores, prometheus.CounterValue, float64(c.Stores), a)
		ch <- prometheus.MustNewConstMetric(descCacheEvictions, prometheus.CounterValue, float64(c.Evictions), a, "lru")
		ch <- prometheus.MustNewConstMetric(descCacheEvictions, prometheus.CounterValue, float64(c.Expired), a, "expired")
		ch <- prometheus.MustNewConstMetric(descCacheFlushes, prometheus.CounterValue, float64(c.Flushes), a)
		ch <- prometheus.MustNewConstMetric(descCacheEntries, prometheus.GaugeValue, float64(c.Entries), a)
	}
	for _, f := range st.Failovers {
		ch <- prometheus.MustNewConstMetric(descFailovers, prometheus.CounterValue, float64(f.Retried), f.Agent, "event")
		ch <- prometheus.MustNewConstMetric(descFailovers, prometheus.CounterValue, float64(f.Members), f.Agent, "member")
		ch <- prometheus.MustNewConstMetric(descFailoverOK, prometheus.CounterValue, float64(f.Recovered), f.Agent)
	}
	for _, b := range st.Bodies {
		ch <- prometheus.MustNewConstMetric(descBodyOver, prometheus.CounterValue, float64(b.Prefix), b.Agent, "prefix")
		ch <- prometheus.MustNewConstMetric(descBodyOver, prometheus.CounterValue, float64(b.Stream), b.Agent, "stream")
	}
}
