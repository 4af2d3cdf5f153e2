package upstream

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// fakeDNS answers lookups from a table the test changes.
type fakeDNS struct {
	mu    sync.Mutex
	addrs map[string][]string
	err   error
}

func (f *fakeDNS) lookup(_ context.Context, _, host string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	var out []netip.Addr
	for _, a := range f.addrs[host] {
		out = append(out, netip.MustParseAddr(a))
	}
	return out, nil
}

func addrsOf(up *Upstream) []string {
	var out []string
	for _, ep := range up.eps.Load().eps {
		out = append(out, ep.addr)
	}
	return out
}

// TestResolveOnce: a name stands for its addresses (sorted, at most
// max_addresses, the rest counted); an address still resolved keeps its
// endpoint and state; a failed resolution keeps the last addresses; a
// literal endpoint is left alone; a reload keeps the resolved endpoints.
func TestResolveOnce(t *testing.T) {
	u := config.Upstream{Name: "app", Endpoints: []string{"10.9.9.9:80", "pool.test:8080"}}
	u.Resolve.Interval = time.Second
	cfg := &config.Config{Upstreams: []config.Upstream{u}}
	cfg.SetDefaults()
	u = cfg.Upstreams[0]
	u.Resolve.MaxAddresses = 2
	dns := &fakeDNS{addrs: map[string][]string{"pool.test": {"10.0.0.3", "10.0.0.1", "10.0.0.2"}}}
	up := New(u, nil, new(Counters))
	up.lookup = dns.lookup
	if got := addrsOf(up); len(got) != 2 || got[1] != "pool.test:8080" {
		t.Fatalf("before resolution %v", got)
	}
	up.resolveOnce()
	if got := addrsOf(up); len(got) != 3 || got[0] != "10.9.9.9:80" || got[1] != "10.0.0.1:8080" || got[2] != "10.0.0.2:8080" {
		t.Fatalf("resolved %v", got)
	}
	if up.counters.addrsDropped.Load() != 1 || up.counters.resolutions.Load() != 1 {
		t.Fatalf("dropped %d resolutions %d", up.counters.addrsDropped.Load(), up.counters.resolutions.Load())
	}
	kept := up.eps.Load().eps[2] // 10.0.0.2
	kept.requests.Add(7)
	dns.mu.Lock()
	dns.addrs["pool.test"] = []string{"10.0.0.2", "10.0.0.4"}
	dns.mu.Unlock()
	up.resolveOnce()
	eps := up.eps.Load().eps
	if got := addrsOf(up); len(got) != 3 || got[1] != "10.0.0.2:8080" || got[2] != "10.0.0.4:8080" || eps[1] != kept || eps[1].requests.Load() != 7 {
		t.Fatalf("after change %v", got)
	}
	dns.mu.Lock()
	dns.err = errors.New("SERVFAIL")
	dns.mu.Unlock()
	up.resolveOnce()
	if got := addrsOf(up); len(got) != 3 || got[1] != "10.0.0.2:8080" || up.counters.resolveErrors.Load() != 1 {
		t.Fatalf("after a failure %v (errors %d)", got, up.counters.resolveErrors.Load())
	}
	// A reload with the same settings keeps the resolved endpoints.
	next := New(u, up, new(Counters))
	if got := addrsOf(next); len(got) != 3 || next.eps.Load().eps[1] != kept || next.counters != up.counters {
		t.Fatalf("after reload %v", got)
	}
}
