package edgetest

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// scriptedUpstream is a raw-socket upstream whose answers a test writes by
// hand: answer gets the connection, the raw request and its target, and
// reports whether the connection goes on. Requests are read with
// readRequest (upstream_test.go).
type scriptedUpstream struct {
	ln   net.Listener
	addr string
	wg   sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]bool
	total int
}

func startScripted(t *testing.T, answer func(c net.Conn, raw, target string) bool) *scriptedUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &scriptedUpstream{ln: ln, addr: ln.Addr().String(), conns: map[net.Conn]bool{}}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.mu.Lock()
			u.conns[c] = true
			u.total++
			u.mu.Unlock()
			u.wg.Add(1)
			go func() {
				defer u.wg.Done()
				defer func() {
					u.mu.Lock()
					delete(u.conns, c)
					u.mu.Unlock()
					_ = c.Close()
				}()
				br := bufio.NewReaderSize(c, 64<<10)
				for {
					raw, target, err := readRequest(br)
					if err != nil || !answer(c, raw, target) {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		u.mu.Lock()
		for c := range u.conns {
			_ = c.Close()
		}
		u.mu.Unlock()
		u.wg.Wait()
	})
	return u
}

func (u *scriptedUpstream) accepted() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.total
}

// plainConfig is a sidecar in front of upstream, with the agents (YAML
// list items, already indented) on its one route and extra lines for the
// listener.
func plainConfig(upstream, listenerExtra, agents, routeAgents string) string {
	s := fmt.Sprintf(`listeners:
  - name: edge
    address: 127.0.0.1:0
%s
admin:
  address: 127.0.0.1:0
upstreams:
  - name: app
    address: %s
`, listenerExtra, upstream)
	if agents != "" {
		s += "agents:\n" + agents
	}
	s += "routes:\n  - name: default\n    upstream: app\n"
	if routeAgents != "" {
		s += "    agents: [" + routeAgents + "]\n"
	}
	return s
}

// waitReady waits for the sidecar's agents to be connected.
func waitReady(t *testing.T, sc *sidecar) {
	t.Helper()
	testutil.WaitFor(t, "agents connected", func() bool {
		resp, err := http.Get("http://" + sc.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

// rawExchange sends req on a fresh connection and returns everything the
// sidecar sent until it closed the connection or went quiet for quiet.
func rawExchange(t *testing.T, addr, req string, quiet time.Duration) (string, bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	buf := make([]byte, 32<<10)
	deadline := time.Now().Add(longWait)
	for time.Now().Before(deadline) {
		_ = c.SetReadDeadline(time.Now().Add(quiet))
		n, err := c.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return b.String(), false // still open, nothing more came
			}
			return b.String(), true
		}
	}
	t.Fatalf("the sidecar kept sending for %v", longWait)
	return "", false
}

func agentSocket(dir, name string) string { return filepath.Join(dir, name+".sock") }
