package config_test

import (
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// body_min_rate: 1KiB when absent, 0 turns it off, a size otherwise.
func TestBodyMinRate(t *testing.T) {
	for _, tc := range []struct {
		line string
		want config.Size
	}{
		{"", config.DefaultBodyMinRate},
		{"    body_min_rate: 0\n", 0},
		{"    body_min_rate: 64KiB\n", 64 << 10},
	} {
		src := strings.Replace(base, "  - address: 127.0.0.1:8080\n", "  - address: 127.0.0.1:8080\n"+tc.line, 1)
		c, err := config.Parse([]byte(src))
		if err != nil {
			t.Fatalf("%q: %v", tc.line, err)
		}
		if got := c.Listeners[0].MinBodyRate(); got != tc.want {
			t.Errorf("%q: body_min_rate %v, want %v", tc.line, got, tc.want)
		}
	}
	src := strings.Replace(base, "  - address: 127.0.0.1:8080\n", "  - address: 127.0.0.1:8080\n    body_min_rate: fast\n", 1)
	if _, err := config.Parse([]byte(src)); err == nil || !strings.Contains(err.Error(), "line 3: listeners[0].body_min_rate") {
		t.Errorf("body_min_rate: fast: %v, want an error naming the key and its line", err)
	}
}
