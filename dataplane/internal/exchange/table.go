package exchange

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zentinelproxy/sidecar/dataplane/internal/ratelog"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/observe"
)

// Table is one immutable routing table: routes resolved to upstreams and
// agents by index. Requests load it once; a swap publishes a new one.
type Table struct {
	cfg       *config.Config
	routes    []*route
	agents    []*agentEntry
	upstreams []Upstream

	exact map[string][]*route // host → routes, longest prefix first
	wild  map[string][]*route // ".example.com" → routes
	any   []*route
	// maxWild is the most dots of a wildcard suffix, bounding lookups.
	maxWild int
	// lstLimits are the listeners' rate limits, by listener name (nil:
	// none).
	lstLimits map[string]*routeLimit
	// rls is the rate limit service of routes' global_rate_limit (nil:
	// none; globalrl.go).
	rls *rlService

	// routeIDs and agentIDs number names for the Observer. Each table
	// inherits them from the one it replaces, so an index keeps meaning
	// the same name across swaps, also for requests still running on the
	// old table.
	routeIDs, agentIDs *nameIDs

	refs    atomic.Int64
	retired atomic.Bool
	drained sync.Once
	onDrain func()
}

// ErrConfig is a configuration that cannot be served (a missing agent
// instance, too many agents on a route).
var ErrConfig = errors.New("dataplane: invalid configuration")

// nameIDs assigns each name an index once; names only grow.
type nameIDs struct {
	byName map[string]int
	names  []string
}

// clone copies n (nil: empty) so that a failed build leaves n unchanged.
func (n *nameIDs) clone() *nameIDs {
	c := &nameIDs{byName: make(map[string]int)}
	if n != nil {
		for k, v := range n.byName {
			c.byName[k] = v
		}
		c.names = append([]string(nil), n.names...)
	}
	return c
}

func (n *nameIDs) id(name string) int {
	if i, ok := n.byName[name]; ok {
		return i
	}
	n.byName[name] = len(n.names)
	n.names = append(n.names, name)
	return len(n.names) - 1
}

type agentEntry struct {
	name   string
	nameB  []byte
	idx    int
	agent  agentmux.Agent
	limits agentLimits
	// Log rate limits: refused operations, and failures per outcome.
	logRefused ratelog.Limit
	logFail    [observe.NumOutcomes]ratelog.Limit
	// brk is the agent's circuit breaker (nil: off; breaker.go).
	brk *breaker
	// shadow runs a shadow agent's events (nil: an enforcing agent;
	// shadow.go).
	shadow *shadowRunner
	// cache is the agent's decision cache (nil: off; cache.go).
	cache *decisionCache
	// failover retries a request-header event whose connection was lost
	// (failover.go); fo counts it and the over-limit bodies (prefix.go).
	failover bool
	fo       *agentStats
}

// Host header modes.
const (
	hostPreserve = iota
	hostUpstream
	hostLiteral
)

type route struct {
	name     string
	nameB    []byte
	idx      int
	prefix   []byte
	up       Upstream
	agents   []routeAgent
	shadows  []*shadowRunner // observe-only agents (shadow.go)
	hostMode uint8
	hostLit  []byte

	// shadowBody is the body policy of each of shadows on this route.
	shadowBody [][2]bodyPolicy

	// ext is the route's other conditions and its actions (routing.go).
	ext routeExt
}

// Body modes resolved from config (auto is resolved per request from the
// agent's capabilities).
const (
	bodyAuto uint8 = iota
	bodyNone
	bodyBuffered
	bodyStreaming
)

type bodyPolicy struct {
	mode   uint8
	limit  int
	reject bool
	chunk  int
	// Over the limit: inspect the prefix only, or stream (prefix.go).
	prefix, stream bool
}

type routeAgent struct {
	a        *agentEntry
	failOpen bool
	// failStatus and failBody answer a fail-closed failure other than a
	// timeout (config.Policy.FailureStatus).
	failStatus int
	failBody   string
	timeout    time.Duration
	body       [2]bodyPolicy // by protocol.Phase
}

