package dataplane_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/dataplane"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

func TestHeadAndNoContent(t *testing.T) {
	p, _ := setup(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/head":
			w.Header().Set("Content-Length", "1234")
			w.WriteHeader(200)
		case "/204":
			w.WriteHeader(204)
		case "/304":
			w.WriteHeader(304)
		}
	}, nil, nil, nil, nil)
	resp, body := p.do(t, "HEAD", "/head", nil)
	if resp.StatusCode != 200 || resp.ContentLength != 1234 || body != "" {
		t.Errorf("HEAD: %d cl %d body %q", resp.StatusCode, resp.ContentLength, body)
	}
	for _, path := range []string{"/204", "/304"} {
		resp, body = p.do(t, "GET", path, nil)
		if resp.StatusCode != map[string]int{"/204": 204, "/304": 304}[path] || body != "" {
			t.Errorf("%s: %d %q", path, resp.StatusCode, body)
		}
	}
	// The connection is still in sync after bodiless responses.
	resp, _ = p.do(t, "HEAD", "/head", nil)
	if resp.StatusCode != 200 {
		t.Errorf("again: %d", resp.StatusCode)
	}
}

func TestExpectContinue(t *testing.T) {
	rec := &chunkRecorder{}
	agent := &agentFuncs{Base: sdk.Base{Caps: bodyCaps(true)}, reqBody: rewrite(rec)}
	p, up := setup(t, nil, []string{"a"}, map[string]sdk.Handler{"a": agent},
		map[string]agentSpec{"a": {ReqMode: "streaming", RespMode: "none", Chunk: "1KiB"}}, nil)
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	fmt.Fprintf(c, "POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100") {
		t.Fatalf("interim response %q %v", line, err)
	}
	br.ReadString('\n')
	io.WriteString(c, "ccccc")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("response %v %v", resp, err)
	}
	got := up.last(t)
	if string(got.Body) != "ccccc" || got.Header.Get("Expect") != "" {
		t.Errorf("upstream body %q expect %q", got.Body, got.Header.Get("Expect"))
	}
}

func TestClientGoneMidUpload(t *testing.T) {
	caps := protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true, SupportsStreaming: true, SupportsCancellation: true}
	path, ra := serveRaw(t, caps, func(typ protocol.MsgType, _ uint64) *protocol.Decision {
		return &protocol.Decision{NeedsMore: typ == protocol.TypeRequestBodyChunk}
	})
	upstreamErr := make(chan error, 1)
	p, _ := setup(t, func(w http.ResponseWriter, r *http.Request) {
		_, err := io.Copy(io.Discard, r.Body)
		upstreamErr <- err
	}, []string{"a"}, nil, map[string]agentSpec{"a": {Path: path, ReqMode: "streaming", Chunk: "1KiB"}}, nil)
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
	c.Write(make([]byte, 10000))
	testutil.WaitFor(t, "chunks at the agent", func() bool {
		return slices.Contains(ra.seen(), "RequestBodyChunk")
	})
	c.Close()
	select {
	case err := <-upstreamErr:
		if err == nil {
			t.Fatal("upstream read a complete body from a truncated upload")
		}
	case <-time.After(hangGuard):
		t.Fatal("upstream request not aborted")
	}
	testutil.WaitFor(t, "CancelRequest at the agent", func() bool { return slices.Contains(ra.seen(), "cancel:client_disconnect") })
	testutil.WaitFor(t, "client-gone counter", func() bool { return p.srv.Stats().ClientGone == 1 })
}

func TestTruncatedChunkedUploadIsNotComplete(t *testing.T) {
	upstreamErr := make(chan error, 1)
	p, _ := setup(t, func(w http.ResponseWriter, r *http.Request) {
		_, err := io.Copy(io.Discard, r.Body)
		upstreamErr <- err
	}, nil, nil, nil, nil)
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
	time.Sleep(20 * time.Millisecond)
	c.Close() // no terminating 0-chunk
	select {
	case err := <-upstreamErr:
		if err == nil {
			t.Fatal("upstream saw a complete body from a truncated chunked upload")
		}
	case <-time.After(hangGuard):
		t.Fatal("upstream request not aborted")
	}
}

