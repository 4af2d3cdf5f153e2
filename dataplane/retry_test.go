package dataplane_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/sdk"
)

// serveConns accepts connections on a loopback port until the test ends
// and hands each to handle in its own goroutine, closing it after.
func serveConns(t *testing.T, handle func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return ln.Addr().String()
}

// readRequestHead reads a request head from br and returns its request
// line.
func readRequestHead(br *bufio.Reader) (string, error) {
	first, err := br.ReadString('\n')
	if err != nil {
		return first, err
	}
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			return first, err
		}
		if l == "\r\n" {
			return first, nil
		}
	}
}

// headFirstUpstream answers a GET and keeps the connection; on a POST it
// acts as soon as it has read the head (it counts it) and then fails:
// it closes the connection without an answer and without reading the
// body, which resets the connection under the rest of a large body.
func headFirstUpstream(t *testing.T) (string, *atomic.Int64) {
	var posts atomic.Int64
	addr := serveConns(t, func(c net.Conn) {
		// A small receive buffer: the body cannot all fit in the
		// sockets' buffers.
		_ = c.(*net.TCPConn).SetReadBuffer(64 << 10)
		br := bufio.NewReader(c)
		for {
			first, err := readRequestHead(br)
			if err != nil {
				return
			}
			if strings.HasPrefix(first, "POST ") {
				posts.Add(1)
				return
			}
			fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	return addr, &posts
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

// lingeringUpstream answers GETs with keep-alive; a connection idle for
// 50ms is half-closed (FIN) and then read and discarded for 3s before it
// is closed, as Apache closes an expired keep-alive connection (lingering
// close). It counts the connections it accepted.
func lingeringUpstream(t *testing.T) (string, *atomic.Int32) {
	var conns atomic.Int32
	addr := serveConns(t, func(c net.Conn) {
		conns.Add(1)
		br := bufio.NewReader(c)
		for {
			_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			first, err := readRequestHead(br)
			if ne, ok := err.(net.Error); ok && ne.Timeout() && first == "" {
				_ = c.(*net.TCPConn).CloseWrite()
				_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
				_, _ = io.Copy(io.Discard, c)
				return
			}
			if err != nil {
				return
			}
			_ = c.SetReadDeadline(time.Time{})
			fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	return addr, &conns
}

// TestHalfClosedKeepAliveIsReplayed: a GET on a pooled connection that
// the upstream half-closed while it sat idle, and on which it keeps
// reading without answering, fails at once and is replayed on a new
// connection; it does not wait for the response timeout (a 504).
func TestHalfClosedKeepAliveIsReplayed(t *testing.T) {
	addr, conns := lingeringUpstream(t)
	cfg := configText(t, oneAgentConfig, map[string]any{"Upstream": addr, "Chain": "", "UpstreamTimeout": "2s"})
	p := startProxy(t, cfg, nil, nil)
	for i := range 2 {
		resp, body := p.do(t, "GET", "/", nil)
		if resp.StatusCode != 200 || string(body) != "ok" {
			t.Fatalf("request %d: %d %q; want 200 from a fresh connection", i, resp.StatusCode, body)
		}
		if i == 0 {
			// Long enough for the upstream to half-close the idle
			// connection and for its FIN to arrive.
			time.Sleep(300 * time.Millisecond)
		}
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d upstream connections; want 2 (the half-closed one replaced)", n)
	}
}