// resolveBody resolves a body policy. Its limit and chunk size are
// defaulted once, by the configuration (config.SetDefaults), and are
// never zero in a validated one.
func resolveBody(b config.BodyPolicy) bodyPolicy {
	p := bodyPolicy{limit: int(b.Limit), reject: b.OverLimit == config.OverLimitReject, chunk: int(b.ChunkSize),
		prefix: b.OverLimit == config.OverLimitPrefix, stream: b.OverLimit == config.OverLimitStream}
	switch b.Mode {
	case config.BodyNone:
		p.mode = bodyNone
	case config.BodyBuffered:
		p.mode = bodyBuffered
	case config.BodyStreaming:
		p.mode = bodyStreaming
	default:
		p.mode = bodyAuto
	}
	return p
}

// BuildTable resolves cfg against the agent instances and ups, the
// upstreams of cfg in its order. The per-agent policy state (breakers,
// shadow runners, decision caches, counters) is carried over from prev
// (the table being replaced, or nil) where the agent and its settings did
// not change.
func BuildTable(cfg *config.Config, agents map[string]agentmux.Agent, ups []Upstream, prev *Table) (*Table, error) {
	t := &Table{
		cfg:   cfg,
		exact: make(map[string][]*route),
		wild:  make(map[string][]*route),
	}
	if prev != nil {
		t.routeIDs, t.agentIDs = prev.routeIDs.clone(), prev.agentIDs.clone()
	} else {
		t.routeIDs, t.agentIDs = (*nameIDs)(nil).clone(), (*nameIDs)(nil).clone()
	}
	byName := make(map[string]*agentEntry, len(cfg.Agents))
	for i := range cfg.Agents {
		a := &cfg.Agents[i]
		inst, ok := agents[a.Name]
		if !ok || inst == nil {
			return nil, fmt.Errorf("%w: agent %q has no instance", ErrConfig, a.Name)
		}
		e := &agentEntry{name: a.Name, nameB: []byte(a.Name), idx: t.agentIDs.id(a.Name), agent: inst,
			limits: agentLimits{ops: a.Limits.HeaderOps, bytes: int(a.Limits.HeaderBytes), value: int(a.Limits.HeaderValue), block: int(a.Limits.HeaderBlock)}}
		e.brk = breakerFor(prev, a.Name, inst, a.CircuitBreaker)
		e.shadow = shadowFor(prev, a, inst)
		byRoute := a.Transport == config.TransportExtAuthz && len(cfg.RouteContextExtensions(a.Name)) > 0
		c, err := cacheFor(prev, a, inst, byRoute)
		if err != nil {
			return nil, err
		}
		e.cache = c
		e.failover, e.fo = a.FailoverOn(), failoverFor(prev, a.Name, inst)
		t.agents = append(t.agents, e)
		byName[a.Name] = e
	}
	for i := range cfg.Listeners {
		l := &cfg.Listeners[i]
		if l.RateLimit == nil {
			continue
		}
		if t.lstLimits == nil {
			t.lstLimits = make(map[string]*routeLimit)
		}
		if old := prev.listenerLimit(l.Name); old != nil && old.cfg == *l.RateLimit {
			t.lstLimits[l.Name] = old // its buckets survive a reload
		} else {
			t.lstLimits[l.Name] = newRouteLimit(l.Name, l.RateLimit)
		}
	}
	byUp := make(map[string]Upstream, len(ups))
	for _, up := range ups {
		byUp[up.Name()] = up
	}
	t.upstreams = ups
	for i := range cfg.Routes {
		rc := &cfg.Routes[i]
		r := &route{name: rc.Name, nameB: []byte(rc.Name), idx: t.routeIDs.id(rc.Name), prefix: []byte(rc.PathPrefix), up: byUp[rc.Upstream]}
		if r.up == nil && (rc.Upstream != "" || rc.DirectResponse == nil && rc.Redirect == nil) {
			return nil, fmt.Errorf("%w: route %q: unknown upstream %q", ErrConfig, rc.Name, rc.Upstream)
		}
		if err := compileRoute(rc, r, prev); err != nil {
			return nil, err
		}
		switch rc.HostHeader {
		case config.HostPreserve, "":
			r.hostMode = hostPreserve
		case config.HostUpstream:
			r.hostMode = hostUpstream
		default:
			r.hostMode = hostLiteral
			r.hostLit = []byte(rc.HostHeader)
		}
		for j := range rc.Agents {
			ra := &rc.Agents[j]
			e := byName[ra.Name]
			if e == nil {
				return nil, fmt.Errorf("%w: route %q: unknown agent %q", ErrConfig, rc.Name, ra.Name)
			}
			if ra.ExtAuthz != nil && ra.ExtAuthz.Disabled {
				continue // Envoy's ExtAuthzPerRoute disabled: not checked here
			}
			p := cfg.Policy(ra)
			if e.shadow != nil {
				r.shadows = append(r.shadows, e.shadow)
				r.shadowBody = append(r.shadowBody, [2]bodyPolicy{resolveBody(p.RequestBody), resolveBody(p.ResponseBody)})
				continue
			}
			r.agents = append(r.agents, routeAgent{
				a:          e,
				failOpen:   p.FailOpen,
				failStatus: p.FailureStatus,
				failBody:   strings.ToLower(StatusText(p.FailureStatus)),
				timeout:    p.Timeout,
				body:       [2]bodyPolicy{resolveBody(p.RequestBody), resolveBody(p.ResponseBody)},
			})
		}
		if len(r.agents) > maxAgents {
			return nil, fmt.Errorf("%w: route %q has %d agents (at most %d)", ErrConfig, rc.Name, len(r.agents), maxAgents)
		}
		t.routes = append(t.routes, r)
		hosts := rc.Hosts
		if len(hosts) == 0 {
			hosts = []string{"*"}
		}
		for _, h := range hosts {
			h = config.CanonicalHost(h)
			switch {
			case h == "*":
				t.any = append(t.any, r)
			case strings.HasPrefix(h, "*."):
				suffix := h[1:]
				t.wild[suffix] = append(t.wild[suffix], r)
				if n := strings.Count(suffix, "."); n > t.maxWild {
					t.maxWild = n
				}
			default:
				t.exact[h] = append(t.exact[h], r)
			}
		}
	}
	// The match order of one host's routes (routing.go): exact paths,
	// regular expressions, prefixes longest first; the file's order
	// among equals.
	byPrefix := func(rs []*route) {
		sort.SliceStable(rs, func(i, j int) bool {
			ki, li := rs[i].rank()
			kj, lj := rs[j].rank()
			if ki != kj {
				return ki < kj
			}
			return li < lj
		})
	}
	for _, rs := range t.exact {
		byPrefix(rs)
	}
	for _, rs := range t.wild {
		byPrefix(rs)
	}
	byPrefix(t.any)
	// Last, once nothing can fail: the service's connection is kept
	// from prev when its settings did not change.
	if s := cfg.RateLimitService; s != nil {
		if prev != nil && prev.rls != nil && prev.rls.cfg.Equal(s) {
			t.rls = prev.rls
		} else {
			rls, err := newRLService(s)
			if err != nil {
				return nil, fmt.Errorf("%w: rate_limit_service: %v", ErrConfig, err)
			}
			t.rls = rls
		}
	}
	return t, nil
}

