package metrics

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/dataplane"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/transports"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// policy blocks /block, redirects /redir, allows the rest, and in request
// bodies replaces every chunk that contains "secret".
type policy struct{ sdk.Base }

func (policy) OnRequestHeaders(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
	switch {
	case bytes.HasPrefix(m.URI, []byte("/app/block")):
		d.Kind, d.Status = protocol.DecisionBlock, 403
	case bytes.HasPrefix(m.URI, []byte("/app/redir")):
		d.Kind, d.Status, d.RedirectURL = protocol.DecisionRedirect, 302, []byte("/elsewhere")
	}
	return nil
}

var masked = []byte("[masked]")

func (policy) OnRequestBody(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
	if bytes.Contains(m.Data, []byte("secret")) {
		r.Replace(masked)
		return nil
	}
	r.Pass()
	return nil
}

// TestDataplaneMix drives a real dataplane (real UDS agent, real upstream)
// with a known mix of requests and checks what the registry says.
func TestDataplaneMix(t *testing.T) {
	dir, err := os.MkdirTemp("", "mx")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "upstream says hi\n") // 17 bytes
	}))
	defer up.Close()
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	_ = dead.Close()

	sock := filepath.Join(dir, "policy.sock")
	ln, err := sdk.ListenUDS(sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	actx, stopAgent := context.WithCancel(context.Background())
	agentDone := make(chan struct{})
	go func() {
		defer close(agentDone)
		_ = sdk.Serve(actx, ln, policy{Base: sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true}}}, nil)
	}()
	defer func() { stopAgent(); <-agentDone }()

	upAddr := strings.TrimPrefix(up.URL, "http://")
	cfg := &config.Config{
		Listeners: []config.Listener{{Address: "127.0.0.1:0"}},
		Upstreams: []config.Upstream{{Name: "app", Address: upAddr}, {Name: "dead", Address: deadAddr}},
		Agents: []config.Agent{
			{Name: "policy", Transport: config.TransportUDS, Address: sock, RequestBody: config.BodyPolicy{Mode: config.BodyBuffered}},
			{Name: "gone-open", Transport: config.TransportUDS, Address: filepath.Join(dir, "none1.sock"), FailureMode: config.FailOpen},
			{Name: "gone-closed", Transport: config.TransportUDS, Address: filepath.Join(dir, "none2.sock")},
		},
		Routes: []config.Route{
			{Name: "app", PathPrefix: "/app/", Upstream: "app", Agents: []config.RouteAgent{{Name: "policy"}}},
			{Name: "open", PathPrefix: "/open/", Upstream: "app", Agents: []config.RouteAgent{{Name: "gone-open"}}},
			{Name: "closed", PathPrefix: "/closed/", Upstream: "app", Agents: []config.RouteAgent{{Name: "gone-closed"}}},
			{Name: "broken", PathPrefix: "/broken/", Upstream: "dead"},
		},
	}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	agents := map[string]agentmux.Agent{}
	for i := range cfg.Agents {
		c := transports.UDSConfig(&cfg.Agents[i], zerolog.Nop())
		c.BackoffMin, c.BackoffMax = 10*time.Millisecond, 100*time.Millisecond
		a, err := udsclient.NewClient(c)
		if err != nil {
			t.Fatal(err)
		}
		agents[cfg.Agents[i].Name] = a
	}
	wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := agents["policy"].(*udsclient.Client).WaitReady(wctx); err != nil {
		t.Fatal(err)
	}

	m := newMetrics(t)
	srv, err := dataplane.New(dataplane.Config{File: cfg, Observer: m}, agents, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	m.SetAgents(srv.AgentStatus)
	m.SetStats(srv.Stats)
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(pl) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-served
	}()

	client := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	base := "http://" + pl.Addr().String()
	mix := []struct {
		method, path, body string
		n, status          int
	}{
		{"GET", "/app/ok", "", 5, 200},
		{"POST", "/app/post", strings.Repeat("x", 1000), 1, 200},
		{"POST", "/app/post", "a secret", 1, 200},
		{"GET", "/app/block", "", 3, 403},
		{"GET", "/app/redir", "", 2, 302},
		{"GET", "/open/x", "", 4, 200},
		{"GET", "/closed/x", "", 2, 503},
		{"GET", "/broken/x", "", 1, 502},
		{"GET", "/nowhere", "", 2, 404},
	}
	for _, x := range mix {
		for range x.n {
			var body io.Reader
			if x.body != "" {
				body = strings.NewReader(x.body)
			}
			req, _ := http.NewRequest(x.method, base+x.path, body)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != x.status {
				t.Fatalf("%s %s: %d, want %d", x.method, x.path, resp.StatusCode, x.status)
			}
		}
	}

	v := values(t, m.Registry())
	for key, want := range map[string]float64{
		`sidecar_requests_total{outcome="allowed",route="app"}`:           7,
		`sidecar_requests_total{outcome="blocked",route="app"}`:           3,
		`sidecar_requests_total{outcome="redirected",route="app"}`:        2,
		`sidecar_requests_total{outcome="failed_open",route="open"}`:      4,
		`sidecar_requests_total{outcome="failed_closed",route="closed"}`:  2,
		`sidecar_requests_total{outcome="upstream_error",route="broken"}`: 1,
		`sidecar_requests_total{outcome="rejected",route="(none)"}`:       2,
		`sidecar_request_duration_seconds_count{route="app"}`:             12,

		`sidecar_agent_decisions_total{agent="policy",decision="allow"}`:              7,
		`sidecar_agent_decisions_total{agent="policy",decision="block"}`:              3,
		`sidecar_agent_decisions_total{agent="policy",decision="redirect"}`:           2,
		`sidecar_agent_decisions_total{agent="policy",decision="continue"}`:           0,  // both bodies went inline (one chunk each):
		`sidecar_agent_latency_seconds_count{agent="policy",phase="request_headers"}`: 12, // the headers event decided them
		`sidecar_agent_latency_seconds_count{agent="policy",phase="request_body"}`:    0,
		`sidecar_agent_inline_bodies_total`:                                           2,
		`sidecar_agent_errors_total{agent="gone-open",kind="unavailable"}`:            4,
		`sidecar_agent_errors_total{agent="gone-closed",kind="unavailable"}`:          2,
		`sidecar_agent_errors_total{agent="policy",kind="late_reply"}`:                0,
		`sidecar_agent_failures_total{agent="gone-open",policy="open"}`:               4,
		`sidecar_agent_failures_total{agent="gone-closed",policy="closed"}`:           2,
		`sidecar_upstream_errors_total{kind="error",route="broken"}`:                  1,

		`sidecar_body_bytes_total{direction="in",route="app"}`:                 1008,
		`sidecar_body_bytes_total{direction="out",route="app"}`:                7 * 17,
		`sidecar_body_bytes_inspected_total{direction="request",route="app"}`:  1008,
		`sidecar_body_bytes_mutated_total{direction="request",route="app"}`:    8,
		`sidecar_body_bytes_inspected_total{direction="response",route="app"}`: 0,

		`sidecar_agent_connections{agent="policy",transport="uds"}`: 1,
		`sidecar_agent_ready{agent="gone-open"}`:                    0,
		`sidecar_agent_in_flight{agent="policy"}`:                   0,
		`sidecar_requests_in_flight`:                                0,
	} {
		got, ok := v[key]
		if !ok {
			t.Errorf("%s: missing", key)
		} else if got != want {
			t.Errorf("%s = %v, want %v", key, got, want)
		}
	}
}
