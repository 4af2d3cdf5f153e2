package dataplane

import (
	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// Every client connection can hold a second descriptor for its upstream
// connection; agents, listeners, log files and the admin listener need a
// few more. fdReserve is what is kept back for those (a quarter of a
// small limit).
const fdReserve = 128

// defaultMaxConnections caps an unset max_connections.
const defaultMaxConnections = 65536

// fdLimit returns the process's soft RLIMIT_NOFILE after raising it to
// the hard limit (0 when unknown). A variable so tests can pretend.
var fdLimit = raiseFDLimit

// connectionBudget is the most client connections each listener may
// take so that the process stays within nofile descriptors (0: no limit
// known). Each client connection in flight holds an upstream connection
// too, but never more than the upstreams' max_conns together: C clients
// need C + min(C, U) descriptors plus the reserve.
func connectionBudget(cfg *config.Config, nofile uint64) int {
	if nofile == 0 || len(cfg.Listeners) == 0 {
		return 0
	}
	upstream := int64(0)
	for _, u := range cfg.Upstreams {
		upstream += int64(u.MaxConns) * int64(u.MaxEndpointCount())
	}
	avail := int64(nofile) - min(fdReserve, int64(nofile)/4)
	c := avail / 2
	if c > upstream {
		c = avail - upstream
	}
	c /= int64(len(cfg.Listeners))
	return int(max(c, 1))
}

// clampConnections lowers l's max_connections to budget, loudly: a limit
// above what the process can open only turns a connection burst into
// accept failures.
func clampConnections(l *config.Listener, budget int, nofile uint64, log zerolog.Logger) bool {
	if l.MaxConnections == 0 {
		// Unset: what the descriptors allow.
		l.MaxConnections = defaultMaxConnections
		if budget > 0 && budget < l.MaxConnections {
			l.MaxConnections = budget
		}
		return false
	}
	if budget <= 0 || l.MaxConnections <= budget {
		return false
	}
	log.Warn().Str("listener", l.Name).Int("max_connections", l.MaxConnections).Int("clamped_to", budget).
		Uint64("rlimit_nofile", nofile).
		Msg("max_connections exceeds what the file descriptor limit allows (with an upstream connection per client connection and a reserve); clamped. Raise `ulimit -n` or lower max_connections")
	l.MaxConnections = budget
	return true
}

// clampTunnels keeps l's tunnels within the listener's descriptor budget.
// A tunnel's client connection is not one of max_connections (it leaves
// the listener's count when the tunnel starts), yet it holds a descriptor
// like one (its upstream side counts against the upstream's max_conns):
// max_connections and max_tunnels together must fit the budget. Tunnels
// keep at most half of it. explicit says the operator set either limit;
// only then is the clamp logged.
func clampTunnels(l *config.Listener, budget int, nofile uint64, explicit bool, log zerolog.Logger) bool {
	if budget <= 0 || l.MaxConnections+l.MaxTunnels <= budget {
		return false
	}
	tunnels := min(l.MaxTunnels, max(budget/2, 1))
	conns := min(l.MaxConnections, max(budget-tunnels, 1))
	if explicit {
		log.Warn().Str("listener", l.Name).Int("max_connections", l.MaxConnections).Int("max_tunnels", l.MaxTunnels).
			Int("connections_clamped_to", conns).Int("tunnels_clamped_to", tunnels).Uint64("rlimit_nofile", nofile).
			Msg("max_connections and max_tunnels together exceed what the file descriptor limit allows (a tunnel holds a client descriptor outside max_connections); clamped. Raise `ulimit -n` or lower them")
	}
	l.MaxConnections, l.MaxTunnels = conns, tunnels
	return explicit
}
