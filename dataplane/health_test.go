package dataplane_test

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// rawHealth is an endpoint whose /health answer is the bytes of answer;
// it records the Host of every check.
type rawHealth struct {
	addr  string
	mu    sync.Mutex
	hosts []string
}

func newRawHealth(t *testing.T, answer string) *rawHealth {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	h := &rawHealth{addr: ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					host := ""
					for {
						l, err := br.ReadString('\n')
						if err != nil {
							return
						}
						if l == "\r\n" {
							break
						}
						if k, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(k, "host") {
							host = strings.TrimSpace(v)
						}
					}
					h.mu.Lock()
					h.hosts = append(h.hosts, host)
					h.mu.Unlock()
					if _, err := c.Write([]byte(answer)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return h
}

func (h *rawHealth) seen() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.hosts...)
}

const healthConfig = `
listeners:
  - name: test
    address: 127.0.0.1:0
upstreams:
  - name: app
    endpoints: [{{.Endpoints}}]
    health_check:
      path: /health
      interval: 1s
      timeout: 1s
      healthy_threshold: 1
      unhealthy_threshold: 2
routes:
  - name: main
    upstream: app
`

// TestHealthCheckHostileAnswers: a check answered with garbage, or with
// a body larger than a health check needs (read in full before), fails;
// a small answer passes. Every check carries the upstream's Host.
func TestHealthCheckHostileAnswers(t *testing.T) {
	good := newRawHealth(t, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	garbage := newRawHealth(t, "SSH-2.0-OpenSSH_9.6\r\n\r\n")
	big := newRawHealth(t, fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", 2<<20, strings.Repeat("x", 2<<20)))
	cfg := configText(t, healthConfig, map[string]any{"Endpoints": good.addr + ", " + garbage.addr + ", " + big.addr})
	p := startProxy(t, cfg, nil, nil)
	for _, ep := range []*rawHealth{garbage, big} {
		testutil.WaitFor(t, "endpoint "+ep.addr+" checked out", func() bool {
			st, _ := endpointState(p.srv, ep.addr)
			return st.ChecksFailed >= 2 || (st.Checks >= 4 && st.Healthy)
		})
		if st, _ := endpointState(p.srv, ep.addr); st.Healthy {
			t.Errorf("endpoint %s healthy after %d checks (%d failed)", ep.addr, st.Checks, st.ChecksFailed)
		}
	}
	testutil.WaitFor(t, "the good endpoint checked", func() bool {
		st, _ := endpointState(p.srv, good.addr)
		return st.Checks >= 2
	})
	if st, _ := endpointState(p.srv, good.addr); !st.Healthy || st.ChecksFailed != 0 {
		t.Errorf("good endpoint %+v", st)
	}
	for _, ep := range []*rawHealth{good, garbage, big} {
		for _, h := range ep.seen() {
			if h != good.addr {
				t.Fatalf("check to %s carried Host %q, want %q", ep.addr, h, good.addr)
			}
		}
	}
}
