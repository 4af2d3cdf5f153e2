package dataplane

import "github.com/zentinelproxy/sidecar/internal/agentmux"

// PolicyStatus is the state of the policy features (circuit breakers,
// shadow agents, decision caches, failover, over-limit bodies) for status
// pages and metrics.
type PolicyStatus struct {
	// Circuits lists the agents with a circuit breaker.
	Circuits []BreakerStatus `json:"circuits,omitempty"`
	// Shadows lists the shadow agents.
	Shadows []ShadowStatus `json:"shadows,omitempty"`
	// Caches lists the agents with a decision cache.
	Caches []CacheStatus `json:"decision_caches,omitempty"`
	// Failovers lists the agents with several members or retries.
	Failovers []FailoverStatus `json:"failovers,omitempty"`
	// Bodies lists the agents with an over_limit of prefix or stream.
	Bodies []BodyStatus `json:"over_limit_bodies,omitempty"`
}

// PolicyStatus returns the current state of the policy features.
func (s *Server) PolicyStatus() PolicyStatus {
	return PolicyStatus{Circuits: s.Breakers(), Shadows: s.Shadows(), Caches: s.Caches(), Failovers: s.Failovers(), Bodies: s.Bodies()}
}

// prevAgent returns prev's entry of agent name when it had the same
// instance inst (nil when there is none): the per-agent policy state
// (breaker, shadow runner, cache, counters) a reload may carry over.
func prevAgent(prev *table, name string, inst agentmux.Agent) *agentEntry {
	if prev == nil {
		return nil
	}
	for _, old := range prev.agents {
		if old.name == name && old.agent == inst {
			return old
		}
	}
	return nil
}
