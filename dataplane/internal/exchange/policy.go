package exchange

import (
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/observe"
)

// PolicyStatus returns the current state of the policy features.
func (c *Core) PolicyStatus() observe.PolicyStatus {
	return observe.PolicyStatus{Circuits: c.Breakers(), Shadows: c.Shadows(), Caches: c.Caches(), Failovers: c.Failovers(), Bodies: c.Bodies()}
}

// prevAgent returns prev's entry of agent name when it had the same
// instance inst (nil when there is none): the per-agent policy state
// (breaker, shadow runner, cache, counters) a reload may carry over.
func prevAgent(prev *Table, name string, inst agentmux.Agent) *agentEntry {
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
