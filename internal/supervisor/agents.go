package supervisor

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/transports"
	"github.com/zentinelproxy/sidecar/reverse"
)

// agentSet is the agent instances of one configuration, handed to the
// dataplane, and the reverse listeners the reverse agents live on.
type agentSet struct {
	agents map[string]agentmux.Agent
	// keys are the instance keys the agents were built for.
	keys map[string]transports.Key
	// reverse are the reverse listeners; revAddrs[i] is the address of
	// reverse[i] as configured and revKeys[i] the instance keys of its
	// agents, sorted by name.
	reverse  []*reverse.Listener
	revAddrs []string
	revKeys  [][]transports.Key
}

// built is what buildAgents did: the new set, and what to undo or retire.
type built struct {
	set *agentSet
	// fresh are the instances built here and newLns the listeners bound
	// here: closed if the set is not put to use.
	fresh  []agentmux.Agent
	newLns []*reverse.Listener
	// retired are the reverse listeners of the previous set that the new
	// one no longer has.
	retired []*reverse.Listener
}

// undo closes what buildAgents opened.
func (b *built) undo() {
	for _, a := range b.fresh {
		_ = a.Close()
	}
	for _, l := range b.newLns {
		_ = l.Close()
	}
}

// buildAgents builds the agents of cfg (which passed transports.Check).
// With prev, the set being served, it reuses every instance whose
// transports.InstanceKey did not change and every reverse listener whose
// agents' keys did not change, and refuses (config.ErrConfigInvalid) a
// reverse listener whose address stays but whose agents changed: that
// needs a restart. UDS and gRPC instances start connecting in the
// background; reverse listeners are bound, not yet served. On error
// nothing built here stays open.
func buildAgents(cfg *config.Config, prev *agentSet, log zerolog.Logger) (_ *built, err error) {
	b := &built{set: &agentSet{
		agents: make(map[string]agentmux.Agent, len(cfg.Agents)),
		keys:   make(map[string]transports.Key, len(cfg.Agents)),
	}}
	defer func() {
		if err != nil {
			b.undo()
		}
	}()
	if prev == nil {
		prev = &agentSet{}
	}
	next := b.set

	// Reverse listeners by address: kept when their agents are the same
	// instances, bound when new.
	lcs, err := transports.ReverseListenerConfigs(transports.ReverseSpecs(cfg))
	if err != nil {
		return nil, invalidConfig{err}
	}
	groups := reverseGroups(cfg)
	oldByAddr := make(map[string]int, len(prev.reverse))
	for i, addr := range prev.revAddrs {
		oldByAddr[addr] = i
	}
	kept := map[int]bool{}
	for _, lc := range lcs {
		addr := configAddr(lc)
		keys := groups[addr]
		if i, ok := oldByAddr[addr]; ok {
			if !slices.Equal(prev.revKeys[i], keys) {
				return nil, invalidConfig{fmt.Errorf("config: the reverse listener at %s changed; restart to apply", addr)}
			}
			kept[i] = true
			next.reverse = append(next.reverse, prev.reverse[i])
			next.revAddrs = append(next.revAddrs, addr)
			next.revKeys = append(next.revKeys, keys)
			continue
		}
		l, err := reverse.NewListener(lc, log.With().Str("component", "reverse").Logger())
		if err != nil {
			return nil, err
		}
		b.newLns = append(b.newLns, l)
		next.reverse = append(next.reverse, l)
		next.revAddrs = append(next.revAddrs, addr)
		next.revKeys = append(next.revKeys, keys)
	}
	for i, l := range prev.reverse {
		if !kept[i] {
			b.retired = append(b.retired, l)
		}
	}

	dial := transports.Dialing()
	for i := range cfg.Agents {
		a := &cfg.Agents[i]
		key := transports.InstanceKey(*a)
		next.keys[a.Name] = key
		if a.Transport == config.TransportReverse {
			// The pool of its listener, closed with the listener.
			inst := reverseAgent(next.reverse, a.Name)
			if inst == nil {
				return nil, fmt.Errorf("agent %q: no reverse listener", a.Name)
			}
			next.agents[a.Name] = inst
			continue
		}
		if old := prev.agents[a.Name]; old != nil && prev.keys[a.Name] == key {
			next.agents[a.Name] = old
			continue
		}
		f := dial[a.Transport]
		if f == nil {
			return nil, fmt.Errorf("agent %q: transport %q is not available", a.Name, a.Transport)
		}
		inst, err := f(a, log.With().Str("agent", a.Name).Logger())
		if err != nil {
			return nil, err
		}
		b.fresh = append(b.fresh, inst)
		next.agents[a.Name] = inst
	}
	return b, nil
}

// reverseGroups returns the instance keys of the reverse agents of cfg by
// address, each group sorted by name.
func reverseGroups(cfg *config.Config) map[string][]transports.Key {
	groups := map[string][]transports.Key{}
	for i := range cfg.Agents {
		a := &cfg.Agents[i]
		if a.Transport == config.TransportReverse {
			groups[a.Address] = append(groups[a.Address], transports.InstanceKey(*a))
		}
	}
	for _, g := range groups {
		slices.SortFunc(g, func(x, y transports.Key) int { return cmp.Compare(x.Name, y.Name) })
	}
	return groups
}

// configAddr is a reverse listener's address as agents configure it:
// "unix:/path" or host:port.
func configAddr(c reverse.Config) string {
	if c.UnixPath != "" {
		return "unix:" + c.UnixPath
	}
	return c.TCPAddr
}

func reverseAgent(lns []*reverse.Listener, name string) agentmux.Agent {
	for _, l := range lns {
		if a := l.Agent(name); a != nil {
			return a
		}
	}
	return nil
}

func isOnListener(a agentmux.Agent, lns []*reverse.Listener) bool {
	for _, l := range lns {
		for _, name := range l.Agents() {
			if l.Agent(name) == a {
				return true
			}
		}
	}
	return false
}

// closeListeners closes the reverse listeners (and with them the pools
// of the reverse agents).
func (s *agentSet) closeListeners() {
	for _, l := range s.reverse {
		_ = l.Close()
	}
}

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
