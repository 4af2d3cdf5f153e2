package upstream

import (
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/dataplane/internal/clock"
	"github.com/zentinelproxy/sidecar/dataplane/internal/ratelog"
	"github.com/zentinelproxy/sidecar/internal/config"
)

// An upstream is one or more endpoints, each with its own connection
// pool. A request takes an available endpoint (round robin or least in
// flight); an endpoint is unavailable while its active health check says
// unhealthy or while it is ejected after consecutive failures (passive
// health check). When no endpoint is available the request goes to one
// anyway: a guess beats a certain 503. Endpoint objects carry their state
// across reloads when their address and client settings are unchanged.

// Endpoint is one address of an upstream.
type Endpoint struct {
	addr   string // what is dialed: host:port or unix:/path
	origin string // the configured entry it came from (a name when resolved)
	key    clientKey
	hc     *fasthttp.HostClient
	// h2 is the endpoint's HTTP/2 transport (protocol h2 or h2c; h2.go),
	// nil over HTTP/1.
	h2 *h2Pool

	inflight atomic.Int64
	// Counters (EndpointStatus).
	requests, errs, status5xx, ejections, checks, checksFailed atomic.Uint64

	// Passive: consecutive failures, and the mono time (ns) until which
	// the endpoint is ejected (0: not ejected).
	consec5xx, consecErr atomic.Int32
	ejectedUntil         atomic.Int64
	// Active: the health check's verdict and its current runs.
	unhealthy      atomic.Bool
	okRun, failRun atomic.Int32

	checkHC  atomic.Pointer[fasthttp.HostClient]
	logState ratelog.Limit
}

// clientKey is what an endpoint's connection pool depends on besides the
// address: a reload that changes none of it keeps the endpoint.
type clientKey struct {
	connect, keepAlive, maxWait time.Duration
	maxConns, rbuf, wbuf        int
	tls                         string // tls.go
	protocol                    string
	idle                        time.Duration
}

func keyOf(u *config.Upstream) clientKey {
	return clientKey{connect: u.ConnectTimeout, keepAlive: u.KeepAlive, maxWait: u.MaxConnWait,
		maxConns: u.MaxConns, rbuf: int(u.ReadBufferSize), wbuf: int(u.WriteBufferSize), tls: upstreamTLSKey(u),
		protocol: u.Protocol, idle: u.IdleTimeout}
}

// epList is an upstream's endpoints at one time; replaced whole when DNS
// re-resolution changes it.
type epList struct {
	eps []*Endpoint
}

// upstreamDial is the dial function of an endpoint address: every
// upstream connection is made here. origin is the configured entry addr
// came from: a resolved address is verified by TLS against its name.
func upstreamDial(u *config.Upstream, addr, origin string) (dial fasthttp.DialFunc, hcAddr string) {
	connect := u.ConnectTimeout
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		return withUpstreamTLS(u, origin, func(string) (net.Conn, error) { return wrapUp(net.DialTimeout("unix", path, connect)) }), "localhost"
	}
	return withUpstreamTLS(u, origin, func(a string) (net.Conn, error) { return wrapUp(fasthttp.DialTimeout(a, connect)) }), addr
}

func newEndpoint(u *config.Upstream, addr, origin string) *Endpoint {
	dial, hcAddr := upstreamDial(u, addr, origin)
	ep := &Endpoint{addr: addr, origin: origin, key: keyOf(u)}
	ep.hc = &fasthttp.HostClient{
		Addr:                          hcAddr,
		Dial:                          dial,
		MaxConns:                      u.MaxConns,
		MaxIdleConnDuration:           u.KeepAlive,
		MaxConnWaitTimeout:            u.MaxConnWait,
		ReadBufferSize:                int(u.ReadBufferSize),
		WriteBufferSize:               int(u.WriteBufferSize),
		DisablePathNormalizing:        true,
		DisableHeaderNamesNormalizing: false,
		NoDefaultUserAgentHeader:      true,
		SecureErrorLogMessage:         true,
		ConnPoolStrategy:              fasthttp.LIFO,
	}
	if u.Protocol == config.ProtoH2 || u.Protocol == config.ProtoH2C {
		ep.h2 = newH2Pool(u, dial, hcAddr)
	}
	return ep
}

// available reports whether the endpoint may take requests now. *now is
// read from the clock only when an ejection must be checked.
func (ep *Endpoint) available(now *time.Duration) bool {
	if ep.unhealthy.Load() {
		return false
	}
	until := ep.ejectedUntil.Load()
	if until == 0 {
		return true
	}
	if *now == 0 {
		*now = clock.Mono()
	}
	if int64(*now) < until {
		return false
	}
	ep.ejectedUntil.CompareAndSwap(until, 0)
	return true
}

// ejected reports whether the endpoint is ejected now.
func (ep *Endpoint) ejected() bool {
	until := ep.ejectedUntil.Load()
	return until != 0 && int64(clock.Mono()) < until
}

