package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	stest "github.com/zentinelproxy/sidecar/internal/supervisor/supervisortest"
	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// activatedConfig writes a configuration whose listener "web" is at addr
// (which the test holds, as a socket unit would), without an admin
// listener (its default address, 127.0.0.1:9901, is one for all the tests
// that run at the same time), and returns its path.
func activatedConfig(t *testing.T, addr string) string {
	t.Helper()
	up := stest.StartUpstream(t, "one")
	path := filepath.Join(testutil.SocketDir(t), "sidecar.yaml")
	stest.WriteConfig(t, path, fmt.Sprintf(`
listeners: [{name: web, address: %q}]
upstreams: [{name: app, address: %q}]
routes: [{name: main, upstream: app}]
admin: {enabled: false}
`, addr, up.Addr))
	return path
}

// startActivated runs the sidecar as a service manager would with a
// socket unit: the listening socket f as fd 3, LISTEN_FDS=1,
// LISTEN_FDNAMES=web and LISTEN_PID the sidecar's own pid (a shell sets
// it to its $$, then execs the sidecar, which keeps the pid).
func startActivated(t *testing.T, path string, f *os.File, env ...string) *proc {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", `LISTEN_PID=$$; export LISTEN_PID; exec "$0" "$@"`,
		testutil.BuildBinary(t, "./cmd/sidecar"), "run", "-config", path, "-drain", "10s")
	cmd.Env = append(os.Environ(), append([]string{"LISTEN_FDS=1", "LISTEN_FDNAMES=web"}, env...)...)
	cmd.ExtraFiles = []*os.File{f}
	sc := testutil.StartSidecar(t, cmd)
	return &proc{Sidecar: sc, t: t, data: "http://" + sc.Addr, exited: sc.Exited}
}

// TestSocketActivationRestart: the sidecar serves the listening socket
// it inherits (sd_listen_fds) instead of binding the address, and a
// restart — the first process told to stop, a second started on the
// same socket, as systemd restarts a service with a socket unit — under
// a client loop fails no request: connections that arrive meanwhile wait
// in the socket's backlog.
func TestSocketActivationRestart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	addr := ln.Addr().String()
	path := activatedConfig(t, addr)

	a := startActivated(t, path, f)
	if a.Addr != addr {
		t.Fatalf("serving %s, want the inherited %s", a.Addr, addr)
	}
	if !strings.Contains(a.log(), "listener socket inherited from the service manager") {
		t.Fatalf("no inherited socket in the log:\n%s", a.log())
	}

	stop := make(chan struct{})
	res := runLoad(4, []string{"http://" + addr + "/"}, stop)
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-res.done
	}()
	waitOK := func(n int, what string) {
		t.Helper()
		deadline := time.Now().Add(longWait)
		for {
			ok, errs, _ := res.snapshot()
			if len(errs) > 0 {
				t.Fatalf("%s: failed requests: %v", what, errs)
			}
			if ok >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d requests answered, want %d", what, ok, n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitOK(50, "first process")

	a.signal(syscall.SIGTERM)
	if err := a.wait(); err != nil {
		t.Fatalf("first process: %v\n%s", err, a.log())
	}
	before, _, _ := res.snapshot()
	b := startActivated(t, path, f)
	res.mark.Store(true)
	waitOK(before+50, "second process")
	close(stop)
	<-res.done

	ok, errs, statuses := res.snapshot()
	res.mu.Lock()
	refused, okAfter := res.refused, res.okAfter
	res.mu.Unlock()
	t.Logf("restart under load: %d answered (%d by the second process), statuses %v", ok, okAfter, statuses)
	if len(errs) > 0 || refused > 0 || len(statuses) != 1 || okAfter == 0 {
		t.Fatalf("restart: %d refused, errors %v, statuses %v, %d after the restart", refused, errs, statuses, okAfter)
	}
	b.signal(syscall.SIGTERM)
	if err := b.wait(); err != nil {
		t.Fatalf("second process: %v", err)
	}
}

// TestSocketActivationReloadReadds: a listener that took an inherited
// socket, removed by a reload and added back by the next, serves the
// inherited socket again (the service manager keeps it listening, so
// binding the address anew would fail).
func TestSocketActivationReloadReadds(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	addr := ln.Addr().String()
	path := activatedConfig(t, addr)
	withWeb, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p := startActivated(t, path, f)
	get := func() {
		t.Helper()
		c := &http.Client{Timeout: longWait, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Get("http://" + addr + "/")
		if err != nil {
			t.Fatalf("GET: %v\n%s", err, p.log())
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("GET: status %d", resp.StatusCode)
		}
	}
	reloaded := func(n int) {
		t.Helper()
		p.signal(syscall.SIGHUP)
		deadline := time.Now().Add(longWait)
		for strings.Count(p.log(), "configuration reloaded") < n {
			if strings.Contains(p.log(), "configuration reload failed") || time.Now().After(deadline) {
				t.Fatalf("reload %d:\n%s", n, p.log())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	get()
	other := strings.Replace(string(withWeb), "{name: web, address: \""+addr+"\"}", "{name: other, address: \"127.0.0.1:0\"}", 1)
	if other == string(withWeb) {
		t.Fatal("the configuration's listener was not replaced")
	}
	stest.WriteConfig(t, path, other)
	reloaded(1)
	stest.WriteConfig(t, path, string(withWeb))
	reloaded(2)
	get()
	if n := strings.Count(p.log(), "listener socket inherited from the service manager"); n != 2 {
		t.Errorf("the inherited socket was taken %d times, want 2\n%s", n, p.log())
	}
}

// TestNotifyReadyStopping: with NOTIFY_SOCKET set (Type=notify), the
// sidecar sends READY=1 once its listeners serve and STOPPING=1 when it
// starts shutting down.
func TestNotifyReadyStopping(t *testing.T) {
	sock := filepath.Join(testutil.SocketDir(t), "notify")
	nc, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cmd := exec.Command(testutil.BuildBinary(t, "./cmd/sidecar"), "run", "-config", oneRouteConfig(t))
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock)
	sc := testutil.StartSidecar(t, cmd) // returns once "sidecar serving" is logged
	p := &proc{Sidecar: sc, t: t, exited: sc.Exited}
	read := func() string {
		t.Helper()
		_ = nc.SetReadDeadline(time.Now().Add(longWait))
		buf := make([]byte, 4096)
		n, err := nc.Read(buf)
		if err != nil {
			t.Fatalf("no notification: %v\n%s", err, p.log())
		}
		return string(buf[:n])
	}
	if got := read(); got != "READY=1" {
		t.Fatalf("first notification %q, want READY=1", got)
	}
	p.signal(syscall.SIGTERM)
	if got := read(); got != "STOPPING=1" {
		t.Fatalf("notification at SIGTERM %q, want STOPPING=1", got)
	}
	if err := p.wait(); err != nil {
		t.Fatal(err)
	}
}
