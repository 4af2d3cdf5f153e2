package metrics

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/observe"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/reverse"
	"github.com/zentinelproxy/sidecar/sdk"
)

func newMetrics(t testing.TB) *Metrics {
	t.Helper()
	m, err := New(Config{Registry: prometheus.NewRegistry(), Version: "v1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// values gathers g and flattens it to `name{l1="v1",l2="v2"}` → value;
// histograms add name_count, name_sum and name_bucket{…,le="x"}.
func values(t testing.TB, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := labelString(m.GetLabel(), "")
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[mf.GetName()+labels] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[mf.GetName()+labels] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				out[mf.GetName()+"_count"+labels] = float64(h.GetSampleCount())
				out[mf.GetName()+"_sum"+labels] = h.GetSampleSum()
				for _, b := range h.GetBucket() {
					le := fmt.Sprintf("%g", b.GetUpperBound())
					out[mf.GetName()+"_bucket"+labelString(m.GetLabel(), le)] = float64(b.GetCumulativeCount())
				}
			}
		}
	}
	return out
}

func labelString(ls []*dto.LabelPair, le string) string {
	parts := make([]string, 0, len(ls)+1)
	for _, l := range ls {
		parts = append(parts, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	if le != "" {
		parts = append(parts, fmt.Sprintf("le=%q", le))
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return ""
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// sum adds every series of the named family (counters and gauges).
func sum(v map[string]float64, name string) float64 {
	total := 0.0
	for k, x := range v {
		if k == name || strings.HasPrefix(k, name+"{") {
			total += x
		}
	}
	return total
}

func expect(t *testing.T, v map[string]float64, key string, want float64) {
	t.Helper()
	got, ok := v[key]
	if !ok {
		t.Errorf("%s: missing", key)
		return
	}
	if math.Abs(got-want) > 1e-9 {
		t.Errorf("%s = %v, want %v", key, got, want)
	}
}

func summary(route int, o observe.RequestOutcome, agent int) *observe.RequestSummary {
	return &observe.RequestSummary{Route: route, Outcome: o, Agent: agent, Status: 200, Duration: 300 * time.Microsecond}
}

func TestRequestsByRouteAndOutcome(t *testing.T) {
	m := newMetrics(t)
	m.Reset([]string{"api", "static"}, []string{"waf", "auth"})
	mix := []struct {
		route, agent int
		o            observe.RequestOutcome
		n            int
	}{
		{0, -1, observe.RequestAllowed, 5},
		{0, 0, observe.RequestBlocked, 2},
		{1, 0, observe.RequestRedirected, 1},
		{1, -1, observe.RequestFailedOpen, 1},
		{0, 1, observe.RequestFailedClosed, 3},
		{1, -1, observe.RequestUpstreamError, 1},
		{-1, -1, observe.RequestRejected, 4},
		{0, -1, observe.RequestClientGone, 1},
	}
	for _, x := range mix {
		for range x.n {
			m.RecordRequest(summary(x.route, x.o, x.agent))
		}
	}
	v := values(t, m.Registry())
	for _, x := range mix {
		route := NoRoute
		if x.route >= 0 {
			route = []string{"api", "static"}[x.route]
		}
		expect(t, v, fmt.Sprintf(`sidecar_requests_total{outcome=%q,route=%q}`, x.o, route), float64(x.n))
	}
	expect(t, v, `sidecar_requests_total{outcome="allowed",route="static"}`, 0)
	if got := sum(v, "sidecar_requests_total"); got != 18 {
		t.Errorf("requests total %v, want 18", got)
	}
	expect(t, v, `sidecar_request_duration_seconds_count{route="api"}`, 11)
	expect(t, v, `sidecar_request_duration_seconds_count{route="(none)"}`, 4)
	// Fail-closed requests are charged to the deciding agent.
	expect(t, v, `sidecar_agent_failures_total{agent="auth",policy="closed"}`, 3)
	expect(t, v, `sidecar_agent_failures_total{agent="waf",policy="closed"}`, 0)
}

func TestAgentEvents(t *testing.T) {
	m := newMetrics(t)
	m.Reset([]string{"api"}, []string{"waf", "auth"})
	us := time.Microsecond
	ev := func(agent int, p protocol.Phase, body bool, o observe.Outcome, d time.Duration) {
		m.AgentEvent(0, agent, p, body, o, d)
	}
	for range 3 {
		ev(0, protocol.PhaseRequest, false, observe.OutcomeAllow, 50*us)
	}
	ev(0, protocol.PhaseRequest, false, observe.OutcomeBlock, 15*us)
	ev(0, protocol.PhaseRequest, true, observe.OutcomeContinue, 30*us)
	ev(0, protocol.PhaseResponse, false, observe.OutcomeRedirect, 2*time.Millisecond)
	ev(1, protocol.PhaseResponse, true, observe.OutcomeAllow, 100*us)
	// Errors: counted by kind, no latency sample (no reply).
	ev(1, protocol.PhaseRequest, false, observe.OutcomeTimeout, time.Second)
	ev(1, protocol.PhaseRequest, false, observe.OutcomeTimeout, time.Second)
	ev(1, protocol.PhaseRequest, false, observe.OutcomeUnavailable, 0)
	ev(1, protocol.PhaseRequest, false, observe.OutcomeOverloaded, 0)
	ev(1, protocol.PhaseRequest, false, observe.OutcomeConnLost, 40*us)
	ev(0, protocol.PhaseRequest, false, observe.OutcomeInvalid, 20*us) // an invalid reply: a sample
	ev(0, protocol.PhaseRequest, false, observe.OutcomeInvalid, 0)     // begin failed: none
	ev(0, protocol.PhaseRequest, false, observe.OutcomeCanceled, 70*us)
	m.MutationRefused(0, 0)
	m.MutationRefused(0, 0)
	m.FailOpen(0, 1)
	m.InspectionSkipped(0, 1, protocol.PhaseResponse)
	m.Upstream(0, true)
	m.Upstream(0, false)
	m.Upstream(-1, false)
	// Out-of-range agents (a request of a retired table) are ignored.
	ev(7, protocol.PhaseRequest, false, observe.OutcomeAllow, 50*us)
	m.FailOpen(0, 9)

	v := values(t, m.Registry())
	rh := `{agent="waf",phase="request_headers"}`
	expect(t, v, `sidecar_agent_latency_seconds_count`+rh, 5)
	expect(t, v, `sidecar_agent_latency_seconds_sum`+rh, 185e-6)
	expect(t, v, `sidecar_agent_latency_seconds_bucket{agent="waf",le="1e-05",phase="request_headers"}`, 0)
	expect(t, v, `sidecar_agent_latency_seconds_bucket{agent="waf",le="2e-05",phase="request_headers"}`, 2)
	expect(t, v, `sidecar_agent_latency_seconds_bucket{agent="waf",le="4e-05",phase="request_headers"}`, 2)
	expect(t, v, `sidecar_agent_latency_seconds_bucket{agent="waf",le="8e-05",phase="request_headers"}`, 5)
	expect(t, v, `sidecar_agent_latency_seconds_count{agent="waf",phase="request_body"}`, 1)
	expect(t, v, `sidecar_agent_latency_seconds_count{agent="waf",phase="response_headers"}`, 1)
	expect(t, v, `sidecar_agent_latency_seconds_count{agent="auth",phase="response_body"}`, 1)
	expect(t, v, `sidecar_agent_latency_seconds_count{agent="auth",phase="request_headers"}`, 0)

	expect(t, v, `sidecar_agent_decisions_total{agent="waf",decision="allow"}`, 3)
	expect(t, v, `sidecar_agent_decisions_total{agent="waf",decision="block"}`, 1)
	expect(t, v, `sidecar_agent_decisions_total{agent="waf",decision="redirect"}`, 1)
	expect(t, v, `sidecar_agent_decisions_total{agent="waf",decision="continue"}`, 1)
	expect(t, v, `sidecar_agent_decisions_total{agent="auth",decision="allow"}`, 1)

	expect(t, v, `sidecar_agent_errors_total{agent="auth",kind="timeout"}`, 2)
	expect(t, v, `sidecar_agent_errors_total{agent="auth",kind="unavailable"}`, 1)
	expect(t, v, `sidecar_agent_errors_total{agent="auth",kind="overloaded"}`, 1)
	expect(t, v, `sidecar_agent_errors_total{agent="auth",kind="connection_lost"}`, 1)
	expect(t, v, `sidecar_agent_errors_total{agent="waf",kind="protocol_error"}`, 2)
	expect(t, v, `sidecar_agent_errors_total{agent="waf",kind="refused_mutation"}`, 2)
	expect(t, v, `sidecar_agent_errors_total{agent="waf",kind="timeout"}`, 0)
	if got := sum(v, "sidecar_agent_errors_total"); got != 9 {
		t.Errorf("agent errors total %v, want 9", got)
	}
	expect(t, v, `sidecar_agent_inspection_skipped_total{agent="auth",direction="response"}`, 1)

	want := `
# HELP sidecar_agent_failures_total Agent failures that decided a request by failure policy: open (passed, marked) or closed (503/504), by agent.
# TYPE sidecar_agent_failures_total counter
sidecar_agent_failures_total{agent="auth",policy="closed"} 0
sidecar_agent_failures_total{agent="auth",policy="open"} 1
sidecar_agent_failures_total{agent="waf",policy="closed"} 0
sidecar_agent_failures_total{agent="waf",policy="open"} 0
# HELP sidecar_upstream_errors_total Upstream failures answered 502/503 (kind error) or 504 (kind timeout), by route.
# TYPE sidecar_upstream_errors_total counter
sidecar_upstream_errors_total{kind="error",route="(none)"} 1
sidecar_upstream_errors_total{kind="error",route="api"} 1
sidecar_upstream_errors_total{kind="timeout",route="(none)"} 0
sidecar_upstream_errors_total{kind="timeout",route="api"} 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "sidecar_agent_failures_total", "sidecar_upstream_errors_total"); err != nil {
		t.Error(err)
	}
}

func TestBodyBytes(t *testing.T) {
	m := newMetrics(t)
	m.Reset([]string{"up"}, []string{"a"})
	s := summary(0, observe.RequestAllowed, -1)
	s.BytesIn, s.BytesOut = 4096, 100
	s.Inspected = [2]int64{4096, 50}
	s.Mutated = [2]int64{0, 50}
	m.RecordRequest(s)
	m.RecordRequest(s)
	v := values(t, m.Registry())
	expect(t, v, `sidecar_body_bytes_total{direction="in",route="up"}`, 8192)
	expect(t, v, `sidecar_body_bytes_total{direction="out",route="up"}`, 200)
	expect(t, v, `sidecar_body_bytes_inspected_total{direction="request",route="up"}`, 8192)
	expect(t, v, `sidecar_body_bytes_inspected_total{direction="response",route="up"}`, 100)
	expect(t, v, `sidecar_body_bytes_mutated_total{direction="request",route="up"}`, 0)
	expect(t, v, `sidecar_body_bytes_mutated_total{direction="response",route="up"}`, 100)
}

// TestResetKeepsCounters: a reload that reorders the names keeps each
// name's counts, and a name that disappears keeps its series.
func TestResetKeepsCounters(t *testing.T) {
	m := newMetrics(t)
	m.Reset([]string{"a", "b"}, []string{"x", "y"})
	m.RecordRequest(summary(1, observe.RequestAllowed, -1))
	m.AgentEvent(1, 1, protocol.PhaseRequest, false, observe.OutcomeTimeout, 0)
	m.Reset([]string{"b", "c"}, []string{"y"})
	m.RecordRequest(summary(0, observe.RequestAllowed, -1))
	m.AgentEvent(0, 0, protocol.PhaseRequest, false, observe.OutcomeTimeout, 0)
	m.RecordRequest(summary(1, observe.RequestAllowed, -1))
	v := values(t, m.Registry())
	expect(t, v, `sidecar_requests_total{outcome="allowed",route="b"}`, 2)
	expect(t, v, `sidecar_requests_total{outcome="allowed",route="c"}`, 1)
	expect(t, v, `sidecar_requests_total{outcome="allowed",route="a"}`, 0)
	expect(t, v, `sidecar_agent_errors_total{agent="y",kind="timeout"}`, 2)
	expect(t, v, `sidecar_agent_errors_total{agent="x",kind="timeout"}`, 0)
}

// TestResetConcurrent swaps tables while events arrive from several
// goroutines (run with -race): nothing is lost or misplaced beyond the
// indices every table shares.
func TestResetConcurrent(t *testing.T) {
	m := newMetrics(t)
	m.Reset([]string{"r0", "r1"}, []string{"a0", "a1"})
	const workers, per = 4, 2000
	stop := make(chan struct{})
	var resets sync.WaitGroup
	resets.Add(1)
	go func() {
		defer resets.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			n := 2 + i%3
			routes, agents := make([]string, n), make([]string, n)
			for k := range n {
				routes[k], agents[k] = fmt.Sprintf("r%d", k), fmt.Sprintf("a%d", k)
			}
			m.Reset(routes, agents)
			time.Sleep(50 * time.Microsecond)
		}
	}()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range per {
				route, agent := r.IntN(2), r.IntN(2)
				m.AgentEvent(route, agent, protocol.PhaseRequest, false, observe.OutcomeAllow, 20*time.Microsecond)
				m.RecordRequest(summary(route, observe.RequestAllowed, agent))
			}
		}()
	}
	wg.Wait()
	close(stop)
	resets.Wait()
	v := values(t, m.Registry())
	if got := sum(v, "sidecar_requests_total"); got != workers*per {
		t.Errorf("requests %v, want %d", got, workers*per)
	}
	if got := sum(v, "sidecar_agent_decisions_total"); got != workers*per {
		t.Errorf("decisions %v, want %d", got, workers*per)
	}
	got := v[`sidecar_agent_latency_seconds_count{agent="a0",phase="request_headers"}`] +
		v[`sidecar_agent_latency_seconds_count{agent="a1",phase="request_headers"}`]
	if got != workers*per {
		t.Errorf("latency samples %v, want %d", got, workers*per)
	}
}

func TestScrapeTimeAgents(t *testing.T) {
	m := newMetrics(t)
	m.Reset([]string{"r"}, []string{"waf", "auth"})
	m.AgentEvent(0, 0, protocol.PhaseRequest, false, observe.OutcomeTimeout, 0)
	var mu sync.Mutex
	st := []agentmux.AgentStatus{
		{Name: "waf", Transport: "uds", Connections: 2, Ready: true, InFlight: 7, Late: 3, Completed: 100, Writes: 40, FramesWritten: 110},
		{Name: "auth", Transport: "grpc", Connections: 0, Ready: false},
	}
	m.SetAgents(func() []agentmux.AgentStatus {
		mu.Lock()
		defer mu.Unlock()
		return append([]agentmux.AgentStatus(nil), st...)
	})
	m.SetStats(func() observe.Stats {
		return observe.Stats{InFlight: 5, ResponseAborted: 2, InlineBodies: 4,
			RateLimitedBy: map[string]uint64{"route/api": 7, "listener/pub": 2}, RateLimitKeysEvictedBy: map[string]uint64{"route/api": 5}, RouteRetries: 3, RetryBudgetExhausted: 1,
			RouteRetriesBy:    map[string]observe.RouteRetryStats{"api": {Retries: map[string]uint64{"503": 2, "reset": 1}, BudgetExhausted: 1, NotReplayable: 4}},
			GlobalRateLimited: 6, GlobalRateLimitErrors: 2}
	})
	v := values(t, m.Registry())
	expect(t, v, `sidecar_agent_connections{agent="waf",transport="uds"}`, 2)
	expect(t, v, `sidecar_agent_connections{agent="auth",transport="grpc"}`, 0)
	expect(t, v, `sidecar_agent_in_flight{agent="waf"}`, 7)
	expect(t, v, `sidecar_agent_ready{agent="waf"}`, 1)
	expect(t, v, `sidecar_agent_ready{agent="auth"}`, 0)
	expect(t, v, `sidecar_agent_exchanges_completed_total{agent="waf"}`, 100)
	expect(t, v, `sidecar_agent_writes_total{agent="waf"}`, 40)
	expect(t, v, `sidecar_agent_frames_written_total{agent="waf"}`, 110)
	// A transport that writes no batches (grpc) has no such series.
	if _, ok := v[`sidecar_agent_writes_total{agent="auth"}`]; ok {
		t.Error("writes exported for an agent without batched writes")
	}
	// late_reply merges into the per-event family.
	expect(t, v, `sidecar_agent_errors_total{agent="waf",kind="late_reply"}`, 3)
	expect(t, v, `sidecar_agent_errors_total{agent="waf",kind="timeout"}`, 1)
	expect(t, v, `sidecar_requests_in_flight`, 5)
	expect(t, v, `sidecar_responses_aborted_total`, 2)
	expect(t, v, `sidecar_agent_inline_bodies_total`, 4)
	expect(t, v, `sidecar_rate_limited_total{name="api",scope="route"}`, 7)
	expect(t, v, `sidecar_rate_limited_total{name="pub",scope="listener"}`, 2)
	expect(t, v, `sidecar_rate_limit_keys_evicted_total{name="api",scope="route"}`, 5)
	expect(t, v, `sidecar_route_retries_total{reason="503",route="api"}`, 2)
	expect(t, v, `sidecar_route_retries_total{reason="reset",route="api"}`, 1)
	expect(t, v, `sidecar_route_retry_budget_exhausted_total{route="api"}`, 1)
	expect(t, v, `sidecar_route_retries_not_replayable_total{route="api"}`, 4)
	expect(t, v, `sidecar_global_rate_limited_total`, 6)
	expect(t, v, `sidecar_global_rate_limit_errors_total`, 2)

	mu.Lock()
	st[1].Connections, st[1].Ready = 1, true
	mu.Unlock()
	v = values(t, m.Registry())
	expect(t, v, `sidecar_agent_ready{agent="auth"}`, 1)

	m.SetAgents(nil)
	m.SetStats(nil)
	v = values(t, m.Registry())
	if _, ok := v[`sidecar_agent_ready{agent="auth"}`]; ok {
		t.Error("agent gauges still exported after SetAgents(nil)")
	}
	if _, ok := v[`sidecar_requests_in_flight`]; ok {
		t.Error("in-flight still exported after SetStats(nil)")
	}
	if n, err := testutil.GatherAndCount(m.Registry(), "sidecar_build_info"); err != nil || n != 1 {
		t.Errorf("build_info: %d series, %v", n, err)
	}
}

func TestConfigReloaded(t *testing.T) {
	m := newMetrics(t)
	m.ConfigReloaded(nil)
	m.ConfigReloaded(fmt.Errorf("bad"))
	m.ConfigReloaded(fmt.Errorf("bad"))
	v := values(t, m.Registry())
	expect(t, v, `sidecar_config_reloads_total{result="success"}`, 1)
	expect(t, v, `sidecar_config_reloads_total{result="failure"}`, 2)
	if v[`sidecar_config_last_reload_success_timestamp_seconds`] < float64(time.Now().Add(-time.Hour).Unix()) {
		t.Error("last reload timestamp not set")
	}
}

// TestReverseRegistrations runs a real reverse listener: one agent
// registers with the right token, one with a wrong token.
func TestReverseRegistrations(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rev.sock")
	cfg := reverse.DefaultConfig()
	cfg.UnixPath = path
	cfg.FailureDelay = time.Millisecond
	cfg.Agents = []reverse.AgentConfig{{Name: "rv", Tokens: []string{"good-token"}}}
	l, err := reverse.NewListener(cfg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- l.Serve(context.Background()) }()
	defer func() {
		_ = l.Close()
		<-served
	}()

	m := newMetrics(t)
	m.SetAgents(func() []agentmux.AgentStatus { return []agentmux.AgentStatus{l.Agent("rv").Snapshot()} })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := &sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true}}
	var agents sync.WaitGroup
	for _, token := range []string{"good-token", "bad-token"} {
		agents.Add(1)
		go func() {
			defer agents.Done()
			_ = sdk.DialAndServe(ctx, sdk.ReverseConfig{Address: path, AgentID: "rv-1", Token: token, BackoffMin: time.Hour, BackoffMax: time.Hour}, h)
		}()
	}
	listener := "unix:" + path
	deadline := time.Now().Add(10 * time.Second)
	for {
		v := values(t, m.Registry())
		acc := v[fmt.Sprintf(`sidecar_reverse_registrations_accepted_total{listener=%q}`, listener)]
		rej := v[fmt.Sprintf(`sidecar_reverse_registrations_rejected_total{listener=%q,reason="auth"}`, listener)]
		conns := v[`sidecar_agent_connections{agent="rv",transport="reverse"}`]
		if acc == 1 && rej == 1 && conns == 1 {
			expect(t, v, fmt.Sprintf(`sidecar_reverse_connections{listener=%q,state="active"}`, listener), 1)
			expect(t, v, fmt.Sprintf(`sidecar_reverse_registrations_rejected_total{listener=%q,reason="version"}`, listener), 0)
			expect(t, v, fmt.Sprintf(`sidecar_reverse_registrations_rejected_total{listener=%q,reason="evicted"}`, listener), 0)
			expect(t, v, fmt.Sprintf(`sidecar_reverse_refusals_unheld_total{listener=%q}`, listener), 0)
			// The refusal may still be draining: the series must be there.
			if _, ok := v[fmt.Sprintf(`sidecar_reverse_connections{listener=%q,state="refusing"}`, listener)]; !ok {
				t.Error("sidecar_reverse_connections{state=\"refusing\"} missing")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("accepted %v rejected(auth) %v connections %v; want 1, 1, 1", acc, rej, conns)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	agents.Wait()
}

// TestSharedReverseListener: agents on one reverse listener each report
// it; its series are exported once, under its address.
func TestSharedReverseListener(t *testing.T) {
	cfg := reverse.DefaultConfig()
	cfg.UnixPath = filepath.Join(t.TempDir(), "rev.sock")
	cfg.Agents = []reverse.AgentConfig{{Name: "a", AllowNoToken: true}, {Name: "b", AllowNoToken: true}}
	l, err := reverse.NewListener(cfg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	m := newMetrics(t)
	m.SetAgents(func() []agentmux.AgentStatus {
		return []agentmux.AgentStatus{l.Agent("a").Snapshot(), l.Agent("b").Snapshot()}
	})
	v := values(t, m.Registry()) // a series collected twice fails the gather
	listener := "unix:" + cfg.UnixPath
	expect(t, v, fmt.Sprintf(`sidecar_reverse_registrations_accepted_total{listener=%q}`, listener), 0)
	expect(t, v, fmt.Sprintf(`sidecar_reverse_connections{listener=%q,state="pending"}`, listener), 0)
	expect(t, v, `sidecar_agent_connections{agent="b",transport="reverse"}`, 0)
}

func TestHotPathDoesNotAllocate(t *testing.T) {
	m := newMetrics(t)
	m.Reset([]string{"r"}, []string{"a"})
	s := summary(0, observe.RequestAllowed, -1)
	s.BytesIn, s.Inspected[0] = 10, 10
	allocs := testing.AllocsPerRun(1000, func() {
		m.AgentEvent(0, 0, protocol.PhaseRequest, false, observe.OutcomeAllow, 25*time.Microsecond)
		m.AgentEvent(0, 0, protocol.PhaseResponse, true, observe.OutcomeContinue, 25*time.Microsecond)
		m.FailOpen(0, 0)
		m.Upstream(0, false)
		m.RecordRequest(s)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per request, want 0", allocs)
	}
}

func TestRegisterConflict(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := New(Config{Registry: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Registry: reg}); err == nil {
		t.Fatal("second New on the same registry succeeded")
	}
}

func TestDefaultRegistryHasRuntimeCollectors(t *testing.T) {
	m, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	n, err := testutil.GatherAndCount(m.Registry(), "go_goroutines")
	if err != nil || n != 1 {
		t.Errorf("go_goroutines: %d series, %v", n, err)
	}
}
