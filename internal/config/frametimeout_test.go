package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/config"
)

func TestAgentFrameTimeout(t *testing.T) {
	c, err := config.Parse([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	if f := c.Agents[0].Timeouts.Frame; f != 5*time.Second {
		t.Errorf("default frame timeout %v, want 5s", f)
	}
	set := strings.Replace(base, "    address: /run/waf.sock\n", "    address: /run/waf.sock\n    timeouts:\n      frame: 300ms\n", 1)
	if c, err = config.Parse([]byte(set)); err != nil {
		t.Fatal(err)
	}
	if f := c.Agents[0].Timeouts.Frame; f != 300*time.Millisecond {
		t.Errorf("frame timeout %v, want 300ms", f)
	}
	for _, bad := range []string{"2m", "-1s"} {
		_, err := config.Parse([]byte(strings.Replace(set, "300ms", bad, 1)))
		if err == nil || !strings.Contains(err.Error(), "timeouts.frame") {
			t.Errorf("frame %s: err = %v, want one naming timeouts.frame", bad, err)
		}
	}
}
