package dataplane

import "github.com/zentinelproxy/sidecar/internal/agentmux"

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
