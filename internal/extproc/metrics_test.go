package extproc_test

import (
	"testing"

	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/extproc"
	"github.com/zentinelproxy/sidecar/internal/metrics"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/protocol"
)

// TestCollector: the transport's counters are exported per agent, from
// the client's report of itself (agentmux.Reporter) as the sidecar's
// metrics read it.
func TestCollector(t *testing.T) {
	_, addr, _ := startProcessor(t, func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
		return []*extprocsvc.ProcessingResponse{cont(req, &extprocsvc.CommonResponse{ClearRouteCache: true})}, nil
	}, nil)
	c := newClient(t, addr, func(cfg *extproc.Config) { cfg.Name = "metrics-probe" })
	ex := begin(t, c)
	if _, err := ex.RequestHeaders(wait(), reqHeaders(false)); err != nil {
		t.Fatal(err)
	}
	ex.Finish()
	m, err := metrics.New(metrics.Config{Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	m.SetAgents(func() []agentmux.AgentStatus { return []agentmux.AgentStatus{c.Snapshot()} })
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "sidecar_extproc_events_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["agent"] == "metrics-probe" {
				got[labels["event"]] = m.GetCounter().GetValue()
			}
		}
	}
	if got["clear_route_cache_ignored"] != 1 || got["streams_opened"] != 1 || got["wrong_phase"] != 0 {
		t.Errorf("counters %v", got)
	}
}

// TestCleanEndPasses: a processor that ends its stream cleanly with
// nothing awaited is done with the request: later phases pass without it.
func TestCleanEndPasses(t *testing.T) {
	p, addr, _ := startProcessor(t, func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
		return []*extprocsvc.ProcessingResponse{cont(req, nil)}, errEndAfterSend
	}, nil)
	c := newClient(t, addr, nil)
	ex := begin(t, c)
	defer ex.Finish()
	if _, err := ex.RequestHeaders(wait(), reqHeaders(false)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the client to see the stream end", func() bool { return c.Counts()["processor_done"] == 1 })
	r, err := ex.ResponseHeaders(wait(), &protocol.ResponseHeaders{StatusCode: 200})
	if err != nil || r.Decision.Kind != protocol.DecisionAllow {
		t.Fatalf("after a clean end: %v %+v", err, r)
	}
	if n := len(p.received()); n != 1 {
		t.Errorf("processor got %d messages", n)
	}
}
