package upstream

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/dataplane/internal/ratelog"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/observe"
)

// Upstream is one configured upstream of a routing table: its endpoints,
// their pools and health state, its health checks and DNS
// re-resolution. A table swap builds a new Upstream from the previous
// one (New), keeping the endpoints whose settings did not change.
type Upstream struct {
	name    string
	nameB   []byte
	cfg     config.Upstream
	hostHdr []byte        // host:port sent as Host with host_header: upstream
	logErr  ratelog.Limit // rate limit of its error lines

	// Endpoints (endpoints.go): the current list, the round-robin
	// cursor, the balance policy and the attempts per request.
	eps           atomic.Pointer[epList]
	rr            atomic.Uint64
	leastInFlight bool
	attempts      int
	// h2: the upstream speaks HTTP/2 (h2 or h2c; h2.go).
	h2 bool
	// counters outlive reloads: a new table takes its predecessor's.
	counters *upCounters
	// stats are the server's upstream counters.
	stats *Counters

	// Health checks and re-resolution (health.go).
	log        *zerolog.Logger
	logResolve ratelog.Limit
	// lookup resolves endpoint names (nil: the default resolver).
	lookup   func(ctx context.Context, network, host string) ([]netip.Addr, error)
	stopCh   chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// upCounters are an upstream's counters beyond its endpoints'.
type upCounters struct {
	resolutions, resolveErrors, addrsDropped atomic.Uint64
}

// New makes the upstream of u, counting into stats; the endpoints of prev
// (the same upstream in the table being replaced, or nil) that did not
// change are kept, warm pools and health state included.
func New(u config.Upstream, prev *Upstream, stats *Counters) *Upstream {
	up := &Upstream{name: u.Name, nameB: []byte(u.Name), cfg: u, stats: stats,
		leastInFlight: u.Balance == config.BalanceLeastInFlight, attempts: max(1, u.EndpointAttempts),
		h2: u.Protocol == config.ProtoH2 || u.Protocol == config.ProtoH2C}
	up.eps.Store(buildEndpoints(&up.cfg, prev))
	if prev != nil {
		up.counters = prev.counters
	} else {
		up.counters = new(upCounters)
	}
	host := "localhost"
	if eps := u.EndpointList(); len(eps) > 0 && !strings.HasPrefix(eps[0], "unix:") {
		host = eps[0]
	}
	up.hostHdr = []byte(host)
	return up
}

// Name implements exchange.Upstream: the upstream's configured name.
func (up *Upstream) Name() string { return up.name }

// NameBytes is Name as bytes (request metadata), read-only.
func (up *Upstream) NameBytes() []byte { return up.nameB }

// HostHeader implements exchange.Upstream: the Host a request gets with
// host_header: upstream (the first endpoint's host:port), read-only.
func (up *Upstream) HostHeader() []byte { return up.hostHdr }

// Status is a snapshot of the upstream.
func (up *Upstream) Status() observe.UpstreamStatus {
	us := observe.UpstreamStatus{Name: up.name, Resolutions: up.counters.resolutions.Load(),
		ResolveErrors: up.counters.resolveErrors.Load(), AddressesDropped: up.counters.addrsDropped.Load()}
	for _, ep := range up.eps.Load().eps {
		us.Endpoints = append(us.Endpoints, observe.EndpointStatus{
			Upstream: up.name, Address: ep.addr,
			Healthy: !ep.unhealthy.Load(), Ejected: ep.ejected(),
			InFlight: ep.inflight.Load(),
			Requests: ep.requests.Load(), Errors: ep.errs.Load(), Status5xx: ep.status5xx.Load(),
			Ejections: ep.ejections.Load(), Checks: ep.checks.Load(), ChecksFailed: ep.checksFailed.Load(),
		})
	}
	return us
}

// Kept is the set of the endpoints of ups.
func Kept(ups []*Upstream) map[*Endpoint]bool {
	keep := make(map[*Endpoint]bool)
	for _, up := range ups {
		for _, ep := range up.eps.Load().eps {
			keep[ep] = true
		}
	}
	return keep
}

// CloseReplaced closes the idle connections of the endpoints of old that
// the new table (keep) does not use.
func CloseReplaced(old []*Upstream, keep map[*Endpoint]bool) {
	for _, up := range old {
		for _, ep := range up.eps.Load().eps {
			if !keep[ep] {
				ep.closeIdle()
			}
		}
	}
}
