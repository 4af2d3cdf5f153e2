package reverse

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
)

// Group is the set of reverse listeners of one configuration: one Listener
// per distinct address, each carrying the agents configured on it.
type Group struct {
	lns    []*Listener
	byName map[string]*Listener
}

// NewGroup builds the listeners of specs (see ListenerConfigs) and binds
// their sockets. On error nothing stays bound.
func NewGroup(specs []AgentSpec, log zerolog.Logger) (*Group, error) {
	cfgs, err := ListenerConfigs(specs)
	if err != nil {
		return nil, err
	}
	g := &Group{byName: make(map[string]*Listener)}
	for _, c := range cfgs {
		addr := c.UnixPath
		if addr == "" {
			addr = c.TCPAddr
		}
		l, err := NewListener(c, log.With().Str("reverse_listener", addr).Logger())
		if err != nil {
			_ = g.Close()
			return nil, err
		}
		g.lns = append(g.lns, l)
		for _, a := range c.Agents {
			g.byName[a.Name] = l
		}
	}
	return g, nil
}

// Agent returns the pool of the named agent, or an error naming it when
// no reverse agent of that name is configured.
func (g *Group) Agent(name string) (agentmux.Agent, error) {
	l := g.byName[name]
	if l == nil {
		return nil, fmt.Errorf("%w: no reverse agent %q", ErrReverseConfig, name)
	}
	return l.Agent(name), nil
}

// Listeners returns the group's listeners (for addresses and Stats).
func (g *Group) Listeners() []*Listener { return g.lns }

// Serve serves every listener until ctx ends or Close is called. It
// returns the first listener failure, after closing them all.
func (g *Group) Serve(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(g.lns))
	for i, l := range g.lns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := l.Serve(ctx); err != nil && !errors.Is(err, ErrReverseClosed) {
				errs[i] = err
				cancel()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Close closes every listener, draining their pools.
func (g *Group) Close() error {
	for _, l := range g.lns {
		_ = l.Close()
	}
	return nil
}
