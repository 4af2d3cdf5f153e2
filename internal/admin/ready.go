package admin

import (
	"slices"
	"strings"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
)

// FailClosedAgents returns the names of the agents that are fail-closed on
// at least one route of cfg: without a live connection to each of them,
// some requests can only be answered 503, so the sidecar is not ready.
func FailClosedAgents(cfg *config.Config) []string {
	var names []string
	for i := range cfg.Routes {
		for j := range cfg.Routes[i].Agents {
			ra := &cfg.Routes[i].Agents[j]
			// A shadow agent never decides a request: it cannot hold
			// readiness either.
			if a := cfg.Agent(ra.Name); a == nil || a.Shadow || cfg.Policy(ra).FailOpen {
				continue
			}
			if !slices.Contains(names, ra.Name) {
				names = append(names, ra.Name)
			}
		}
	}
	slices.Sort(names)
	return names
}

// maxReasonError bounds the last error an agent contributes to the
// /readyz reason (its whole text is on /status).
const maxReasonError = 200

// AgentsReady reports whether every agent in required has a live
// connection in agents; otherwise the reason names those that do not,
// each with its last connection error when it has one (an ext_proc agent
// whose server is not a processor, a refused handshake…).
func AgentsReady(agents []agentmux.AgentStatus, required []string) (bool, string) {
	var down []string
	for _, name := range required {
		i := slices.IndexFunc(agents, func(st agentmux.AgentStatus) bool { return st.Name == name })
		if i < 0 || !agents[i].Ready {
			if i >= 0 && agents[i].LastError != "" {
				e := agents[i].LastError
				if len(e) > maxReasonError {
					e = strings.ToValidUTF8(e[:maxReasonError], "") + "…"
				}
				name += " (" + e + ")"
			}
			down = append(down, name)
		}
	}
	if len(down) == 0 {
		return true, ""
	}
	return false, "fail-closed agent not connected: " + strings.Join(down, ", ")
}
