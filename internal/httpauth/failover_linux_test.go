package httpauth_test

import (
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// gatedListener accepts only while its gate is open.
type gatedListener struct {
	net.Listener
	mu   sync.Mutex
	open bool
}

func (l *gatedListener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		open := l.open
		l.mu.Unlock()
		if open {
			return l.Listener.Accept()
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (l *gatedListener) setOpen(v bool) {
	l.mu.Lock()
	l.open = v
	l.mu.Unlock()
}

// TestAddressesConnectTimeout: a member that stops accepting connections
// (its accept queue full, so that a connection attempt is never answered)
// costs a request its timeouts.connect + handshake, not the request: the
// subrequest goes to the other member within timeouts.message, where a
// subrequest that runs out of timeouts.message is the failure policy.
func TestAddressesConnectTimeout(t *testing.T) {
	// A socket with a backlog of 1: once it stops accepting and two
	// connections wait, the kernel answers no more SYNs.
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 1); err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "backlog1")
	inner, err := net.FileListener(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	gl := &gatedListener{Listener: inner, open: true}
	s1 := &authService{}
	hs := &http.Server{Handler: s1, ReadHeaderTimeout: 5 * time.Second}
	hs.SetKeepAlivesEnabled(false) // every subrequest dials
	go func() { _ = hs.Serve(gl) }()
	t.Cleanup(func() { gl.setOpen(true); _ = hs.Close() })

	s2, u2 := startService(t)
	url, _, a := proxy(t, "http://"+inner.Addr().String()+"/auth", `
    addresses: [`+u2+`]
    timeouts:
      connect: 100ms
      handshake: 100ms
      message: 3s`, false)
	testutil.WaitFor(t, "both members ready", func() bool {
		ms := a.(*agentmux.Multi).Members()
		return ms[0].Snapshot().Ready && ms[1].Snapshot().Ready
	})
	for range 2 {
		if resp, _ := get(t, url+"/ok"); resp.StatusCode != 200 {
			t.Fatalf("status %d with both members up", resp.StatusCode)
		}
	}
	if s1.count() == 0 {
		t.Fatal("the first member got no subrequest while it accepted")
	}
	gl.setOpen(false)
	var fill []net.Conn
	for range 4 {
		if c, err := net.DialTimeout("tcp", inner.Addr().String(), 200*time.Millisecond); err == nil {
			fill = append(fill, c)
		}
	}
	defer func() {
		for _, c := range fill {
			c.Close()
		}
	}()
	if c, err := net.DialTimeout("tcp", inner.Addr().String(), 300*time.Millisecond); err == nil {
		c.Close()
		t.Skip("the kernel still completes connections to a full accept queue")
	}
	before := s2.count()
	for i := range 4 {
		if resp, body := get(t, url+"/ok"); resp.StatusCode != 200 {
			t.Fatalf("request %d with the first member not accepting: status %d %q", i, resp.StatusCode, body)
		}
	}
	if got := s2.count() - before; got != 4 {
		t.Errorf("the second member answered %d of the 4 requests", got)
	}
}
