package dataplane_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/sdk"
)

// headFirstUpstream answers a GET and keeps the connection; on a POST it
// acts as soon as it has read the head (it counts it) and then fails:
// it closes the connection without an answer and without reading the
// body, which resets the connection under the rest of a large body.
func headFirstUpstream(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var posts atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			// A small receive buffer: the body cannot all fit in the
			// sockets' buffers.
			_ = c.(*net.TCPConn).SetReadBuffer(64 << 10)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					first, err := br.ReadString('\n')
					if err != nil {
						return
					}
					for {
						l, err := br.ReadString('\n')
						if err != nil {
							return
						}
						if l == "\r\n" {
							break
						}
					}
					if strings.HasPrefix(first, "POST ") {
						posts.Add(1)
						return
					}
					fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
			}()
		}
	}()
	return ln.Addr().String(), &posts
}

// TestPostNotReplayedAfterPartialSend: a POST whose body (buffered for
// an agent) breaks off mid-send on a reused connection is not sent
// again: part of it went out, so the upstream may have acted on it.
func TestPostNotReplayedAfterPartialSend(t *testing.T) {
	addr, posts := headFirstUpstream(t)
	path := serveAgent(t, &agentFuncs{Base: sdk.Base{Caps: bodyCaps(false)}})
	cfg := configText(t, oneAgentConfig, map[string]any{
		"Upstream": addr, "Chain": "a",
		"Agents": map[string]agentSpec{"a": {Path: path, ReqMode: "buffered", RespMode: "none", Limit: "32MiB", Message: "60s", Request: "60s"}},
	})
	a := udsAgent(t, "a", path, func(c *udsclient.Config) { c.MessageTimeout = hangGuard })
	p := startProxy(t, cfg, map[string]agentmux.Agent{"a": a}, nil)
	// A pooled connection for the POST to reuse.
	if resp, body := p.do(t, "GET", "/", nil); resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("GET: %d %q", resp.StatusCode, body)
	}
	if resp, _ := p.do(t, "POST", "/order", bytes.NewReader(bytes.Repeat([]byte("x"), 8<<20))); resp.StatusCode != 502 {
		t.Errorf("POST: status %d, want 502", resp.StatusCode)
	}
	if n := posts.Load(); n != 1 {
		t.Fatalf("the upstream read the POST %d times, want once", n)
	}
}
