package dataplane_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// retryProxy serves one route to up with the given route keys.
func retryProxy(t *testing.T, upAddr, keys string) *proxy {
	t.Helper()
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q, response_timeout: 5s}]
routes:
  - name: r
    upstream: app
%s`, upAddr, keys)))
	if err != nil {
		t.Fatal(err)
	}
	return startProxy(t, cfg, nil, nil)
}

// TestRouteRetry503Then200: a GET answered 503 is retried and the
// client gets the retry's 200.
func TestRouteRetry503Then200(t *testing.T) {
	var n atomic.Int32
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			w.WriteHeader(503)
			io.WriteString(w, "busy")
			return
		}
		io.WriteString(w, "ok")
	})
	p := retryProxy(t, u.addr(), `    retry: {retry_on: ["503"], num_retries: 2, backoff_base: 1ms}`)
	resp, body := p.do(t, "GET", "/x", nil)
	if resp.StatusCode != 200 || body != "ok" || u.count() != 2 {
		t.Fatalf("%d %q after %d upstream requests, want 200 after 2", resp.StatusCode, body, u.count())
	}
	st := p.srv.Stats()
	if st.RouteRetries != 1 {
		t.Errorf("route_retries %d", st.RouteRetries)
	}
	if rs := st.RouteRetriesBy["r"]; rs.Retries["503"] != 1 || len(rs.Retries) != 1 || rs.BudgetExhausted != 0 || rs.NotReplayable != 0 {
		t.Errorf("route r's retries %+v, want one for 503", rs)
	}
	// Without 503 in retry_on, no retry.
	n.Store(0)
	p2 := retryProxy(t, u.addr(), `    retry: {retry_on: ["502"], num_retries: 2, backoff_base: 1ms}`)
	if resp, _ := p2.do(t, "GET", "/x", nil); resp.StatusCode != 503 {
		t.Errorf("502-only policy: %d, want the upstream's 503", resp.StatusCode)
	}
}

// TestRouteRetryConnectFailure: a refused connection is retried; the
// upstream comes up between the tries (a listener bound on the second).
func TestRouteRetryConnectFailure(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // refused until served again
	p := retryProxy(t, addr, `    retry: {retry_on: [refused], num_retries: 1, backoff_base: 1ms}`)
	if resp, _ := p.do(t, "GET", "/x", nil); resp.StatusCode != 502 {
		t.Fatalf("refused twice: %d, want 502", resp.StatusCode)
	}
	st := p.srv.Stats()
	if st.RouteRetries != 1 {
		t.Errorf("route_retries %d after a refused request with one retry", st.RouteRetries)
	}
	if rs := st.RouteRetriesBy["r"]; rs.Retries["refused"] != 1 {
		t.Errorf("route r's retries %+v, want one for refused", rs)
	}
}

// TestRouteRetryStreamedPostNotReplayed: a POST whose streamed body the
// first try consumed is not sent again on a 503: the client gets the
// 503, the upstream saw one request.
func TestRouteRetryStreamedPostNotReplayed(t *testing.T) {
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(503)
	})
	p := retryProxy(t, u.addr(), `    retry: {retry_on: ["503", reset], num_retries: 3, backoff_base: 1ms}`)
	pr, pw := io.Pipe()
	go func() {
		for i := 0; i < 4; i++ {
			fmt.Fprintf(pw, "chunk%d;", i)
		}
		pw.Close()
	}()
	resp, _ := p.do(t, "POST", "/upload", pr) // no length: chunked, streamed
	if resp.StatusCode != 503 {
		t.Fatalf("status %d, want the upstream's 503", resp.StatusCode)
	}
	if n := u.count(); n != 1 {
		t.Fatalf("upstream saw %d requests, want 1", n)
	}
	if got := string(u.last(t).Body); got != "chunk0;chunk1;chunk2;chunk3;" {
		t.Errorf("body %q", got)
	}
	st := p.srv.Stats()
	if st.RouteRetries != 0 {
		t.Errorf("route_retries %d", st.RouteRetries)
	}
	if rs := st.RouteRetriesBy["r"]; rs.NotReplayable != 1 || rs.Retries["503"] != 0 {
		t.Errorf("route r's retries %+v, want one not replayable", rs)
	}
}

// TestRouteRetryBudget: under a failing upstream, the budget (here one
// retry at a time) caps the retries: of five requests failing at once,
// one retries while the others are refused a retry.
func TestRouteRetryBudget(t *testing.T) {
	const clients = 5
	var n atomic.Int32
	arrived := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		switch k := n.Add(1); {
		case k < clients:
			<-arrived
		case k == clients:
			close(arrived) // every first try is in progress: all fail at once
		default:
			select { // a retry holds its budget until released
			case <-release:
			case <-time.After(hangGuard):
			}
		}
		w.WriteHeader(503)
	})
	p := retryProxy(t, u.addr(), `    retry:
      retry_on: ["503"]
      num_retries: 3
      backoff_base: 1ms
      budget: {percent: 1, min_retries: 1}`)
	var wg sync.WaitGroup
	statuses := make(chan int, clients)
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _ := p.do(t, "GET", "/x"+strconv.Itoa(i), nil)
			statuses <- resp.StatusCode
		}()
	}
	// The clients refused a retry get their 503 while the one retry
	// holds the budget.
	for i := 0; i < clients-1; i++ {
		select {
		case s := <-statuses:
			if s != 503 {
				t.Errorf("status %d", s)
			}
		case <-time.After(hangGuard):
			t.Fatal("clients refused a retry got no answer")
		}
	}
	// The one retry reaches the upstream (after its backoff) and holds
	// the budget there.
	for deadline := time.Now().Add(hangGuard); int(n.Load()) < clients+1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d upstream requests, the retry never came", n.Load())
		}
	}
	if got := int(n.Load()); got != clients+1 {
		t.Errorf("%d upstream requests while the budget was held, want %d", got, clients+1)
	}
	once.Do(func() { close(release) })
	wg.Wait()
	st := p.srv.Stats()
	// The retrying request makes its 3 retries, one at a time.
	if got := int(n.Load()); got != clients+3 || st.RouteRetries != 3 || st.RetryBudgetExhausted != clients-1 {
		t.Errorf("%d upstream requests, %d retries, %d refused by the budget; want %d, 3, %d",
			got, st.RouteRetries, st.RetryBudgetExhausted, clients+3, clients-1)
	}
	if rs := st.RouteRetriesBy["r"]; rs.BudgetExhausted != clients-1 || rs.Retries["503"] != 3 {
		t.Errorf("route r's retries %+v, want 3 for 503 and %d refused by the budget", rs, clients-1)
	}
}

// TestRouteTimeouts: upstream_timeout bounds a route's wait for the
// response head (504), and per_try_timeout with retry_on timeout retries
// an idempotent request that timed out.
func TestRouteTimeouts(t *testing.T) {
	var n atomic.Int32
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/slow") || n.Add(1) == 1 {
			select {
			case <-block:
			case <-r.Context().Done():
			}
			return
		}
		io.WriteString(w, "ok")
	})
	p := retryProxy(t, u.addr(), `    upstream_timeout: 50ms`)
	if resp, _ := p.do(t, "GET", "/slow", nil); resp.StatusCode != 504 {
		t.Errorf("upstream_timeout: %d, want 504", resp.StatusCode)
	}
	p2 := retryProxy(t, u.addr(), `    retry: {retry_on: [timeout], num_retries: 1, per_try_timeout: 50ms, backoff_base: 1ms}`)
	if resp, body := p2.do(t, "GET", "/x", nil); resp.StatusCode != 200 || body != "ok" {
		t.Errorf("per-try timeout then retry: %d %q", resp.StatusCode, body)
	}
	p3 := retryProxy(t, u.addr(), `    timeout: 80ms
    retry: {retry_on: [timeout], num_retries: 5, per_try_timeout: 30ms, backoff_base: 1ms}`)
	if resp, _ := p3.do(t, "GET", "/slow", nil); resp.StatusCode != 504 {
		t.Errorf("route timeout: %d, want 504", resp.StatusCode)
	}
}

// TestRouteRetryReset: a connection the upstream breaks before answering
// is retried for a GET (idempotent) and not for a POST (the upstream may
// have acted on it), even without a body.
func TestRouteRetryReset(t *testing.T) {
	var conns atomic.Int32
	addr := serveConns(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			if _, err := readRequestHead(br); err != nil {
				return
			}
			if conns.Add(1)%2 == 1 {
				return // every other request: the connection breaks, unanswered
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	p := retryProxy(t, addr, `    retry: {retry_on: [reset], num_retries: 1, backoff_base: 1ms}`)
	if resp, body := p.do(t, "GET", "/x", nil); resp.StatusCode != 200 || body != "ok" {
		t.Errorf("GET after a reset: %d %q, want the retry's 200", resp.StatusCode, body)
	}
	if resp, _ := p.do(t, "POST", "/x", nil); resp.StatusCode != 502 {
		t.Errorf("POST after a reset: %d, want 502 (not retried)", resp.StatusCode)
	}
	st := p.srv.Stats()
	if st.RouteRetries != 1 {
		t.Errorf("route_retries %d, want 1", st.RouteRetries)
	}
	if rs := st.RouteRetriesBy["r"]; rs.Retries["reset"] != 1 || rs.NotReplayable != 1 {
		t.Errorf("route r's retries %+v, want one for reset and the POST not replayable", rs)
	}
}