func TestClientGoneMidDownload(t *testing.T) {
	upstreamDone := make(chan error, 1)
	p, _ := setup(t, func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 32<<10)
		var err error
		for i := 0; i < 100000 && err == nil; i++ { // ~3 GiB unless aborted
			_, err = w.Write(buf)
		}
		upstreamDone <- err
	}, nil, nil, nil, nil)
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
	io.ReadFull(c, make([]byte, 256<<10))
	c.Close()
	select {
	case err := <-upstreamDone:
		if err == nil {
			t.Fatal("upstream wrote everything to a vanished client")
		}
	case <-time.After(hangGuard):
		t.Fatal("upstream response not aborted")
	}
}

func TestChunkedUpstreamResponse(t *testing.T) {
	p, _ := setup(t, func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i < 3; i++ {
			fmt.Fprintf(w, "part%d;", i)
			w.(http.Flusher).Flush()
		}
		if r.URL.Path == "/truncated" {
			// Hijack and close without the terminating chunk.
			c, bw, _ := w.(http.Hijacker).Hijack()
			bw.Flush()
			c.Close()
		}
	}, nil, nil, nil, nil)
	resp, body := p.do(t, "GET", "/ok", nil)
	if resp.StatusCode != 200 || body != "part0;part1;part2;" || resp.ContentLength != -1 {
		t.Fatalf("got %d %q cl %d", resp.StatusCode, body, resp.ContentLength)
	}
	req, _ := http.NewRequest("GET", p.url("/truncated"), nil)
	tresp, err := p.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(tresp.Body)
	tresp.Body.Close()
	if err == nil {
		t.Fatal("a truncated upstream body reached the client as complete")
	}
	testutil.WaitFor(t, "aborted counter", func() bool { return p.srv.Stats().ResponseAborted == 1 })
}

func TestStaleKeepAliveIsRetried(t *testing.T) {
	// The upstream closes idle connections after 30ms, well before the
	// proxy's keep-alive: every request after a pause finds its pooled
	// connection closed and must be retried on a fresh one.
	var conns, closed atomic.Int32
	srv := &http.Server{
		IdleTimeout: 30 * time.Millisecond,
		Handler:     http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }),
		ConnState: func(_ net.Conn, s http.ConnState) {
			switch s {
			case http.StateNew:
				conns.Add(1)
			case http.StateClosed:
				closed.Add(1)
			}
		},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	cfg := configText(t, oneAgentConfig, map[string]any{"Upstream": ln.Addr().String(), "Chain": ""})
	p := startProxy(t, cfg, nil, nil)
	for i := 0; i < 3; i++ {
		resp, _ := p.do(t, "GET", "/", nil)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
		// Until the upstream closed the idle connection: the next request
		// finds it dead in the pool.
		testutil.WaitFor(t, "upstream closes the idle connection", func() bool { return closed.Load() == int32(i+1) })
		time.Sleep(20 * time.Millisecond) // let the FIN reach the proxy's socket
	}
	if st := p.srv.Stats(); st.UpstreamErrors != 0 || conns.Load() != 3 {
		t.Fatalf("upstream errors %d, upstream connections %d (want 3)", st.UpstreamErrors, conns.Load())
	}
}

func TestFailOpenThenBlock(t *testing.T) {
	// a is down and fails open; b blocks: b's block wins and carries a's
	// mark. b takes the upstream's view, which carries the mark (the
	// client's view does not: the client sent no such header).
	u := newUpstream(t, nil)
	pathB := serveAgentUpstreamView(t, &agentFuncs{Base: sdk.Base{Caps: headersOnly()}, reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
		if string(m.Headers.Get("x-sidecar-fail-open")) != "a" {
			return nil // the mark is visible to later agents
		}
		d.Kind = protocol.DecisionBlock
		return nil
	}})
	cfg := configText(t, oneAgentConfig, map[string]any{
		"Upstream": u.addr(), "Chain": "a, b",
		"Agents": map[string]agentSpec{"a": {Path: testutil.SocketPath(t), Failure: "open"}, "b": {Path: pathB}},
	})
	down, err := udsclient.NewClient(udsclient.DefaultConfig("a", cfg.Agent("a").Address))
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, cfg, map[string]agentmux.Agent{"a": down, "b": udsAgent(t, "b", pathB, nil)}, nil)
	resp, _ := p.do(t, "GET", "/", nil)
	if resp.StatusCode != 403 || resp.Header.Get("X-Sidecar-Fail-Open") != "a" {
		t.Fatalf("got %d mark %q", resp.StatusCode, resp.Header.Get("X-Sidecar-Fail-Open"))
	}
}