// match finds the route for ex, whose host is lower case (no port), and
// its path.
func (t *Table) match(ex *Exchange, host, path []byte) *route {
	if rs, ok := t.exact[string(host)]; ok {
		if r := firstMatch(rs, ex, path); r != nil {
			return r
		}
	}
	if len(t.wild) > 0 {
		// Longest suffix first: "a.b.example.com" tries ".b.example.com"
		// before ".example.com".
		for i := 0; i < len(host); i++ {
			if host[i] != '.' {
				continue
			}
			if rs, ok := t.wild[string(host[i:])]; ok {
				if r := firstMatch(rs, ex, path); r != nil {
					return r
				}
			}
		}
	}
	return firstMatch(t.any, ex, path)
}

// firstMatch is the first of rs, in match order, whose conditions hold.
func firstMatch(rs []*route, ex *Exchange, path []byte) *route {
	for _, r := range rs {
		if r.matches(ex, path) {
			return r
		}
	}
	return nil
}

// acquire pins the table for one request.
func (t *Table) acquire() { t.refs.Add(1) }

// release unpins it; the last release of a retired table runs onDrain.
func (t *Table) release() {
	if t.refs.Add(-1) == 0 && t.retired.Load() {
		t.drained.Do(t.runDrain)
	}
}

// Retire marks t replaced by next: once no request uses t, the shadow
// runners next does not carry over stop, then onDrain runs.
func (t *Table) Retire(next *Table, onDrain func()) {
	keep := make(map[*shadowRunner]bool)
	for _, e := range next.agents {
		if e.shadow != nil {
			keep[e.shadow] = true
		}
	}
	t.retire(func() {
		if t.rls != next.rls {
			t.rls.close()
		}
		for _, e := range t.agents {
			if e.shadow != nil && !keep[e.shadow] {
				e.shadow.stop()
			}
		}
		onDrain()
	})
}

