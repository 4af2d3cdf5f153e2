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

// TestFailureStatus: a fail-closed failure answers failure_status, by
// default 500 for an ext_proc agent (Envoy's status_on_error default)
// and 503 for the others; a status outside 400..599 is refused at its
// line.
func TestFailureStatus(t *testing.T) {
	extproc := strings.Replace(strings.Replace(base, "transport: uds", "transport: ext_proc", 1), "/run/waf.sock", "127.0.0.1:9001", 1)
	withStatus := func(y, s string) string {
		return strings.Replace(y, "    transport:", "    failure_status: "+s+"\n    transport:", 1)
	}
	for _, tc := range []struct {
		name, yaml string
		want       int
		err        string
	}{
		{"ext_proc default", extproc, 500, ""},
		{"uds default", base, 503, ""},
		{"ext_proc configured", withStatus(extproc, "503"), 503, ""},
		{"uds configured", withStatus(base, "502"), 502, ""},
		{"a success", withStatus(extproc, "200"), 0, "line 8: agents[0].failure_status: 200 is not in 400..599"},
		{"not a status", withStatus(base, "600"), 0, "agents[0].failure_status: 600 is not in 400..599"},
	} {
		c, err := config.Parse([]byte(tc.yaml))
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want %q", tc.name, err, tc.err)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.name, err)
		default:
			if got := c.Policy(&c.Routes[0].Agents[0]).FailureStatus; got != tc.want {
				t.Errorf("%s: failure status %d, want %d", tc.name, got, tc.want)
			}
		}
	}
}
