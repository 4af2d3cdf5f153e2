package dataplane_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/zentinelproxy/sidecar/dataplane"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// backend is one killable upstream instance on a real TCP socket: kill
// closes its listener and every connection at once, revive listens again
// on the same address.
type backend struct {
	t      testing.TB
	addr   string
	name   string
	hits   atomic.Int64
	health atomic.Int32 // status of /health (0: 200)
	status atomic.Int32 // status of other paths (0: 200)
	block  chan struct{}
	mu     sync.Mutex
	srv    *http.Server
}

func newBackend(t testing.TB, name string) *backend {
	b := &backend{t: t, name: name}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b.addr = ln.Addr().String()
	b.serve(ln)
	t.Cleanup(b.kill)
	return b
}

func (b *backend) serve(ln net.Listener) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			if st := b.health.Load(); st != 0 {
				w.WriteHeader(int(st))
			}
			return
		}
		b.hits.Add(1)
		if b.block != nil {
			<-b.block
		}
		if st := b.status.Load(); st != 0 {
			w.WriteHeader(int(st))
		}
		io.WriteString(w, b.name)
	})}
	b.mu.Lock()
	b.srv = srv
	b.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
}

func (b *backend) kill() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.srv != nil {
		_ = b.srv.Close()
		b.srv = nil
	}
}

func (b *backend) revive() {
	ln, err := net.Listen("tcp", b.addr)
	if err != nil {
		b.t.Fatalf("relisten on %s: %v", b.addr, err)
	}
	b.serve(ln)
}

// endpointsConfig is one route to an upstream of several endpoints.
const endpointsConfig = `
listeners:
  - name: test
    address: 127.0.0.1:0
upstreams:
  - name: app
    endpoints: [{{.Endpoints}}]
    balance: {{or .Balance "round_robin"}}
    connect_timeout: 1s
    response_timeout: 5s
{{- with .Health}}
    health_check:
      path: /health
      interval: 100ms
      timeout: 100ms
      healthy_threshold: 2
      unhealthy_threshold: {{or $.Unhealthy 2}}
{{- end}}
    ejection:
      consecutive_5xx: {{or .C5xx 5}}
      consecutive_errors: 3
      time: {{or .EjectTime "1h"}}
{{- with .Resolve}}
    resolve:
      interval: 1s
      max_addresses: 1
{{- end}}
routes:
  - name: main
    upstream: app
`

func endpointsCfg(t testing.TB, data map[string]any, bs ...*backend) *config.Config {
	addrs := make([]string, len(bs))
	for i, b := range bs {
		addrs[i] = b.addr
	}
	if _, ok := data["Endpoints"]; !ok {
		data["Endpoints"] = strings.Join(addrs, ", ")
	}
	return configText(t, endpointsConfig, data)
}

// endpointState finds addr's status in the server's snapshot.
func endpointState(srv *dataplane.Server, addr string) (dataplane.EndpointStatus, bool) {
	for _, u := range srv.Upstreams() {
		for _, e := range u.Endpoints {
			if e.Address == addr {
				return e, true
			}
		}
	}
	return dataplane.EndpointStatus{}, false
}

// TestEndpointKilledUnderLoad: with three endpoints and one killed while
// GETs stream through the proxy, no request fails (those that hit the
// dead endpoint are retried on another), the dead endpoint is ejected,
// and once it listens again its health check brings it back.
func TestEndpointKilledUnderLoad(t *testing.T) {
	bs := []*backend{newBackend(t, "a"), newBackend(t, "b"), newBackend(t, "c")}
	// The health check takes the dead endpoint out only after 30 failed
	// checks (3s at 100ms): the requests' three consecutive errors eject
	// it long before that, even on a loaded machine where few requests
	// pass a second. With 2 failed checks a loaded machine could see the
	// health check first, after 2 errors and no ejection.
	p := startProxy(t, endpointsCfg(t, map[string]any{"Health": true, "Unhealthy": 30}, bs...), nil, nil)

	var ok, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := p.client.Get(p.url("/load"))
				if err == nil {
					_, err = io.ReadAll(resp.Body)
					resp.Body.Close()
					if err == nil && resp.StatusCode != 200 {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				ok.Add(1)
			}
		}()
	}
	stopLoad := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	defer stopLoad()
	for _, b := range bs {
		testutil.WaitFor(t, "load on every endpoint", func() bool { return b.hits.Load() >= 50 })
	}
	dead := bs[1]
	dead.kill()
	testutil.WaitFor(t, "the killed endpoint out", func() bool {
		e, _ := endpointState(p.srv, dead.addr)
		return e.Ejected || !e.Healthy
	})
	e, _ := endpointState(p.srv, dead.addr)
	if e.Errors == 0 || e.Ejections == 0 {
		t.Errorf("killed endpoint: %+v, want errors and an ejection", e)
	}
	// The load goes on around it.
	before := ok.Load()
	testutil.WaitFor(t, "requests after the ejection", func() bool { return ok.Load() >= before+200 })
	testutil.WaitFor(t, "the health check to fail", func() bool {
		e, _ := endpointState(p.srv, dead.addr)
		return !e.Healthy
	})

	hits := dead.hits.Load()
	dead.revive()
	testutil.WaitFor(t, "the endpoint back", func() bool {
		e, _ := endpointState(p.srv, dead.addr)
		return e.Healthy && !e.Ejected
	})
	testutil.WaitFor(t, "requests on the revived endpoint", func() bool { return dead.hits.Load() >= hits+20 })

	stopLoad()
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d of %d requests failed (first: %v)", n, n+ok.Load(), firstErr.Load())
	}
	if st := p.srv.Stats(); st.EndpointRetries == 0 {
		t.Errorf("no request was retried on another endpoint: %+v", st)
	}
}

