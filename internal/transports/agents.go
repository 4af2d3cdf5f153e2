package transports

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/reverse"
)

// retireWait bounds how long a reverse listener a reload dropped waits
// for the requests still using its agents before it closes.
const retireWait = 30 * time.Second

// ErrAgentsClosed: Build was called after Close.
var ErrAgentsClosed = errors.New("transports: closed")

// Agents builds the agent instances of a running sidecar, of every
// transport, through one table of factories (Dialing's and the reverse
// one), and keeps them across reloads: Build reuses every instance whose
// InstanceKey did not change.
//
// It owns the reverse listeners. The reverse agents of one address share
// one listener, whose settings are theirs (ReverseListenerConfigs). A
// reload keeps a listener, and the connections registered on it, while
// the instance keys of its agents are the same; binds one at a new
// address; retires one whose address is gone (it closes once its agents
// are idle, after at most 30 s); and refuses to change one in place, with
// an error wrapping config.ErrConfigInvalid that says to restart: the
// connections on it registered under its settings.
//
// The instances handed to the dataplane are the dataplane's to close
// (it closes those a swap replaced, and all of them at shutdown); Close
// closes the listeners. One Build at a time: each is committed or aborted
// before the next (the supervisor serializes reloads); Agent, Listeners
// and Close are safe at any time.
type Agents struct {
	log    zerolog.Logger
	failed func(error)
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // serving and retiring listeners

	mu       sync.Mutex
	cur      *set // the committed set, being served
	retiring []*reverse.Listener
	closed   bool
}

// set is the agent instances of one configuration.
type set struct {
	agents map[string]agentmux.Agent
	keys   map[string]Key
	// lns are the reverse listeners, in configuration order.
	lns []*revListener
}

// revListener is a reverse listener of a set.
type revListener struct {
	// addr is the address as agents configure it: "unix:/path" or
	// host:port.
	addr string
	// keys are the instance keys of its agents, sorted by name.
	keys []Key
	cfg  reverse.Config
	l    *reverse.Listener // nil until the first of its agents is built
}

// NewAgents returns an Agents that logs to log and reports to failed a
// reverse listener whose socket fails while it serves (the sidecar
// cannot go on without it).
func NewAgents(log zerolog.Logger, failed func(error)) *Agents {
	ctx, cancel := context.WithCancel(context.Background())
	return &Agents{log: log, failed: failed, ctx: ctx, cancel: cancel}
}

// Build is the agent instances of one configuration, built by
// Agents.Build: to Commit once the dataplane serves them, or to Abort.
type Build struct {
	r    *Agents
	prev *set
	set  *set
	// fresh are the instances built here, newLns the listeners bound
	// here: closed by Abort.
	fresh  []agentmux.Agent
	newLns []*reverse.Listener
	// retired are the listeners of the committed set that this one no
	// longer has: retired by Commit.
	retired []*reverse.Listener
	done    bool
}

// Build builds the agents of cfg, which passed Check, reusing the
// instances and reverse listeners of the committed set that it may keep
// (see Agents). Agents that dial start connecting in the background; the
// reverse listeners it binds are served at once, so that agents can
// register before the dataplane uses them. On error nothing built here
// stays open and the committed set is untouched.
func (r *Agents) Build(cfg *config.Config) (_ *Build, err error) {
	r.mu.Lock()
	prev, closed := r.cur, r.closed
	r.mu.Unlock()
	if closed {
		return nil, ErrAgentsClosed
	}
	if prev == nil {
		prev = &set{}
	}
	b := &Build{r: r, prev: prev, set: &set{
		agents: make(map[string]agentmux.Agent, len(cfg.Agents)),
		keys:   make(map[string]Key, len(cfg.Agents)),
	}}
	defer func() {
		if err != nil {
			b.Abort()
		}
	}()
	if err := b.planListeners(cfg); err != nil {
		return nil, err
	}
	factories := ForConfig(cfg)
	factories[config.TransportReverse] = b.newReverse
	next := b.set
	for i := range cfg.Agents {
		a := &cfg.Agents[i]
		key := RouteKey(cfg, a)
		next.keys[a.Name] = key
		if old := prev.agents[a.Name]; old != nil && prev.keys[a.Name] == key {
			next.agents[a.Name] = old
			continue
		}
		f := factories[a.Transport]
		if f == nil {
			return nil, fmt.Errorf("agent %q: transport %q is not available", a.Name, a.Transport)
		}
		inst, err := f(a, r.log.With().Str("agent", a.Name).Logger())
		if err != nil {
			return nil, err
		}
		b.fresh = append(b.fresh, inst)
		next.agents[a.Name] = inst
	}
	for _, rl := range prev.lns {
		if !slices.Contains(next.lns, rl) {
			b.retired = append(b.retired, rl.l)
		}
	}
	for _, l := range b.newLns {
		r.serve(l)
	}
	return b, nil
}

// planListeners decides the reverse listeners of cfg, one per address:
// the committed set's when its agents' keys are the same, refused when
// they differ, to be bound (by the first of its agents built) when the
// address is new.
func (b *Build) planListeners(cfg *config.Config) error {
	lcs, err := ReverseListenerConfigs(ReverseSpecs(cfg))
	if err != nil {
		return invalidConfig{err}
	}
	groups := map[string][]Key{}
	for i := range cfg.Agents {
		a := &cfg.Agents[i]
		if a.Transport == config.TransportReverse {
			groups[a.Address] = append(groups[a.Address], InstanceKey(*a))
		}
	}
	for _, g := range groups {
		slices.SortFunc(g, func(x, y Key) int { return cmp.Compare(x.Name, y.Name) })
	}
	for _, lc := range lcs {
		addr := configAddr(lc)
		keys := groups[addr]
		if old := b.prev.listener(addr); old != nil {
			if !slices.Equal(old.keys, keys) {
				return invalidConfig{fmt.Errorf("config: the reverse listener at %s changed; restart to apply", addr)}
			}
			b.set.lns = append(b.set.lns, old)
			continue
		}
		b.set.lns = append(b.set.lns, &revListener{addr: addr, keys: keys, cfg: lc})
	}
	return nil
}

