package supervisor

import (
	"context"
	"slices"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
)

// waitAgents waits until every agent has a live connection or ctx ends,
// and returns the names of those still without one.
func waitAgents(ctx context.Context, agents map[string]agentmux.Agent) []string {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		var missing []string
		for name, a := range agents {
			if !a.Snapshot().Ready {
				missing = append(missing, name)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			slices.Sort(missing)
			return missing
		case <-t.C:
		}
	}
}