func TestFailOpenAtResponsePhase(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	agent := &agentFuncs{Base: sdk.Base{Caps: protocol.Capabilities{HandlesResponseHeaders: true, SupportsCancellation: true}},
		respHeaders: func(ctx context.Context, m *protocol.ResponseHeaders, d *protocol.Decision) error {
			select {
			case <-ctx.Done():
			case <-release:
			}
			return nil
		}}
	p, _ := setup(t, nil, []string{"a"}, map[string]sdk.Handler{"a": agent},
		map[string]agentSpec{"a": {Failure: "open", Message: "100ms"}}, nil)
	resp, body := p.do(t, "GET", "/", nil)
	if resp.StatusCode != 200 || body != "hello from upstream" || resp.Header.Get("X-Sidecar-Fail-Open") != "a" {
		t.Fatalf("got %d %q mark %q", resp.StatusCode, body, resp.Header.Get("X-Sidecar-Fail-Open"))
	}
}

// countingObserver counts events by kind.
type countingObserver struct {
	dataplane.NopObserver
	mu       sync.Mutex
	routes   []string
	agents   []string
	requests map[int]int
	outcomes map[dataplane.Outcome]int
	refused  int
	failOpen int
	skipped  int
	upstream int
}

func (o *countingObserver) Reset(routes, agents []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.routes, o.agents = routes, agents
	o.requests, o.outcomes = map[int]int{}, map[dataplane.Outcome]int{}
}

func (o *countingObserver) Request(route, status int, d time.Duration) {
	o.mu.Lock()
	o.requests[status]++
	o.mu.Unlock()
}

func (o *countingObserver) AgentEvent(route, agent int, p protocol.Phase, body bool, out dataplane.Outcome, d time.Duration) {
	o.mu.Lock()
	o.outcomes[out]++
	o.mu.Unlock()
}

func (o *countingObserver) MutationRefused(route, agent int) {
	o.mu.Lock()
	o.refused++
	o.mu.Unlock()
}

func (o *countingObserver) Upstream(route int, timeout bool) {
	o.mu.Lock()
	o.upstream++
	o.mu.Unlock()
}

func TestObserverAndSwap(t *testing.T) {
	u := newUpstream(t, nil)
	blocker := &agentFuncs{Base: sdk.Base{Caps: headersOnly()}, reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
		if strings.HasPrefix(string(m.URI), "/admin") {
			d.Kind = protocol.DecisionBlock
		}
		d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderSet, Name: []byte("host"), Value: []byte("x")})
		return nil
	}}
	pathA := serveAgent(t, blocker)
	cfg := configText(t, oneAgentConfig, map[string]any{"Upstream": u.addr(), "Chain": "a", "Agents": map[string]agentSpec{"a": {Path: pathA}}})
	obs := &countingObserver{}
	a := udsAgent(t, "a", pathA, nil)
	p := startProxy(t, cfg, map[string]agentmux.Agent{"a": a}, obs)
	p.do(t, "GET", "/ok", nil)
	p.do(t, "GET", "/admin", nil)
	obs.mu.Lock()
	if !slices.Equal(obs.routes, []string{"main"}) || !slices.Equal(obs.agents, []string{"a"}) {
		t.Errorf("reset names %v %v", obs.routes, obs.agents)
	}
	if obs.requests[200] != 1 || obs.requests[403] != 1 || obs.outcomes[dataplane.OutcomeAllow] != 1 ||
		obs.outcomes[dataplane.OutcomeBlock] != 1 || obs.refused != 2 {
		t.Errorf("observed %v %v refused %d", obs.requests, obs.outcomes, obs.refused)
	}
	obs.mu.Unlock()

	// Swap to a table without the agent: /admin now passes, and the
	// dropped agent is closed once idle.
	cfg2, err := config.Parse([]byte(fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app2, address: %q}]
