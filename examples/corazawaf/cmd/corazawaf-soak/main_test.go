package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/examples/corazawaf"
)

// TestSoak runs the mix with a small MaxPending: the abandoned requests
// overflow it, and still nothing stays open after Close.
func TestSoak(t *testing.T) {
	cfg := corazawaf.DefaultConfig()
	cfg.MaxPending, cfg.LogRate = 8, 0
	var out bytes.Buffer
	if err := soak(&out, cfg, 200, 50, 2); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	// Header, 0, 50, 100, 150, 200, "after Close:", the last line.
	if len(lines) != 8 || !strings.HasPrefix(lines[6], "after Close") {
		t.Fatalf("output:\n%s", out.String())
	}
	last := strings.Fields(lines[7])
	// requests rss heap open pending blocked evicted
	if last[3] != "0" || last[4] != "0" || last[5] != "20" || last[6] == "0" {
		t.Errorf("after Close: %v (want 0 open, 0 pending, 20 blocked, some evicted)", last)
	}
}
