package supervisor

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	st "github.com/zentinelproxy/sidecar/internal/supervisor/supervisortest"
	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// rawClient is one keep-alive HTTP/1.1 connection.
type rawClient struct {
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, network, addr string) *rawClient {
	t.Helper()
	c, err := net.Dial(network, addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &rawClient{c: c, br: bufio.NewReader(c)}
}

// get sends a GET on the connection and returns the answer's body.
func (r *rawClient) get(path string) (string, error) {
	_ = r.c.SetDeadline(time.Now().Add(st.LongWait))
	if _, err := fmt.Fprintf(r.c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(r.br, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("status %d", resp.StatusCode)
	}
	return string(b), err
}

// reloadUnderConnects reloads after write while a client connects to
// addr again and again, one request per connection, and fails the test
// if any connection is refused or any request fails.
func reloadUnderConnects(t *testing.T, s *Supervisor, network, addr string, write func()) {
	t.Helper()
	var refused, served atomic.Int64
	var last atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			c, err := net.Dial(network, addr)
			if err != nil {
				refused.Add(1)
				last.Store(err.Error())
				continue
			}
			rc := &rawClient{c: c, br: bufio.NewReader(c)}
			if _, err := rc.get("/"); err != nil {
				refused.Add(1)
				last.Store(err.Error())
			} else {
				served.Add(1)
			}
			c.Close()
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	testutil.WaitFor(t, "requests before the reload", func() bool { return served.Load() > 10 })
	write()
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	n := served.Load()
	testutil.WaitFor(t, "requests after the reload", func() bool { return served.Load() > n+10 })
	close(stop)
	wg.Wait()
	if refused.Load() != 0 {
		t.Errorf("%d connections to %s refused or failed across the reload (%d served; last: %v)", refused.Load(), addr, served.Load(), last.Load())
	}
}

// TestReloadListenerTCPHandover: a TCP listener whose settings change,
// then whose name changes, at the same address, hands its socket over
// each time: a client connecting throughout is never refused.
func TestReloadListenerTCPHandover(t *testing.T) {
	dir := testutil.SocketDir(t)
	up := st.StartUpstream(t, "app")
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	probe.Close() // the sidecar binds it next
	conf := func(name, extra string) string {
		return fmt.Sprintf("listeners: [{name: %s, address: %q%s}]\nupstreams: [{name: app, address: %q}]\nroutes: [{name: main, upstream: app}]\nadmin: {enabled: false}\n",
			name, addr, extra, up.Addr)
	}
	path := filepath.Join(dir, "sidecar.yaml")
	st.WriteConfig(t, path, conf("web", ""))
	s := startInProcess(t, path)
	reloadUnderConnects(t, s, "tcp", addr, func() { st.WriteConfig(t, path, conf("web", ", idle_timeout: 9s")) })
	reloadUnderConnects(t, s, "tcp", addr, func() { st.WriteConfig(t, path, conf("www", ", idle_timeout: 9s")) })
	if got := s.Addrs(); len(got) != 1 || got[0].String() != addr {
		t.Errorf("addresses %v, want [%s]", got, addr)
	}
}

// TestReloadListeners: a reload adds and removes data listeners without
// a restart, and a keep-alive connection on a listener it leaves alone
// goes on being served on the same connection; a listener whose settings
// change at the same address takes over its socket (no connection
// refused meanwhile); a listener that cannot bind fails the reload,
// which then changes nothing.
func TestReloadListeners(t *testing.T) {
	dir := testutil.SocketDir(t)
	up := st.StartUpstream(t, "app")
	sock := func(n string) string { return filepath.Join(dir, n+".sock") }
	conf := func(ls ...string) string {
		return fmt.Sprintf("listeners:\n%s\nupstreams: [{name: app, address: %q}]\nroutes: [{name: main, upstream: app}]\nadmin: {enabled: false}\n",
			strings.Join(ls, "\n"), up.Addr)
	}
	lst := func(name, extra string) string {
		return fmt.Sprintf("  - {name: %s, address: \"unix:%s\"%s}", name, sock(name), extra)
	}
	path := filepath.Join(dir, "sidecar.yaml")
	st.WriteConfig(t, path, conf(lst("a", ""), lst("b", "")))
	s := startInProcess(t, path)

	a := dialRaw(t, "unix", sock("a"))
	if body, err := a.get("/1"); err != nil || body != "app\n" {
		t.Fatalf("a before the reload: %q %v", body, err)
	}
	b := dialRaw(t, "unix", sock("b"))
	if _, err := b.get("/1"); err != nil {
		t.Fatal(err)
	}

	// b goes, c comes; a stays as it is.
	st.WriteConfig(t, path, conf(lst("a", ""), lst("c", "")))
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if body, err := a.get("/2"); err != nil || body != "app\n" {
		t.Fatalf("a's keep-alive connection after the reload: %q %v", body, err)
	}
	if body, err := dialRaw(t, "unix", sock("c")).get("/"); err != nil || body != "app\n" {
		t.Fatalf("the added listener: %q %v", body, err)
	}
	if c, err := net.Dial("unix", sock("b")); err == nil {
		c.Close()
		t.Fatal("the removed listener still accepts")
	}
	// b's open connection is closed once idle, not cut mid-request.
	if _, err := b.get("/3"); err == nil {
		t.Error("the removed listener's idle connection still served")
	}
	if got := len(s.Addrs()); got != 2 {
		t.Errorf("%d listener addresses, want 2", got)
	}

	// a's settings change at its address: a new listener takes over the
	// socket. New connections to a are not refused while it does.
	reloadUnderConnects(t, s, "unix", sock("a"), func() {
		st.WriteConfig(t, path, conf(lst("a", ", read_timeout: 7s"), lst("c", "")))
	})
	if _, err := os.Lstat(sock("a")); err != nil {
		t.Errorf("a's socket: %v", err)
	}

	// A listener that cannot bind (its port is taken) fails the reload;
	// nothing changes.
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	st.WriteConfig(t, path, conf(lst("a", ", read_timeout: 7s"), lst("c", ""), "  - {name: d, address: \""+taken.Addr().String()+"\"}"))
	if err := s.Reload(); err == nil || !strings.Contains(err.Error(), "listener d") {
		t.Fatalf("reload with an unbindable listener: %v", err)
	}
	if body, err := dialRaw(t, "unix", sock("c")).get("/"); err != nil || body != "app\n" {
		t.Fatalf("c after a failed reload: %q %v", body, err)
	}
	if got := len(s.Addrs()); got != 2 {
		t.Errorf("%d listener addresses after a failed reload, want 2", got)
	}
}
