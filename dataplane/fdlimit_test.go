package dataplane

import (
	"bytes"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/config"
)

func TestConnectionBudget(t *testing.T) {
	cfg := func(listeners int, upstreamConns ...int) *config.Config {
		c := &config.Config{}
		for i := 0; i < listeners; i++ {
			c.Listeners = append(c.Listeners, config.Listener{Name: "l"})
		}
		for _, n := range upstreamConns {
			c.Upstreams = append(c.Upstreams, config.Upstream{MaxConns: n})
		}
		return c
	}
	for _, tc := range []struct {
		name   string
		cfg    *config.Config
		nofile uint64
		want   int
	}{
		{"unknown limit", cfg(1, 1024), 0, 0},
		// 256: reserve 64; 192/2 = 96 clients, each with an upstream conn.
		{"small limit, big upstream pool", cfg(1, 1024), 256, 96},
		// 20000: reserve 128; 9936 > 1024, so 19872 - 1024.
		{"upstream pool smaller than half", cfg(1, 1024), 20000, 18848},
		{"two listeners share", cfg(2, 1024), 20000, 9424},
		{"two upstreams add up", cfg(1, 512, 512), 20000, 18848},
		{"tiny limit still allows one", cfg(1, 1024), 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := connectionBudget(tc.cfg, tc.nofile); got != tc.want {
				t.Errorf("budget %d, want %d", got, tc.want)
			}
		})
	}
}

func TestClampConnections(t *testing.T) {
	var buf bytes.Buffer
	log := zerolog.New(&buf)
	l := config.Listener{Name: "pub"}
	if clampConnections(&l, 500, 1024, log) || l.MaxConnections != 500 {
		t.Errorf("unset: clamped=%v max %d, want silently 500", true, l.MaxConnections)
	}
	l = config.Listener{Name: "pub"}
	if clampConnections(&l, 100000, 0, log); l.MaxConnections != defaultMaxConnections {
		t.Errorf("unset, big budget: %d", l.MaxConnections)
	}
	if buf.Len() != 0 {
		t.Errorf("an unset limit logged: %s", buf.String())
	}
	l = config.Listener{Name: "pub", MaxConnections: 5000}
	if !clampConnections(&l, 500, 1024, log) || l.MaxConnections != 500 {
		t.Errorf("explicit over budget: max %d, want clamped to 500", l.MaxConnections)
	}
	if !strings.Contains(buf.String(), "clamped") || !strings.Contains(buf.String(), `"listener":"pub"`) {
		t.Errorf("clamp not logged loudly: %s", buf.String())
	}
	l = config.Listener{Name: "pub", MaxConnections: 400}
	if clampConnections(&l, 500, 1024, log) || l.MaxConnections != 400 {
		t.Errorf("explicit within budget changed: %d", l.MaxConnections)
	}
}

// A tunnel's client descriptor is outside max_connections: both limits
// together stay within the listener's budget.
func TestClampTunnels(t *testing.T) {
	var buf bytes.Buffer
	log := zerolog.New(&buf)
	// ulimit -n 256 with the default 1024 tunnels: budget 96.
	l := config.Listener{Name: "pub", MaxTunnels: 1024}
	clampConnections(&l, 96, 256, log)
	if clampTunnels(&l, 96, 256, false, log) || l.MaxConnections+l.MaxTunnels > 96 || l.MaxTunnels != 48 || l.MaxConnections != 48 {
		t.Errorf("unset: max_connections %d + max_tunnels %d, want 48 + 48", l.MaxConnections, l.MaxTunnels)
	}
	if buf.Len() != 0 {
		t.Errorf("unset limits logged: %s", buf.String())
	}
	// A big budget: tunnels keep their number, connections make room.
	l = config.Listener{Name: "pub", MaxTunnels: 1024}
	clampConnections(&l, 18848, 20000, log)
	if clampTunnels(&l, 18848, 20000, false, log); l.MaxTunnels != 1024 || l.MaxConnections != 18848-1024 {
		t.Errorf("big budget: %d + %d", l.MaxConnections, l.MaxTunnels)
	}
	l = config.Listener{Name: "pub", MaxConnections: 90, MaxTunnels: 1024}
	clampConnections(&l, 96, 256, log)
	if !clampTunnels(&l, 96, 256, true, log) || l.MaxConnections != 48 || l.MaxTunnels != 48 {
		t.Errorf("explicit: %d + %d, want 48 + 48", l.MaxConnections, l.MaxTunnels)
	}
	if !strings.Contains(buf.String(), "tunnels_clamped_to") {
		t.Errorf("explicit clamp not logged: %s", buf.String())
	}
	// Within the budget, or no limit known: unchanged.
	l = config.Listener{Name: "pub", MaxConnections: 40, MaxTunnels: 50}
	if clampTunnels(&l, 96, 256, true, log) || l.MaxConnections != 40 || l.MaxTunnels != 50 {
		t.Errorf("within budget changed: %d + %d", l.MaxConnections, l.MaxTunnels)
	}
	l = config.Listener{Name: "pub", MaxConnections: 65536, MaxTunnels: 1024}
	if clampTunnels(&l, 0, 0, true, log) || l.MaxTunnels != 1024 {
		t.Errorf("unknown limit changed: %d + %d", l.MaxConnections, l.MaxTunnels)
	}
}
