package admin

import (
	"encoding/json"
	"testing"

	"github.com/zentinelproxy/sidecar/dataplane"
	"github.com/zentinelproxy/sidecar/internal/config"
)

// /status carries the policy features' state when a source is set.
func TestStatusPolicy(t *testing.T) {
	_, base := start(t, Config{Policy: func() dataplane.PolicyStatus {
		return dataplane.PolicyStatus{
			Circuits: []dataplane.BreakerStatus{{Agent: "waf", State: dataplane.CircuitOpen, Opens: 1, Rejected: 9}},
			Caches:   []dataplane.CacheStatus{{Agent: "authz", Hits: 5}},
		}
	}})
	code, _, body := do(t, "GET", base+"/status", nil)
	if code != 200 {
		t.Fatalf("status %d", code)
	}
	var st Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	p := st.Policy
	if p == nil || len(p.Circuits) != 1 || p.Circuits[0].State != "open" || p.Circuits[0].Rejected != 9 ||
		len(p.Caches) != 1 || p.Caches[0].Hits != 5 || len(p.Shadows) != 0 {
		t.Fatalf("policy %+v in %s", p, body)
	}
	_, base = start(t, Config{})
	var bare Status
	if _, _, body := do(t, "GET", base+"/status", nil); json.Unmarshal([]byte(body), &bare) != nil || bare.Policy != nil {
		t.Fatalf("policy without a source: %s", body)
	}
}

// A shadow agent, even fail-closed, does not hold readiness.
func TestShadowAgentNotRequired(t *testing.T) {
	cfg, err := config.Parse([]byte(`listeners:
  - address: 127.0.0.1:8080
upstreams:
  - name: app
    address: 127.0.0.1:9000
agents:
  - name: waf
    transport: uds
    address: /run/waf.sock
  - name: next
    transport: uds
    address: /run/next.sock
    shadow: true
routes:
  - name: r
    upstream: app
    agents: [waf, next]
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := FailClosedAgents(cfg); len(got) != 1 || got[0] != "waf" {
		t.Fatalf("required %v, want [waf]", got)
	}
}
