package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/supervisor"
)

// unit is a parsed systemd unit file: section → key → values (a key may
// repeat).
type unit map[string]map[string][]string

func parseUnit(t *testing.T, path string) unit {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u := unit{}
	sec := ""
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[' && strings.HasSuffix(line, "]"):
			sec = line[1 : len(line)-1]
			u[sec] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || sec == "" {
				t.Fatalf("%s:%d: not a key=value in a section: %q", path, i+1, line)
			}
			u[sec][k] = append(u[sec][k], v)
		}
	}
	return u
}

func (u unit) one(sec, key string) (string, bool) {
	v, ok := u[sec][key]
	if !ok {
		return "", false
	}
	return v[len(v)-1], true
}

// TestSystemdUnits keeps deploy/systemd hardened and consistent: a
// notify service (the sidecar sends READY=1) with its own user, no
// privileges and a read-only system, a stop timeout longer than its
// drain, and a socket unit that names the listener it serves. When
// systemd-analyze is installed, it verifies both units.
func TestSystemdUnits(t *testing.T) {
	svc := parseUnit(t, "systemd/sidecar.service")
	sock := parseUnit(t, "systemd/sidecar.socket")
	for key, want := range map[string]string{
		"Type": "notify", "NotifyAccess": "main", "DynamicUser": "yes", "NoNewPrivileges": "yes",
		"ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes", "CapabilityBoundingSet": "",
		"AmbientCapabilities": "", "RestrictSUIDSGID": "yes", "KillSignal": "SIGTERM",
		"ExecReload": "/bin/kill -HUP $MAINPID", "RuntimeDirectory": "sidecar",
	} {
		if got, ok := svc.one("Service", key); !ok || got != want {
			t.Errorf("sidecar.service: %s=%q, want %q", key, got, want)
		}
	}
	if v, _ := svc.one("Service", "LimitNOFILE"); v == "" {
		t.Error("sidecar.service: no LimitNOFILE")
	}
	start, _ := svc.one("Service", "ExecStart")
	args := strings.Fields(start)
	drain := supervisor.DefaultDrain
	for i, a := range args {
		if a == "-drain" && i+1 < len(args) {
			d, err := time.ParseDuration(args[i+1])
			if err != nil {
				t.Fatalf("ExecStart -drain: %v", err)
			}
			drain = d
		}
	}
	stop, _ := svc.one("Service", "TimeoutStopSec")
	if d, err := time.ParseDuration(stop); err != nil || d <= drain {
		t.Errorf("TimeoutStopSec=%s: want longer than the drain (%v)", stop, drain)
	}
	if req, _ := svc.one("Unit", "Requires"); req != "sidecar.socket" {
		t.Errorf("sidecar.service: Requires=%q, want sidecar.socket", req)
	}
	if name, _ := sock.one("Socket", "FileDescriptorName"); name == "" {
		t.Error("sidecar.socket: no FileDescriptorName (the listener's name)")
	}
	if s, _ := sock.one("Socket", "Service"); s != "sidecar.service" {
		t.Errorf("sidecar.socket: Service=%q", s)
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze not installed: units not verified")
		return
	}
	// systemd-analyze checks that the commands exist: point them at
	// executables of this machine.
	dir := t.TempDir()
	for _, name := range []string{"sidecar.service", "sidecar.socket"} {
		b, err := os.ReadFile(filepath.Join("systemd", name))
		if err != nil {
			t.Fatal(err)
		}
		s := strings.ReplaceAll(string(b), "/usr/local/bin/sidecar", "/bin/true")
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(analyze, "verify", "--man=no", filepath.Join(dir, "sidecar.service"), filepath.Join(dir, "sidecar.socket")).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}