// newReverse is the factory of transport reverse: the pool of a on the
// listener at its address, bound here by the first of its agents.
func (b *Build) newReverse(a *config.Agent, _ zerolog.Logger) (agentmux.Agent, error) {
	rl := b.set.listener(a.Address)
	if rl == nil {
		return nil, fmt.Errorf("agent %q: no reverse listener", a.Name)
	}
	if rl.l == nil {
		l, err := reverse.NewListener(rl.cfg, b.r.log.With().Str("component", "reverse").Logger())
		if err != nil {
			return nil, err
		}
		rl.l = l
		b.newLns = append(b.newLns, l)
	}
	inst := rl.l.Agent(a.Name)
	if inst == nil {
		return nil, fmt.Errorf("agent %q: not on the reverse listener at %s", a.Name, rl.addr)
	}
	return inst, nil
}

// listener returns the listener of s at addr, or nil.
func (s *set) listener(addr string) *revListener {
	for _, rl := range s.lns {
		if rl.addr == addr {
			return rl
		}
	}
	return nil
}

// configAddr is a reverse listener's address as agents configure it.
func configAddr(c reverse.Config) string {
	if c.UnixPath != "" {
		return "unix:" + c.UnixPath
	}
	return c.TCPAddr
}

// Agents returns the instance of every agent of the configuration, by
// name, for the dataplane.
func (b *Build) Agents() map[string]agentmux.Agent { return b.set.agents }

// Fresh returns the instances built by this Build (the others are the
// committed set's, already connected or connecting): those to wait for
// before the dataplane uses them.
func (b *Build) Fresh() map[string]agentmux.Agent {
	out := make(map[string]agentmux.Agent, len(b.fresh))
	for name, a := range b.set.agents {
		if slices.Contains(b.fresh, a) {
			out[name] = a
		}
	}
	return out
}

// Commit makes b the committed set, once the dataplane serves its
// instances: the listeners the previous set had and b has not are
// retired, closing once no request uses their agents (at most 30 s).
func (b *Build) Commit() {
	r := b.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if b.done {
		return
	}
	b.done = true
	r.cur = b.set
	for _, l := range b.retired {
		r.retiring = append(r.retiring, l)
		r.wg.Add(1)
		go r.retire(l)
	}
}

// Abort closes what b built (its instances and listeners); the
// committed set is untouched. It does nothing after Commit.
func (b *Build) Abort() {
	b.r.mu.Lock()
	done := b.done
	b.done = true
	b.r.mu.Unlock()
	if done {
		return
	}
	for _, a := range b.fresh {
		_ = a.Close()
	}
	for _, l := range b.newLns {
		_ = l.Close()
	}
}

// serve serves l until it is closed; a listener whose socket fails is
// reported to failed (one closed before it was served is not a failure).
func (r *Agents) serve(l *reverse.Listener) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		if err := l.Serve(r.ctx); err != nil && !errors.Is(err, reverse.ErrReverseClosed) {
			r.failed(err)
		}
	}()
}

// retire closes l, a listener a reload dropped, once the requests still
// using its agents are done (bounded by retireWait), or at Close.
func (r *Agents) retire(l *reverse.Listener) {
	defer r.wg.Done()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	deadline := time.Now().Add(retireWait)
	for busy(l) && time.Now().Before(deadline) {
		select {
		case <-t.C:
		case <-r.ctx.Done():
			_ = l.Close()
			return
		}
	}
	_ = l.Close()
}

// busy reports whether a request is using an agent of l.
func busy(l *reverse.Listener) bool {
	for _, name := range l.Agents() {
		if l.Agent(name).Snapshot().InFlight > 0 {
			return true
		}
	}
	return false
}

// Agent returns the committed instance of the named agent, or nil.
func (r *Agents) Agent(name string) agentmux.Agent {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur == nil {
		return nil
	}
	return r.cur.agents[name]
}

// Listeners returns the reverse listeners of the committed set, in
// configuration order.
func (r *Agents) Listeners() []*reverse.Listener {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur == nil {
		return nil
	}
	out := make([]*reverse.Listener, len(r.cur.lns))
	for i, rl := range r.cur.lns {
		out[i] = rl.l
	}
	return out
}

// Close closes the reverse listeners, those being retired included (and
// with them the pools of the reverse agents), and waits for them. The
// other instances are the dataplane's to close; a Build not committed is
// its caller's to Abort.
func (r *Agents) Close() {
	r.mu.Lock()
	r.closed = true
	retiring := r.retiring
	r.retiring = nil
	var lns []*revListener
	if r.cur != nil {
		lns = r.cur.lns
	}
	r.mu.Unlock()
	r.cancel()
	for _, l := range retiring {
		_ = l.Close()
	}
	for _, rl := range lns {
		_ = rl.l.Close()
	}
	r.wg.Wait()
}

// invalidConfig marks an error found while checking a configuration
// outside package config (transport options, reverse listeners that
// cannot change) as the operator's: it wraps config.ErrConfigInvalid (the
// admin listener answers 400) and keeps its text.
type invalidConfig struct{ err error }

func (e invalidConfig) Error() string   { return e.err.Error() }
func (e invalidConfig) Unwrap() []error { return []error{e.err, config.ErrConfigInvalid} }
