package upstream

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// Active health checks and DNS re-resolution run in one goroutine each
// per upstream that has them, from the table's publication until it is
// replaced; the endpoint state they keep survives the replacement.

var valueHealthUA = []byte("sidecar-health-check")

// every runs run now and then every interval until the upstream stops
// (the health check and DNS re-resolution goroutines).
func (up *Upstream) every(interval time.Duration, run func()) {
	defer up.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		run()
		select {
		case <-up.stopCh:
			return
		case <-t.C:
		}
	}
}

// checkAll checks every endpoint at once, so that one slow endpoint does
// not delay the others; each check ends within the check timeout.
func (up *Upstream) checkAll() {
	var wg sync.WaitGroup
	for _, ep := range up.eps.Load().eps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			up.checkOne(ep)
		}()
	}
	wg.Wait()
}

// checkClient is the endpoint's own small pool for checks: a check must
// not wait behind requests for a connection (max_conns), nor take one
// from them.
func (ep *Endpoint) checkClient(up *Upstream) *fasthttp.HostClient {
	if c := ep.checkHC.Load(); c != nil {
		return c
	}
	dial, hcAddr := upstreamDial(&up.cfg, ep.addr, ep.origin)
	c := &fasthttp.HostClient{
		Addr:                   hcAddr,
		Dial:                   dial,
		MaxConns:               1,
		MaxIdleConnDuration:    2 * up.cfg.HealthCheck.Interval,
		ReadBufferSize:         int(up.cfg.ReadBufferSize),
		MaxResponseBodySize:    maxHealthBody,
		DisablePathNormalizing: true,
		SecureErrorLogMessage:  true,
	}
	if ep.checkHC.CompareAndSwap(nil, c) {
		return c
	}
	return ep.checkHC.Load()
}

// maxHealthBody bounds a health check's answer: an endpoint cannot make
// every check read (and hold) a body of its choosing; a larger one fails
// the check.
const maxHealthBody = 64 << 10

// checkOne runs one check of ep and moves its health state.
func (up *Upstream) checkOne(ep *Endpoint) {
	hc := &up.cfg.HealthCheck
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(hc.Path)
	req.Header.SetHostBytes(up.hostHdr)
	req.Header.SetUserAgentBytes(valueHealthUA)
	var err error
	status := 0
	if ep.h2 != nil {
		status, err = up.checkH2(ep)
	} else if err = ep.checkClient(up).DoTimeout(req, resp, hc.Timeout); err == nil {
		status = resp.StatusCode()
	}
	ep.checks.Add(1)
	if err == nil && (status < 200 || status > 399) {
		err = &healthStatusError{status: status}
	}
	if err == nil {
		ep.failRun.Store(0)
		if int(ep.okRun.Add(1)) < hc.HealthyThreshold {
			return
		}
		if ep.unhealthy.Swap(false) {
			up.logTransition(ep, "upstream endpoint healthy", "health check passed")
		}
		if until := ep.ejectedUntil.Load(); until != 0 && ep.ejectedUntil.CompareAndSwap(until, 0) {
			// Passing checks end an ejection early.
			up.logTransition(ep, "upstream endpoint returned", "health check passed")
		}
		return
	}
	ep.checksFailed.Add(1)
	ep.okRun.Store(0)
	if int(ep.failRun.Add(1)) >= hc.UnhealthyThreshold && !ep.unhealthy.Swap(true) {
		ep.hc.CloseIdleConnections()
		up.logTransition(ep, "upstream endpoint unhealthy", err.Error())
	}
}

// checkH2 runs a check of an HTTP/2 endpoint: a stream on its
// connection (a stream does not wait behind requests for a connection).
func (up *Upstream) checkH2(ep *Endpoint) (int, error) {
	hc := &up.cfg.HealthCheck
	ctx, cancel := context.WithTimeout(context.Background(), hc.Timeout)
	defer cancel()
	scheme, host := "http", ep.addr
	if up.cfg.TLS != nil {
		scheme = "https"
	}
	if strings.HasPrefix(host, "unix:") {
		host = "localhost"
	}
	req, err := http.NewRequestWithContext(ctx, "GET", scheme+"://"+host+hc.Path, nil)
	if err != nil {
		return 0, err
	}
	req.Host = string(up.hostHdr)
	req.Header.Set("User-Agent", string(valueHealthUA))
	resp, err := ep.h2.roundTrip(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, io.LimitReader(resp.Body, maxHealthBody+1)); err != nil {
		return 0, err
	}
	return resp.StatusCode, nil
}

// healthStatusError is a check answered with a status outside 200–399.
type healthStatusError struct{ status int }

func (e *healthStatusError) Error() string {
	return "health check answered " + strconv.Itoa(e.status)
}

// resolveOnce resolves the endpoint names and publishes the new list when
// it changed. A failed resolution keeps the name's current endpoints.
func (up *Upstream) resolveOnce() {
	cfg := &up.cfg.Resolve
	cur := up.eps.Load().eps
	next := make([]*Endpoint, 0, len(cur))
	for _, e := range up.cfg.EndpointList() {
		mine := make([]*Endpoint, 0, 4)
		for _, ep := range cur {
			if ep.origin == e {
				mine = append(mine, ep)
			}
		}
		if !isHostName(e) {
			next = append(next, mine...)
			continue
		}
		host, portS, _ := net.SplitHostPort(e)
		port, _ := strconv.ParseUint(portS, 10, 16)
		ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
		lookup := up.lookup
		if lookup == nil {
			lookup = net.DefaultResolver.LookupNetIP
		}
		ips, err := lookup(ctx, "ip", host)
		cancel()
		up.counters.resolutions.Add(1)
		if err != nil || len(ips) == 0 {
			up.counters.resolveErrors.Add(1)
			if up.log != nil {
				if ok, _ := up.logResolve.Allow(); ok {
					up.log.Warn().Str("upstream", up.name).Str("name", host).AnErr("error", err).Msg("resolving upstream endpoint")
				}
			}
			next = append(next, mine...)
			continue
		}
		slices.SortFunc(ips, func(a, b netip.Addr) int { return a.Compare(b) })
		ips = slices.Compact(ips)
		if len(ips) > cfg.MaxAddresses {
			up.counters.addrsDropped.Add(uint64(len(ips) - cfg.MaxAddresses))
			ips = ips[:cfg.MaxAddresses]
		}
		for _, ip := range ips {
			addr := netip.AddrPortFrom(ip.Unmap(), uint16(port)).String()
			var ep *Endpoint
			for _, m := range mine {
				if m.addr == addr {
					ep = m
					break
				}
			}
			if ep == nil {
				ep = newEndpoint(&up.cfg, addr, e)
			}
			next = append(next, ep)
		}
	}
	if len(next) > maxResolvedEndpoints {
		next = next[:maxResolvedEndpoints]
	}
	if slices.Equal(next, cur) {
		return
	}
	up.eps.Store(&epList{eps: next})
	for _, ep := range cur {
		if !slices.Contains(next, ep) {
			ep.hc.CloseIdleConnections()
		}
	}
}

// maxResolvedEndpoints caps an upstream's endpoints after resolution
// (config.MaxEndpoints).
const maxResolvedEndpoints = 64
