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
