package config_test

import (
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// TestExtProcTransport: ext_proc is a known transport whose address is a
// host:port (or unix:/path) like grpc's.
func TestExtProcTransport(t *testing.T) {
	for _, tc := range []struct {
		addr, want string
	}{
		{"127.0.0.1:9001", ""},
		{"unix:/run/proc.sock", ""},
		{"proc.internal", "host:port"},
		{"127.0.0.1:0", "invalid port"},
	} {
		y := strings.Replace(strings.Replace(base, "transport: uds", "transport: ext_proc", 1), "/run/waf.sock", tc.addr, 1)
		c, err := config.Parse([]byte(y))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.addr, err)
		case tc.want == "" && c.Agents[0].Transport != config.TransportExtProc:
			t.Errorf("%s: transport %q", tc.addr, c.Agents[0].Transport)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want %q", tc.addr, err, tc.want)
		}
	}
}
