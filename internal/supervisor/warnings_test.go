package supervisor

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/config"
	st "github.com/zentinelproxy/sidecar/internal/supervisor/supervisortest"
	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// fakeRoot writes files under a temporary root, path → content.
func fakeRoot(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, c := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestMemoryLimit: the lowest limit of the cgroup and its ancestors,
// v2 or v1; "max" and v1's huge value are no limit.
func TestMemoryLimit(t *testing.T) {
	for _, c := range []struct {
		name  string
		files map[string]string
		limit int64
		file  string
	}{
		{"v2 container", map[string]string{
			"proc/self/cgroup":         "0::/\n",
			"sys/fs/cgroup/memory.max": "268435456\n",
		}, 256 << 20, "/sys/fs/cgroup/memory.max"},
		{"v2 service under a tighter slice", map[string]string{
			"proc/self/cgroup": "0::/system.slice/sidecar.service\n",
			"sys/fs/cgroup/system.slice/sidecar.service/memory.max": "max\n",
			"sys/fs/cgroup/system.slice/memory.max":                 "1073741824\n",
		}, 1 << 30, "/sys/fs/cgroup/system.slice/memory.max"},
		{"v2 host path not mounted in the container", map[string]string{
			"proc/self/cgroup":         "0::/kubepods/pod1/abc\n",
			"sys/fs/cgroup/memory.max": "536870912\n",
		}, 512 << 20, "/sys/fs/cgroup/memory.max"},
		{"v2 no limit", map[string]string{
			"proc/self/cgroup":         "0::/\n",
			"sys/fs/cgroup/memory.max": "max\n",
		}, 0, ""},
		{"v1", map[string]string{
			"proc/self/cgroup": "4:memory:/docker/abc\n0::/\n",
			"sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "134217728\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes":            "9223372036854771712\n",
		}, 128 << 20, "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes"},
		{"v1 unlimited", map[string]string{
			"proc/self/cgroup":                           "11:cpuacct,memory:/\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
		}, 0, ""},
		{"no cgroup file", map[string]string{}, 0, ""},
	} {
		limit, file, ok := memoryLimit(fakeRoot(t, c.files))
		if limit != c.limit || file != c.file || ok != (c.limit > 0) {
			t.Errorf("%s: %d %q %v, want %d %q", c.name, limit, file, ok, c.limit, c.file)
		}
	}
}

// TestWarningsMemory: a worst case above the cgroup's limit is a warning
// at the key that bounds it, with the numbers; below, none.
func TestWarningsMemory(t *testing.T) {
	cfg, err := config.Parse([]byte(`listeners: [{address: "127.0.0.1:8080"}]
upstreams: [{name: app, address: "127.0.0.1:9000"}]
agents:
  - name: waf
    transport: uds
    address: /run/sidecar/waf.sock
    max_in_flight: 64
    max_queue: 64
    request_body: {mode: buffered, limit: 1MiB}
    response_body: {mode: none}
routes: [{upstream: app, agents: [waf]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	// 128 requests × 1 MiB + 4 MiB of send queue = 132 MiB.
	small := fakeRoot(t, map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "104857600\n"})
	w := warnings(cfg, small)
	if len(w) != 1 {
		t.Fatalf("warnings %v", w)
	}
	want := "config: line 7: agents[0].max_in_flight: in the worst case bodies and agent queues hold 132 MiB (128 requests × 1 MiB of bodies, 4 MiB of agent send queues), above the memory limit of 100 MiB (/sys/fs/cgroup/memory.max)"
	if !strings.HasPrefix(w[0].String(), want) {
		t.Errorf("warning\n%s\nwant prefix\n%s", w[0], want)
	}
	big := fakeRoot(t, map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "268435456\n"})
	if w := warnings(cfg, big); len(w) != 0 {
		t.Errorf("warnings under a 256 MiB limit: %v", w)
	}
}

// TestReloadPassesOwnFiles: the start checks a reload runs accept the
// sockets and the access log file the running sidecar holds, and
// ReopenAccessLog opens the file again at its path.
func TestReloadPassesOwnFiles(t *testing.T) {
	dir := testutil.SocketDir(t)
	up := st.StartUpstream(t, "app")
	front := filepath.Join(dir, "front.sock")
	rev := filepath.Join(dir, "rev.sock")
	logPath := filepath.Join(dir, "access.log")
	path := filepath.Join(dir, "sidecar.yaml")
	st.WriteConfig(t, path, `
listeners: [{address: "unix:`+front+`"}]
upstreams: [{name: app, address: "`+up.Addr+`"}]
agents: [{name: r, transport: reverse, address: "unix:`+rev+`", failure_mode: open, options: {allow_no_token: "true"}}]
routes: [{upstream: app, agents: [r]}]
admin: {address: "127.0.0.1:0"}
access_log: {enabled: true, output: "`+logPath+`"}
`)
	o := options(t, path)
	o.AgentWait = shortAgentWait
	s := startWith(t, path, o)
	if err := s.Reload(); err != nil {
		t.Fatalf("reload of the running file: %v", err)
	}
	if err := os.Rename(logPath, logPath+".1"); err != nil {
		t.Fatal(err)
	}
	if err := s.ReopenAccessLog(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(logPath); err != nil {
		t.Errorf("no new access log file: %v", err)
	}
}

func TestReopenWithoutFile(t *testing.T) {
	path := filepath.Join(testutil.SocketDir(t), "sidecar.yaml")
	up := st.StartUpstream(t, "app")
	st.WriteConfig(t, path, `
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: "`+up.Addr+`"}]
routes: [{upstream: app}]
admin: {enabled: false}
access_log: {enabled: true, output: stderr}
`)
	s := startInProcess(t, path)
	if err := s.ReopenAccessLog(); !errors.Is(err, ErrNoAccessLogFile) {
		t.Errorf("reopen of stderr: %v", err)
	}
}
