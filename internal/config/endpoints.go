package config

import (
	"fmt"
	"net"
	"strings"
	"time"
)

// Load-balancing policies of an upstream with several endpoints.
const (
	// BalanceRoundRobin takes the available endpoints in turn.
	BalanceRoundRobin = "round_robin"
	// BalanceLeastInFlight takes the available endpoint with the fewest
	// requests in flight.
	BalanceLeastInFlight = "least_in_flight"
)

// Bounds of the endpoint settings.
const (
	// MaxEndpoints caps the endpoints of one upstream, resolved ones
	// included.
	MaxEndpoints = 64
	// MaxEndpointAttempts caps the endpoints one request may try.
	MaxEndpointAttempts = 8
	// MinHealthInterval is the shortest active health check interval.
	MinHealthInterval = 100 * time.Millisecond
	// MinResolveInterval is the shortest DNS re-resolution interval.
	MinResolveInterval = time.Second
)

// HealthCheck is an upstream's active health check: a GET of Path on each
// endpoint every Interval; a 2xx or 3xx answer within Timeout passes.
// No Path: no active checks.
type HealthCheck struct {
	// Path is the request target of the check, starting with "/".
	Path string `yaml:"path"`
	// Interval is the time between two checks of an endpoint (default 5s).
	Interval time.Duration `yaml:"interval"`
	// Timeout bounds one check, connection included (default 1s).
	Timeout time.Duration `yaml:"timeout"`
	// HealthyThreshold is how many consecutive passed checks bring an
	// unhealthy or ejected endpoint back (default 2).
	HealthyThreshold int `yaml:"healthy_threshold"`
	// UnhealthyThreshold is how many consecutive failed checks take an
	// endpoint out (default 3).
	UnhealthyThreshold int `yaml:"unhealthy_threshold"`
}

// Ejection is an upstream's passive health check: an endpoint whose
// requests fail several times in a row is taken out for Time.
type Ejection struct {
	// Consecutive5xx ejects an endpoint after this many 5xx answers in a
	// row (default 5; -1 turns it off).
	Consecutive5xx int `yaml:"consecutive_5xx"`
	// ConsecutiveErrors ejects an endpoint after this many connection
	// failures in a row: refused or failed connects, connections that
	// broke before an answer (default 3; -1 turns it off).
	ConsecutiveErrors int `yaml:"consecutive_errors"`
	// Time is how long an ejected endpoint stays out, unless its active
	// health check passes before (default 30s).
	Time time.Duration `yaml:"time"`
}

// Resolve is the periodic DNS re-resolution of an upstream's endpoints
// given by host name: each name stands for the addresses it resolves to.
type Resolve struct {
	// Interval is the time between two resolutions (0, default: off; the
	// name is then resolved when connections are made).
	Interval time.Duration `yaml:"interval"`
	// Timeout bounds one resolution (default 2s).
	Timeout time.Duration `yaml:"timeout"`
	// MaxAddresses caps the addresses kept per name (default 8).
	MaxAddresses int `yaml:"max_addresses"`
}

// EndpointList is the upstream's endpoint addresses as configured:
// Endpoints, or Address alone.
func (u *Upstream) EndpointList() []string {
	if len(u.Endpoints) > 0 {
		return u.Endpoints
	}
	if u.Address == "" {
		return nil
	}
	return []string{u.Address}
}

// MaxEndpointCount is the most endpoints the upstream can have at once,
// resolved names counted at their MaxAddresses.
func (u *Upstream) MaxEndpointCount() int {
	eps := u.EndpointList()
	if u.Resolve.Interval <= 0 {
		return max(1, len(eps))
	}
	n := 0
	for _, e := range eps {
		if isHostName(e) {
			n += u.Resolve.MaxAddresses
		} else {
			n++
		}
	}
	return min(max(1, n), MaxEndpoints)
}

// isHostName reports whether addr is host:port with a name (not an IP).
func isHostName(addr string) bool {
	if strings.HasPrefix(addr, "unix:") {
		return false
	}
	host, _, err := net.SplitHostPort(addr)
	return err == nil && host != "" && net.ParseIP(host) == nil
}

