package edgetest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// tunnelUpstream answers every request with 101 Switching Protocols and
// hands the connection to the test.
type tunnelUpstream struct {
	ln    net.Listener
	addr  string
	conns chan net.Conn
}

func startTunnelUpstream(t *testing.T) *tunnelUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &tunnelUpstream{ln: ln, addr: ln.Addr().String(), conns: make(chan net.Conn, 256)}
	var mu sync.Mutex
	var all []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			all = append(all, c)
			mu.Unlock()
			go func() {
				_ = c.SetReadDeadline(time.Now().Add(longWait))
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						c.Close()
						return
					}
					if line == "\r\n" {
						break
					}
				}
				_ = c.SetReadDeadline(time.Time{})
				_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
				u.conns <- c
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range all {
			c.Close()
		}
	})
	return u
}

// openTunnel upgrades a fresh connection to addr through the tunnel
// route; the returned reader holds what followed the 101.
func openTunnel(addr, id string) (net.Conn, *bufio.Reader, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	_ = c.SetDeadline(time.Now().Add(longWait))
	if _, err := io.WriteString(c, get("/ws", "tunnel.example", id, "Connection: Upgrade", "Upgrade: websocket")); err != nil {
		c.Close()
		return nil, nil, err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: "GET"})
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		c.Close()
		return nil, nil, fmt.Errorf("upgrade: status %d", resp.StatusCode)
	}
	_ = c.SetDeadline(time.Time{})
	return readerConn{c, br}, br, nil
}

// openTunnelPair opens a tunnel and returns its client side and the
// upstream's side, after a byte went each way. Tunnels of one upstream
// are opened one at a time (the upstream's connections come in order).
var tunnelOpen sync.Mutex

func openTunnelPair(u *tunnelUpstream, addr, id string) (client, up net.Conn, err error) {
	tunnelOpen.Lock()
	defer tunnelOpen.Unlock()
	c, _, err := openTunnel(addr, id)
	if err != nil {
		return nil, nil, err
	}
	select {
	case up = <-u.conns:
	case <-time.After(longWait):
		c.Close()
		return nil, nil, errors.New("the upstream got no tunnel")
	}
	fail := func(err error) (net.Conn, net.Conn, error) {
		c.Close()
		up.Close()
		return nil, nil, err
	}
	_ = c.SetDeadline(time.Now().Add(longWait))
	_ = up.SetDeadline(time.Now().Add(longWait))
	b := make([]byte, 4)
	if _, err := io.WriteString(c, "ping"); err != nil {
		return fail(err)
	}
	if _, err := io.ReadFull(up, b); err != nil || string(b) != "ping" {
		return fail(fmt.Errorf("upstream read %q: %v", b, err))
	}
	if _, err := io.WriteString(up, "pong"); err != nil {
		return fail(err)
	}
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "pong" {
		return fail(fmt.Errorf("client read %q: %v", b, err))
	}
	_ = c.SetDeadline(time.Time{})
	_ = up.SetDeadline(time.Time{})
	return c, up, nil
}

// TestTunnelEndsWithEitherSide: when either side of an Upgrade tunnel
// ends (a FIN or a reset), the other side is closed at once, not at
// tunnel_idle_timeout (here a minute, longer than the test waits).
func TestTunnelEndsWithEitherSide(t *testing.T) {
	env := startLifecycle(t, `  - name: edge
    address: 127.0.0.1:0
    tunnel_idle_timeout: 60s`)
	addr := env.addrs[0]
	reset := func(c net.Conn) {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		} else if rc, ok := c.(readerConn); ok {
			_ = rc.Conn.(*net.TCPConn).SetLinger(0)
		}
		c.Close()
	}
	for _, tc := range []struct {
		name    string
		tunnels int
		end     func(client, up net.Conn) // ends one side
		upEnds  bool                      // the upstream side ended: the client must be closed
	}{
		{name: "upstream closes", tunnels: 1, end: func(_, up net.Conn) { up.Close() }, upEnds: true},
		{name: "upstream resets", tunnels: 1, end: func(_, up net.Conn) { reset(up) }, upEnds: true},
		{name: "upstream restarts under 8 tunnels", tunnels: 8, end: func(_, up net.Conn) { up.Close() }, upEnds: true},
		{name: "client closes", tunnels: 1, end: func(c, _ net.Conn) { c.Close() }},
		{name: "client resets", tunnels: 1, end: func(c, _ net.Conn) { reset(c) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			type pair struct{ c, up net.Conn }
			var pairs []pair
			for i := 0; i < tc.tunnels; i++ {
				c, up, err := openTunnelPair(env.tun, addr, fmt.Sprintf("tun-%d", i))
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				defer up.Close()
				pairs = append(pairs, pair{c, up})
			}
			for _, p := range pairs {
				tc.end(p.c, p.up)
			}
			for i, p := range pairs {
				other := p.up
				if tc.upEnds {
					other = p.c
				}
				if err := closedUnanswered(other); err != nil {
					t.Errorf("tunnel %d: the other side: %v", i, err)
				}
			}
		})
	}
	testutil.WaitFor(t, "every tunnel to be counted closed", func() bool {
		st := tunnelStats(t, env.sc)
		return st["open"] == 0.0 && st["opened"] == 12.0 && st["closed"] == 12.0
	})
}