// pick chooses the endpoint of an attempt, skipping those already tried;
// nil when every endpoint was tried.
func (up *Upstream) pick(tried []*Endpoint) *Endpoint {
	eps := up.eps.Load().eps
	n := len(eps)
	if n == 1 {
		if len(tried) > 0 {
			return nil
		}
		return eps[0]
	}
	start := int(up.rr.Add(1) % uint64(n))
	var now time.Duration
	best, fallback := -1, -1
	for i := 0; i < n; i++ {
		j := start + i
		if j >= n {
			j -= n
		}
		ep := eps[j]
		if wasTried(tried, ep) {
			continue
		}
		if fallback < 0 {
			fallback = j
		}
		if !ep.available(&now) {
			continue
		}
		if !up.leastInFlight {
			return ep
		}
		if best < 0 || ep.inflight.Load() < eps[best].inflight.Load() {
			best = j
		}
	}
	if best < 0 {
		best = fallback
	}
	if best < 0 {
		return nil
	}
	return eps[best]
}

func wasTried(tried []*Endpoint, ep *Endpoint) bool {
	for _, t := range tried {
		if t == ep {
			return true
		}
	}
	return false
}

// Passive health: outcomes of requests.

// succeeded records an answer below 500.
func (ep *Endpoint) succeeded() {
	if ep.consec5xx.Load() != 0 {
		ep.consec5xx.Store(0)
	}
	if ep.consecErr.Load() != 0 {
		ep.consecErr.Store(0)
	}
}

// got5xx records a 5xx answer.
func (up *Upstream) got5xx(ep *Endpoint) {
	ep.status5xx.Add(1)
	if ep.consecErr.Load() != 0 {
		ep.consecErr.Store(0)
	}
	if lim := up.cfg.Ejection.Consecutive5xx; lim > 0 && int(ep.consec5xx.Add(1)) >= lim {
		up.eject(ep, "consecutive 5xx")
	}
}

// failed records a connection failure (connect refused or timed out, a
// connection broken before the answer).
func (up *Upstream) failed(ep *Endpoint) {
	ep.errs.Add(1)
	if lim := up.cfg.Ejection.ConsecutiveErrors; lim > 0 && int(ep.consecErr.Add(1)) >= lim {
		up.eject(ep, "consecutive connection errors")
	}
}

// eject takes ep out for the ejection time. An upstream of one endpoint
// is never ejected: there is nowhere else to go.
func (up *Upstream) eject(ep *Endpoint, why string) {
	ep.consec5xx.Store(0)
	ep.consecErr.Store(0)
	if len(up.eps.Load().eps) < 2 {
		return
	}
	now := int64(clock.Mono())
	old := ep.ejectedUntil.Load()
	if old != 0 && now < old {
		return
	}
	if !ep.ejectedUntil.CompareAndSwap(old, now+int64(up.cfg.Ejection.Time)) {
		return
	}
	ep.ejections.Add(1)
	// Idle connections to it are suspect too.
	ep.hc.CloseIdleConnections()
	if ep.h2 != nil {
		ep.h2.closeIdle()
	}
	up.logTransition(ep, "upstream endpoint ejected", why)
}

func (up *Upstream) logTransition(ep *Endpoint, msg, why string) {
	if up.log == nil {
		return
	}
	if ok, suppressed := ep.logState.Allow(); ok {
		e := up.log.Warn().Str("upstream", up.name).Str("endpoint", ep.addr).Str("reason", why)
		if suppressed > 0 {
			e = e.Uint64("suppressed", suppressed)
		}
		e.Msg(msg)
	}
}

// buildEndpoints makes the endpoints of u, reusing those of prev (the
// same upstream in the previous table) whose address and client settings
// did not change, with their health state and counters.
func buildEndpoints(u *config.Upstream, prev *Upstream) *epList {
	key := keyOf(u)
	var old []*Endpoint
	if prev != nil {
		old = prev.eps.Load().eps
	}
	reuse := func(addr, origin string) *Endpoint {
		for _, ep := range old {
			if ep.addr == addr && ep.origin == origin && ep.key == key {
				return ep
			}
		}
		return newEndpoint(u, addr, origin)
	}
	l := &epList{}
	for _, e := range u.EndpointList() {
		if u.Resolve.Interval > 0 && isHostName(e) {
			// Keep what the last resolution found until the next one.
			n := 0
			for _, ep := range old {
				if ep.origin == e && ep.addr != e && ep.key == key && n < u.Resolve.MaxAddresses {
					l.eps = append(l.eps, ep)
					n++
				}
			}
			if n > 0 {
				continue
			}
		}
		l.eps = append(l.eps, reuse(e, e))
	}
	return l
}

func isHostName(addr string) bool {
	if strings.HasPrefix(addr, "unix:") {
		return false
	}
	host, _, err := net.SplitHostPort(addr)
	return err == nil && host != "" && net.ParseIP(host) == nil
}

// CloseIdle closes the idle connections of every endpoint.
func (up *Upstream) CloseIdle() {
	for _, ep := range up.eps.Load().eps {
		ep.closeIdle()
	}
}

// Start runs the upstream's health checks and DNS re-resolution until
// Stop.
func (up *Upstream) Start(log *zerolog.Logger) {
	up.log = log
	up.stopCh = make(chan struct{})
	if up.cfg.HealthCheck.Path != "" {
		up.wg.Add(1)
		go up.every(up.cfg.HealthCheck.Interval, up.checkAll)
	}
	if up.cfg.Resolve.Interval > 0 {
		up.wg.Add(1)
		go up.every(up.cfg.Resolve.Interval, up.resolveOnce)
	}
}

// Stop ends what Start began and waits for it (each wait is bounded by a
// check or resolution timeout).
func (up *Upstream) Stop() {
	if up.stopCh == nil {
		return
	}
	up.stopOnce.Do(func() { close(up.stopCh) })
	up.wg.Wait()
}