// TestEndpointRoundRobin: sequential requests take the endpoints in turn.
func TestEndpointRoundRobin(t *testing.T) {
	bs := []*backend{newBackend(t, "a"), newBackend(t, "b"), newBackend(t, "c")}
	p := startProxy(t, endpointsCfg(t, map[string]any{}, bs...), nil, nil)
	for i := 0; i < 30; i++ {
		if resp, body := p.do(t, "GET", "/", nil); resp.StatusCode != 200 {
			t.Fatalf("status %d %q", resp.StatusCode, body)
		}
	}
	for _, b := range bs {
		if n := b.hits.Load(); n != 10 {
			t.Errorf("endpoint %s got %d of 30 requests, want 10", b.name, n)
		}
	}
}

// TestEndpointLeastInFlight: an endpoint holding a request gets no other
// while the rest are idle.
func TestEndpointLeastInFlight(t *testing.T) {
	slow := newBackend(t, "slow")
	slow.block = make(chan struct{})
	bs := []*backend{slow, newBackend(t, "b"), newBackend(t, "c")}
	p := startProxy(t, endpointsCfg(t, map[string]any{"Balance": "least_in_flight"}, bs...), nil, nil)
	held := make(chan error, 20)
	for i := 0; i < 20; i++ {
		before := slow.hits.Load()
		done := make(chan struct{})
		go func() {
			defer close(done)
			resp, err := p.client.Get(p.url("/"))
			if err == nil {
				_, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			held <- err
		}()
		// Sequential: the request completed, or the slow endpoint holds it.
		testutil.WaitFor(t, "the request to finish or be held", func() bool {
			select {
			case <-done:
				return true
			default:
			}
			return slow.hits.Load() > before
		})
	}
	close(slow.block)
	if n := slow.hits.Load(); n != 1 {
		t.Fatalf("the busy endpoint got %d requests, want 1", n)
	}
	for i := 0; i < 20; i++ {
		if err := <-held; err != nil {
			t.Fatal(err)
		}
	}
}

// TestEndpoint5xxEjection: consecutive 5xx eject an endpoint; the others
// take the traffic; 5xx answers are relayed, not retried.
func TestEndpoint5xxEjection(t *testing.T) {
	bad, good := newBackend(t, "bad"), newBackend(t, "good")
	bad.status.Store(500)
	p := startProxy(t, endpointsCfg(t, map[string]any{"C5xx": 2}, bad, good), nil, nil)
	fails := 0
	for i := 0; i < 20; i++ {
		resp, _ := p.do(t, "GET", "/", nil)
		if resp.StatusCode == 500 {
			fails++
		}
	}
	if fails != 2 {
		t.Errorf("%d answers were 500, want 2 (then the endpoint is ejected)", fails)
	}
	e, _ := endpointState(p.srv, bad.addr)
	if !e.Ejected || e.Ejections != 1 || e.Status5xx != 2 {
		t.Fatalf("bad endpoint %+v", e)
	}
}

// TestEndpointEjectionEnds: without health checks, an ejected endpoint
// takes requests again once the ejection time is over.
func TestEndpointEjectionEnds(t *testing.T) {
	bad, good := newBackend(t, "bad"), newBackend(t, "good")
	bad.status.Store(503)
	p := startProxy(t, endpointsCfg(t, map[string]any{"C5xx": 1, "EjectTime": "200ms"}, bad, good), nil, nil)
	for i := 0; i < 4; i++ {
		p.do(t, "GET", "/", nil)
	}
	if e, _ := endpointState(p.srv, bad.addr); !e.Ejected || bad.hits.Load() != 1 {
		t.Fatalf("bad endpoint %+v after %d hits", e, bad.hits.Load())
	}
	bad.status.Store(0)
	testutil.WaitFor(t, "the ejection to end", func() bool {
		e, _ := endpointState(p.srv, bad.addr)
		return !e.Ejected
	})
	for i := 0; i < 4; i++ {
		if resp, _ := p.do(t, "GET", "/", nil); resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if n := bad.hits.Load(); n != 3 {
		t.Fatalf("the returned endpoint got %d requests in all, want 1 + 2 of 4", n)
	}
}

// TestEndpointReloadKeepsHealth: a reload that keeps an endpoint keeps its
// health state and counters; a new endpoint starts healthy; a removed one
// is gone.
func TestEndpointReloadKeepsHealth(t *testing.T) {
	a, b, c := newBackend(t, "a"), newBackend(t, "b"), newBackend(t, "c")
	a.health.Store(503)
	p := startProxy(t, endpointsCfg(t, map[string]any{"Health": true}, a, b), nil, nil)
	testutil.WaitFor(t, "a unhealthy", func() bool {
		e, _ := endpointState(p.srv, a.addr)
		return !e.Healthy
	})
	for i := 0; i < 4; i++ {
		if resp, body := p.do(t, "GET", "/", nil); body != "b" {
			t.Fatalf("status %d body %q: the unhealthy endpoint took a request", resp.StatusCode, body)
		}
	}
	before, _ := endpointState(p.srv, a.addr)
	if err := p.srv.Swap(endpointsCfg(t, map[string]any{"Health": true}, a, c), nil); err != nil {
		t.Fatal(err)
	}
	after, ok := endpointState(p.srv, a.addr)
	if !ok || after.Healthy || after.ChecksFailed < before.ChecksFailed {
		t.Fatalf("after reload a is %+v (before %+v)", after, before)
	}
	if _, ok := endpointState(p.srv, b.addr); ok {
		t.Fatal("the removed endpoint is still listed")
	}
	if e, ok := endpointState(p.srv, c.addr); !ok || !e.Healthy {
		t.Fatalf("new endpoint %+v", e)
	}
	if _, body := p.do(t, "GET", "/", nil); body != "c" {
		t.Fatalf("body %q, want c", body)
	}
	a.health.Store(0)
	testutil.WaitFor(t, "a healthy again", func() bool {
		e, _ := endpointState(p.srv, a.addr)
		return e.Healthy
	})
}

// TestEndpointConnectRetryAnyMethod: a POST whose endpoint refuses the
// connection goes to another endpoint (nothing was sent).
func TestEndpointConnectRetryAnyMethod(t *testing.T) {
	dead, live := newBackend(t, "dead"), newBackend(t, "live")
	dead.kill()
	p := startProxy(t, endpointsCfg(t, map[string]any{}, dead, live), nil, nil)
	for i := 0; i < 4; i++ {
		resp, body := p.do(t, "POST", "/", strings.NewReader("payload"))
		if resp.StatusCode != 200 || body != "live" {
			t.Fatalf("status %d body %q", resp.StatusCode, body)
		}
	}
	if e, _ := endpointState(p.srv, dead.addr); e.Errors == 0 {
		t.Fatalf("dead endpoint %+v", e)
	}
}

// TestEndpointAllDown: with every endpoint refusing, the request fails
// with 502 after endpoint_attempts tries, not more.
func TestEndpointAllDown(t *testing.T) {
	bs := []*backend{newBackend(t, "a"), newBackend(t, "b"), newBackend(t, "c"), newBackend(t, "d")}
	for _, b := range bs {
		b.kill()
	}
	p := startProxy(t, endpointsCfg(t, map[string]any{}, bs...), nil, nil)
	resp, _ := p.do(t, "GET", "/", nil)
	if resp.StatusCode != 502 {
		t.Fatalf("status %d, want 502", resp.StatusCode)
	}
	var tries uint64
	for _, u := range p.srv.Upstreams() {
		for _, e := range u.Endpoints {
			tries += e.Requests
		}
	}
	if tries != 3 {
		t.Fatalf("%d attempts, want 3 (endpoint_attempts)", tries)
	}
}

// TestEndpointResolve: an endpoint given by name is re-resolved into its
// addresses, at most max_addresses of them, and serves.
func TestEndpointResolve(t *testing.T) {
	b := newBackend(t, "a")
	_, port, _ := net.SplitHostPort(b.addr)
	p := startProxy(t, endpointsCfg(t, map[string]any{"Endpoints": "localhost:" + port, "Resolve": true}), nil, nil)
	var u dataplane.UpstreamStatus
	testutil.WaitFor(t, "a resolution", func() bool {
		u = p.srv.Upstreams()[0]
		return u.Resolutions > 0
	})
	if u.ResolveErrors != 0 || len(u.Endpoints) != 1 {
		t.Fatalf("upstream %+v", u)
	}
	host, _, err := net.SplitHostPort(u.Endpoints[0].Address)
	if err != nil || net.ParseIP(host) == nil {
		t.Fatalf("endpoint %q is not an address", u.Endpoints[0].Address)
	}
	if !net.ParseIP(host).IsLoopback() {
		t.Fatalf("localhost resolved to %s", host)
	}
	// localhost may be IPv6 only here, where the backend does not listen.
	if host == "127.0.0.1" {
		if resp, body := p.do(t, "GET", "/", nil); body != "a" {
			t.Fatalf("status %d body %q", resp.StatusCode, body)
		}
	}
}