// retire marks the table replaced; onDrain runs once no request uses it.
func (t *Table) retire(onDrain func()) {
	t.onDrain = onDrain
	t.retired.Store(true)
	if t.refs.Load() == 0 {
		t.drained.Do(t.runDrain)
	}
}

func (t *Table) runDrain() {
	if t.onDrain != nil {
		t.onDrain()
	}
}

func (t *Table) routeNames() []string {
	n := make([]string, len(t.routes))
	for i, r := range t.routes {
		n[i] = r.name
	}
	return n
}

func (t *Table) agentNames() []string {
	n := make([]string, len(t.agents))
	for i, a := range t.agents {
		n[i] = a.name
	}
	return n
}

// rateLimitedBy is the refusals of the table's local limits, by limit
// (nil: no limit).
func (t *Table) rateLimitedBy() map[string]uint64 {
	var m map[string]uint64
	add := func(k string, rl *routeLimit) {
		if m == nil {
			m = make(map[string]uint64)
		}
		m[k] = rl.limited.Load()
	}
	for name, rl := range t.lstLimits {
		add("listener/"+name, rl)
	}
	for _, r := range t.routes {
		if r.ext.limit != nil {
			add("route/"+r.name, r.ext.limit)
		}
	}
	return m
}

// keysEvictedBy is the keys each keyed limit dropped to stay within its
// max_keys, by "scope/name" as rateLimitedBy (nil: no keyed limit).
func (t *Table) keysEvictedBy() map[string]uint64 {
	var m map[string]uint64
	add := func(k string, rl *routeLimit) {
		if rl.key == keyNone {
			return
		}
		if m == nil {
			m = make(map[string]uint64)
		}
		m[k] = rl.l.Evicted()
	}
	for name, rl := range t.lstLimits {
		add("listener/"+name, rl)
	}
	for _, r := range t.routes {
		if r.ext.limit != nil {
			add("route/"+r.name, r.ext.limit)
		}
	}
	return m
}

// retriesBy is the counters of the table's retry policies, by route
// (nil: no policy).
func (t *Table) retriesBy() map[string]observe.RouteRetryStats {
	var m map[string]observe.RouteRetryStats
	for _, r := range t.routes {
		if p := r.ext.retry; p != nil {
			if m == nil {
				m = make(map[string]observe.RouteRetryStats)
			}
			m[r.name] = p.stats()
		}
	}
	return m
}

// listenerLimit is the rate limit of the listener called name (nil: none,
// or no table).
func (t *Table) listenerLimit(name string) *routeLimit {
	if t == nil {
		return nil
	}
	return t.lstLimits[name]
}
