package httpauth_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/conformance"
	"github.com/zentinelproxy/sidecar/internal/httpauth"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/yield"
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

// gatedService serves h on a socket with a backlog of 1 behind a gate
// (open), without keep-alive: every subrequest dials. Once it stops
// accepting and two connections wait, the kernel answers no more SYNs
// (stopAccepting).
func gatedService(t *testing.T, h http.Handler) *gatedListener {
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
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	hs.SetKeepAlivesEnabled(false)
	go func() { _ = hs.Serve(gl) }()
	t.Cleanup(func() { gl.setOpen(true); _ = hs.Close() })
	return gl
}

// stopAccepting closes gl's gate and fills its accept queue, so that a
// connection attempt is never answered; the test is skipped where the
// kernel still completes connections to a full queue.
func stopAccepting(t *testing.T, gl *gatedListener) {
	gl.setOpen(false)
	addr := gl.Addr().String()
	for range 4 {
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			t.Cleanup(func() { _ = c.Close() })
		}
	}
	if c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond); err == nil {
		c.Close()
		t.Skip("the kernel still completes connections to a full accept queue")
	}
}

// TestAddressesConnectTimeout: a member that stops accepting connections
// (its accept queue full, so that a connection attempt is never answered)
// costs a request its timeouts.connect + handshake, not the request: the
// subrequest goes to the other member within timeouts.message, where a
// subrequest that runs out of timeouts.message is the failure policy.
func TestAddressesConnectTimeout(t *testing.T) {
	s1 := &authService{}
	gl := gatedService(t, s1)
	inner := gl.Listener

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
	stopAccepting(t, gl)
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

// TestPipelinedConnectTimeout: a pipelined batch whose connection is not
// accepted within the connect timeout, while its subrequests have time,
// fails each of them as a failure to connect (which addresses fail over,
// agentmux.Retryable), as a lone subrequest does (TestAddressesConnectTimeout),
// not as their timeout.
func TestPipelinedConnectTimeout(t *testing.T) {
	gl := gatedService(t, &authService{})
	cfg := httpauth.DefaultConfig("auth", "http://"+gl.Addr().String()+"/auth")
	cfg.DialTimeout = 100 * time.Millisecond
	cfg.Pipeline = 8
	c, err := httpauth.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	stopAccepting(t, gl)
	// The first leader waits in its yield until the second subrequest
	// has joined its batch (at most 5 s).
	var first atomic.Bool
	first.Store(true)
	yield.SetHook(func(owner any) bool {
		size, ok := httpauth.LeaderBatch(owner)
		if !ok {
			return false
		}
		if first.Swap(false) {
			for end := time.Now().Add(5 * time.Second); size() < 2 && time.Now().Before(end); time.Sleep(time.Millisecond) {
			}
		}
		return true
	})
	t.Cleanup(func() { yield.SetHook(nil) })
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Go(func() {
			m := conformance.TypicalRequestHeaders()
			w := agentmux.Wait{Deadline: time.Now().Add(5 * time.Second)}
			ex, err := c.Begin(w)
			if err == nil {
				_, err = ex.RequestHeaders(w, m)
				ex.Finish()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if n := c.Counts()["pipelined"]; n != 2 {
		t.Fatalf("pipelined = %d, want 2", n)
	}
	for i, err := range errs {
		if !agentmux.Retryable(err) {
			t.Errorf("subrequest %d: %v, want a failure to connect (agentmux.Retryable)", i, err)
		}
	}
}
