package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	stest "github.com/zentinelproxy/sidecar/internal/supervisor/supervisortest"
	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// accessLines decodes the JSON lines of an access log file ("" when it
// does not exist).
func accessLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("%s: line %q: %v", path, sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

func getOK(t *testing.T, url string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d", url, resp.StatusCode)
	}
}

// TestSIGUSR1ReopensAccessLog: logrotate renames the file and sends
// SIGUSR1; the lines of the requests before the signal are in the
// renamed file or the new one, those after it in a new file at the
// path, none lost, each with the configured fields only. The start
// logs the configuration's warnings with their keys.
func TestSIGUSR1ReopensAccessLog(t *testing.T) {
	dir := testutil.SocketDir(t)
	up := stest.StartUpstream(t, "app")
	logPath := filepath.Join(dir, "access.log")
	notSocket := filepath.Join(dir, "idle.sock")
	if err := os.WriteFile(notSocket, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "sidecar.yaml")
	stest.WriteConfig(t, path, fmt.Sprintf(`listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q}]
agents: [{name: idle, transport: uds, address: %q}]
routes: [{name: main, upstream: app}]
admin: {address: "127.0.0.1:0"}
access_log:
  enabled: true
  output: %s
  fields: [status, req, route, path]
`, up.Addr, notSocket, logPath))
	p := startProc(t, path)
	for _, w := range []string{`"key":"agents[0].name","line":3`, `agent \"idle\" is on no route`, `"key":"agents[0].address"`, "exists and is not a socket"} {
		if !strings.Contains(p.log(), w) {
			t.Errorf("the start log lacks %q:\n%s", w, p.log())
		}
	}

	const before, between, after = 20, 20, 20
	for i := range before {
		getOK(t, fmt.Sprintf("%s/before/%d", p.data, i))
	}
	rotated := logPath + ".1"
	if err := os.Rename(logPath, rotated); err != nil {
		t.Fatal(err)
	}
	for i := range between {
		getOK(t, fmt.Sprintf("%s/between/%d", p.data, i))
	}
	p.signal(syscall.SIGUSR1)
	testutil.WaitFor(t, "reopen logged", func() bool { return strings.Contains(p.log(), "SIGUSR1: access log reopened") })
	for i := range after {
		getOK(t, fmt.Sprintf("%s/after/%d", p.data, i))
	}
	p.signal(syscall.SIGTERM)
	if err := p.wait(); err != nil {
		t.Fatalf("exit: %v\n%s", err, p.log())
	}

	old, cur := accessLines(t, rotated), accessLines(t, logPath)
	if cur == nil {
		t.Fatal("no new file at the path after SIGUSR1")
	}
	paths := map[string]string{}
	for name, lines := range map[string][]map[string]any{"rotated": old, "new": cur} {
		for _, l := range lines {
			var keys []string
			for k := range l {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			if want := []string{"level", "message", "path", "req", "route", "status"}; !slices.Equal(keys, want) {
				t.Errorf("%s file: line with fields %v, want %v", name, keys, want)
			}
			p, _ := l["path"].(string)
			if prev, dup := paths[p]; dup {
				t.Errorf("%s logged twice (%s and %s)", p, prev, name)
			}
			paths[p] = name
		}
	}
	if len(paths) != before+between+after {
		t.Errorf("%d distinct requests logged, want %d (rotated %d, new %d lines)", len(paths), before+between+after, len(old), len(cur))
	}
	for i := range after {
		if f := paths[fmt.Sprintf("/after/%d", i)]; f != "new" {
			t.Errorf("/after/%d is in the %q file, want the new one", i, f)
		}
	}
	for i := range before {
		if f := paths[fmt.Sprintf("/before/%d", i)]; f != "rotated" {
			t.Errorf("/before/%d is in the %q file, want the rotated one", i, f)
		}
	}
}

// TestSecondSIGTERMForced: a second SIGTERM during the drain ends it and
// says so; the exit status is 1.
func TestSecondSIGTERMForced(t *testing.T) {
	up := stest.StartUpstream(t, "app")
	path := filepath.Join(testutil.SocketDir(t), "sidecar.yaml")
	stest.WriteConfig(t, path, fmt.Sprintf(`listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q}]
routes: [{upstream: app}]
admin: {address: "127.0.0.1:0"}
`, up.Addr))
	p := startProc(t, path, "-drain", "60s")
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.Get(p.data + "/slow/x?ms=30000"); err == nil {
			resp.Body.Close()
		}
	}()
	testutil.WaitFor(t, "a request in flight", func() bool { return up.InFlight.Load() == 1 })
	p.signal(syscall.SIGTERM)
	testutil.WaitFor(t, "the drain started", func() bool { return strings.Contains(p.log(), `"message":"shutting down"`) })
	p.signal(syscall.SIGTERM)
	err := p.wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit %v, want status 1\n%s", err, p.log())
	}
	want := "sidecar: shutdown forced by a second signal: requests still running were cut off"
	if !slices.Contains(p.Lines(), want) || strings.Contains(p.log(), "context canceled") {
		t.Errorf("the output lacks %q (or says context canceled):\n%s", want, p.log())
	}
	<-done
}
