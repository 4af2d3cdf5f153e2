package dataplane_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/dataplane"
	"github.com/zentinelproxy/sidecar/internal/config"
)

// routeObserver records Reset's names and the route of every request.
type routeObserver struct {
	dataplane.NopObserver
	mu     sync.Mutex
	routes []string
	seen   []string // route name of each finished request, by the names of the latest Reset
}

func (o *routeObserver) Reset(routes, _ []string) {
	o.mu.Lock()
	o.routes = routes
	o.mu.Unlock()
}

func (o *routeObserver) Request(route, _ int, _ time.Duration) {
	o.mu.Lock()
	o.seen = append(o.seen, o.routes[route])
	o.mu.Unlock()
}

// TestIndicesStableAcrossSwap: a swap that reorders and replaces routes
// keeps every name's index, so a request that started on the old table
// and ends after the swap is counted under its own route.
func TestIndicesStableAcrossSwap(t *testing.T) {
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/b/") {
			entered <- struct{}{}
			<-release
		}
		_, _ = w.Write([]byte("ok"))
	})
	text := `
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q}]
routes:
%s`
	cfg := configText(t, fmt.Sprintf(text, u.addr(), "  - {name: a, path_prefix: /a/, upstream: app}\n  - {name: b, path_prefix: /b/, upstream: app}\n"), nil)
	obs := &routeObserver{}
	p := startProxy(t, cfg, nil, obs)

	done := make(chan int, 1)
	go func() {
		resp, _ := p.do(t, "GET", "/b/slow", nil)
		done <- resp.StatusCode
	}()
	<-entered
	cfg2, err := config.Parse([]byte(fmt.Sprintf(text, u.addr(), "  - {name: c, path_prefix: /c/, upstream: app}\n  - {name: a, path_prefix: /a/, upstream: app}\n")))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.srv.Swap(cfg2, nil); err != nil {
		t.Fatal(err)
	}
	close(release)
	if code := <-done; code != 200 {
		t.Fatalf("request across the swap: %d", code)
	}
	p.do(t, "GET", "/a/x", nil)
	p.do(t, "GET", "/c/x", nil)

	obs.mu.Lock()
	defer obs.mu.Unlock()
	if !slices.Equal(obs.routes, []string{"a", "b", "c"}) {
		t.Errorf("names after swap %v, want [a b c]", obs.routes)
	}
	if !slices.Equal(obs.seen, []string{"b", "a", "c"}) {
		t.Errorf("requests counted under %v, want [b a c]", obs.seen)
	}
	if got := p.srv.Routes(); !slices.Equal(got, []string{"c", "a"}) {
		t.Errorf("Routes() %v", got)
	}
}