routes: [{name: open, upstream: app2}]
`, u.addr())))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.srv.Swap(cfg2, nil); err != nil {
		t.Fatal(err)
	}
	resp, _ := p.do(t, "GET", "/admin", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("after swap: %d", resp.StatusCode)
	}
	if !slices.Equal(p.srv.Routes(), []string{"open"}) || len(p.srv.Agents()) != 0 {
		t.Errorf("routes %v agents %v", p.srv.Routes(), p.srv.Agents())
	}
	testutil.WaitFor(t, "dropped agent closed", func() bool { return !a.Snapshot().Ready })
	// A swap to a config referencing an agent without an instance fails
	// and leaves the table as it was.
	if err := p.srv.Swap(cfg, nil); err == nil {
		t.Fatal("swap without agent instances accepted")
	}
	resp, _ = p.do(t, "GET", "/admin", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("after failed swap: %d", resp.StatusCode)
	}
}

func TestShutdownFinishesInFlightThenClosesAgents(t *testing.T) {
	var inHandler atomic.Bool
	release := make(chan struct{})
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		inHandler.Store(true)
		<-release
		w.Write([]byte("late but complete"))
	})
	path := serveAgent(t, &agentFuncs{Base: sdk.Base{Caps: headersOnly()}})
	cfg := configText(t, oneAgentConfig, map[string]any{"Upstream": u.addr(), "Chain": "a", "Agents": map[string]agentSpec{"a": {Path: path}}})
	a := udsAgent(t, "a", path, nil)
	srv, err := dataplane.New(dataplane.Config{File: cfg}, map[string]agentmux.Agent{"a": a}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	got := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + ln.Addr().String() + "/")
		if err != nil {
			got <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- string(b)
	}()
	testutil.WaitFor(t, "request in flight", inHandler.Load)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
		defer cancel()
		done <- srv.Shutdown(ctx)
	}()
	time.Sleep(50 * time.Millisecond)
	if !a.Snapshot().Ready {
		t.Fatal("agent closed while a request was in flight")
	}
	close(release)
	if b := <-got; b != "late but complete" {
		t.Fatalf("in-flight request got %q", b)
	}
	if err := <-done; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if err := <-served; err != nil {
		t.Fatalf("serve: %v", err)
	}
	if a.Snapshot().Ready {
		t.Fatal("agent still open after shutdown")
	}
	if _, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		t.Fatal("listener still accepting")
	}
}

func TestMaxRequestBody(t *testing.T) {
	p, up := setup(t, nil, nil, nil, nil, func(m map[string]any) { m["MaxBody"] = "1KiB" })
	resp, _ := p.do(t, "POST", "/", strings.NewReader(strings.Repeat("x", 2048)))
	if resp.StatusCode != 413 || up.count() != 0 {
		t.Fatalf("content-length over the limit: %d, upstream hits %d", resp.StatusCode, up.count())
	}
	resp, _ = p.do(t, "POST", "/", io.MultiReader(strings.NewReader(strings.Repeat("x", 64<<10))))
	if resp.StatusCode != 413 {
		t.Fatalf("chunked over the limit: %d", resp.StatusCode)
	}
	resp, _ = p.do(t, "POST", "/", strings.NewReader("small"))
	if resp.StatusCode != 200 || string(up.last(t).Body) != "small" {
		t.Fatalf("under the limit: %d", resp.StatusCode)
	}
}

// summaryRecorder keeps a copy of every request summary.
type summaryRecorder struct {
	dataplane.NopObserver
	mu   sync.Mutex
	sums []dataplane.RequestSummary
}

func (r *summaryRecorder) RecordRequest(s *dataplane.RequestSummary) {
	r.mu.Lock()
	c := *s
	c.Method = append([]byte(nil), s.Method...)
	c.Path = append([]byte(nil), s.Path...)
	r.sums = append(r.sums, c)
	r.mu.Unlock()
}

func (r *summaryRecorder) last(t *testing.T) dataplane.RequestSummary {
	t.Helper()
	var s dataplane.RequestSummary
	testutil.WaitFor(t, "a summary", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.sums) == 0 {
			return false
		}
		s = r.sums[len(r.sums)-1]
		r.sums = r.sums[:0]
		return true
	})
	return s
}

func TestRequestSummaries(t *testing.T) {
	u := newUpstream(t, nil)
	agent := &agentFuncs{Base: sdk.Base{Caps: bodyCaps(true)},
		reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
			switch string(m.URI) {
			case "/block":
				d.Kind = protocol.DecisionBlock
			case "/go":
				d.Kind = protocol.DecisionRedirect
				d.RedirectURL = []byte("/elsewhere")
			}
			return nil
		},
		reqBody: rewrite(&chunkRecorder{})}
	path := serveAgent(t, agent)
	cfg := configText(t, oneAgentConfig, map[string]any{"Upstream": u.addr(), "Chain": "a",
		"Agents": map[string]agentSpec{"a": {Path: path, ReqMode: "streaming", RespMode: "none", Chunk: "1KiB"}}})
	rec := &summaryRecorder{}
	p := startProxy(t, cfg, map[string]agentmux.Agent{"a": udsAgent(t, "a", path, nil)}, dataplane.Observers(rec, &countingObserver{}))

	p.do(t, "POST", "/up", strings.NewReader(threeChunks()))
	s := rec.last(t)
	if s.Outcome != dataplane.RequestAllowed || s.Status != 200 || s.RouteName != "main" || string(s.Method) != "POST" ||
		s.BytesIn != 3072 || s.Inspected[0] != 3072 || s.Mutated[0] != 2048 || s.BytesOut != int64(len("hello from upstream")) ||
		s.AgentTime[dataplane.PhaseRequestHeaders] <= 0 || s.AgentTime[dataplane.PhaseRequestBody] <= 0 || s.Agent != -1 {
		t.Errorf("allowed: %+v", s)
	}
	p.do(t, "GET", "/block", nil)
	if s := rec.last(t); s.Outcome != dataplane.RequestBlocked || s.Status != 403 || s.AgentName != "a" || s.Agent != 0 {
		t.Errorf("blocked: %+v", s)
	}
	p.do(t, "GET", "/go", nil)
	if s := rec.last(t); s.Outcome != dataplane.RequestRedirected || s.Status != 302 {
		t.Errorf("redirected: %+v", s)
	}
	p.do(t, "CONNECT", "/", nil)
	if s := rec.last(t); s.Outcome != dataplane.RequestRejected || s.Status != 405 {
		t.Errorf("rejected: %+v", s)
	}
	u.srv.Close()
	p.do(t, "GET", "/", nil)
	if s := rec.last(t); s.Outcome != dataplane.RequestUpstreamError || s.Status != 502 {
		t.Errorf("upstream error: %+v", s)
	}
}

func TestUnixListenerAndUpstream(t *testing.T) {
	upPath := testutil.SocketPath(t)
	uln, err := net.Listen("unix", upPath)
	if err != nil {
		t.Fatal(err)
	}
	usrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "over unix, host %s", r.Host)
	})}
	go usrv.Serve(uln)
	t.Cleanup(func() { usrv.Close() })
	lnPath := testutil.SocketPath(t)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
listeners: [{address: "unix:%s"}]
upstreams: [{name: app, address: "unix:%s"}]
routes: [{name: r, upstream: app}]
`, lnPath, upPath)))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := dataplane.New(dataplane.Config{File: cfg}, nil, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe() }()
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", lnPath)
	}}}
	var resp *http.Response
	testutil.WaitFor(t, "unix listener", func() bool {
		resp, err = client.Get("http://svc.local/")
		return err == nil
	})
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "over unix, host svc.local" {
		t.Fatalf("got %d %q", resp.StatusCode, b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatalf("ListenAndServe: %v", err)
	}
}

// TestTruncatedSmallResponseIs502: a small body of known length is read
// whole before anything is sent, so an upstream that closes early gets
// the client a clean 502 rather than a cut-off 200.
func TestTruncatedSmallResponseIs502(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				if _, err := c.Read(buf); err != nil {
					return
				}
				_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf!"))
			}()
		}
	}()
	cfg := configText(t, oneAgentConfig, map[string]any{"Upstream": ln.Addr().String(), "Chain": ""})
	p := startProxy(t, cfg, nil, nil)
	resp, body := p.do(t, "GET", "/", nil)
	if resp.StatusCode != 502 {
		t.Fatalf("got %d %q, want 502", resp.StatusCode, body)
	}
	if st := p.srv.Stats(); st.UpstreamErrors != 1 || st.ResponseAborted != 0 {
		t.Errorf("upstream errors %d, aborted %d", st.UpstreamErrors, st.ResponseAborted)
	}
}