func (u *Upstream) setEndpointDefaults() {
	if u.Balance == "" {
		u.Balance = BalanceRoundRobin
	}
	setInt(&u.EndpointAttempts, 3)
	h := &u.HealthCheck
	setDur(&h.Interval, 5*time.Second)
	setDur(&h.Timeout, time.Second)
	setInt(&h.HealthyThreshold, 2)
	setInt(&h.UnhealthyThreshold, 3)
	e := &u.Ejection
	setInt(&e.Consecutive5xx, 5)
	setInt(&e.ConsecutiveErrors, 3)
	setDur(&e.Time, 30*time.Second)
	setDur(&u.Resolve.Timeout, 2*time.Second)
	setInt(&u.Resolve.MaxAddresses, 8)
}

// upstreamEndpoints validates the endpoint keys of upstream u at path p.
func (v *validator) upstreamEndpoints(p string, u *Upstream) {
	switch {
	case u.Address != "" && len(u.Endpoints) > 0:
		v.failf(p+".endpoints", "set address or endpoints, not both")
	case len(u.Endpoints) > MaxEndpoints:
		v.failf(p+".endpoints", "%d endpoints (at most %d)", len(u.Endpoints), MaxEndpoints)
	case len(u.Endpoints) > 0:
		seen := map[string]bool{}
		for i, e := range u.Endpoints {
			ep := fmt.Sprintf("%s.endpoints[%d]", p, i)
			v.address(ep, e, false)
			if seen[e] {
				v.failf(ep, "endpoint %q is listed twice", e)
			}
			seen[e] = true
		}
	default:
		v.address(p+".address", u.Address, false)
	}
	switch u.Balance {
	case BalanceRoundRobin, BalanceLeastInFlight:
	default:
		v.failf(p+".balance", "unknown balance %q (want %s or %s)", u.Balance, BalanceRoundRobin, BalanceLeastInFlight)
	}
	if u.EndpointAttempts < 1 || u.EndpointAttempts > MaxEndpointAttempts {
		v.failf(p+".endpoint_attempts", "%d is not in 1..%d", u.EndpointAttempts, MaxEndpointAttempts)
	}
	h := &u.HealthCheck
	hp := p + ".health_check"
	if h.Path != "" && (h.Path[0] != '/' || strings.ContainsAny(h.Path, " \t\r\n\x00")) {
		v.failf(hp+".path", "%q is not an origin-form path (want /...)", h.Path)
	}
	if h.Interval < MinHealthInterval {
		v.failf(hp+".interval", "must be at least %s", MinHealthInterval)
	}
	v.positive(hp+".timeout", h.Timeout)
	if h.Timeout > h.Interval {
		v.failf(hp+".timeout", "%s is longer than the interval %s", h.Timeout, h.Interval)
	}
	if h.HealthyThreshold < 1 || h.HealthyThreshold > 100 {
		v.failf(hp+".healthy_threshold", "%d is not in 1..100", h.HealthyThreshold)
	}
	if h.UnhealthyThreshold < 1 || h.UnhealthyThreshold > 100 {
		v.failf(hp+".unhealthy_threshold", "%d is not in 1..100", h.UnhealthyThreshold)
	}
	e := &u.Ejection
	ejp := p + ".ejection"
	if e.Consecutive5xx < -1 || e.Consecutive5xx > 1000 {
		v.failf(ejp+".consecutive_5xx", "%d is not in 1..1000 (or -1: off)", e.Consecutive5xx)
	}
	if e.ConsecutiveErrors < -1 || e.ConsecutiveErrors > 1000 {
		v.failf(ejp+".consecutive_errors", "%d is not in 1..1000 (or -1: off)", e.ConsecutiveErrors)
	}
	v.positive(ejp+".time", e.Time)
	r := &u.Resolve
	rp := p + ".resolve"
	if r.Interval < 0 || (r.Interval > 0 && r.Interval < MinResolveInterval) {
		v.failf(rp+".interval", "must be 0 (off) or at least %s", MinResolveInterval)
	}
	v.positive(rp+".timeout", r.Timeout)
	if r.MaxAddresses < 1 || r.MaxAddresses > MaxEndpoints {
		v.failf(rp+".max_addresses", "%d is not in 1..%d", r.MaxAddresses, MaxEndpoints)
	}
}
