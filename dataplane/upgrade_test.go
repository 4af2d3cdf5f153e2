package dataplane_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/protocol"
)

const upgradeConfig = `
listeners:
  - name: ws
    address: 127.0.0.1:0
    tunnel_idle_timeout: {{or .Idle "5s"}}
    max_tunnels: {{or .Max "8"}}
{{- with .CertA}}
    tls:
      certificates: [{cert_file: {{.}}, key_file: {{$.KeyA}}}]
{{- end}}
upstreams:
  - name: app
    address: {{.Upstream}}
{{- with .UpCA}}
    tls: {ca_file: {{.}}, server_name: upstream.internal}
{{- end}}
{{- with .Agent}}
agents:
  - name: a
    transport: uds
    address: {{.}}
{{- end}}
routes:
  - name: main
    upstream: app
{{- with .Agent}}
    agents: [a]
{{- end}}
`

// wsEcho is a WebSocket upstream (gorilla/websocket) that answers every
// message with "echo:" and the message; hits counts upgrade requests.
func wsEcho(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	return wsEchoTLS(t, nil)
}

// wsEchoTLS is wsEcho over TLS with cert when cert is not nil.
func wsEchoTLS(t *testing.T, cert *tls.Certificate) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var hits atomic.Int64
	up := websocket.Upgrader{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		c, err := up.Upgrade(w, r, http.Header{"X-Upstream": {"yes"}})
		if err != nil {
			return
		}
		defer c.Close()
		for {
			mt, msg, err := c.ReadMessage()
			if err != nil {
				return
			}
			if err := c.WriteMessage(mt, append([]byte("echo:"), msg...)); err != nil {
				return
			}
		}
	}))
	if cert != nil {
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{*cert}}
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return srv, &hits
}

func wsSetup(t *testing.T, data map[string]any, h *agentFuncs) (*proxy, *atomic.Int64) {
	t.Helper()
	up, hits := wsEcho(t)
	data["Upstream"] = strings.TrimPrefix(up.URL, "http://")
	agents := map[string]agentmux.Agent{}
	if h != nil {
		data["Agent"] = serveAgent(t, h)
	}
	cfg := configText(t, upgradeConfig, data)
	if h != nil {
		agents["a"] = udsAgent(t, "a", data["Agent"].(string), nil)
	}
	return startProxy(t, cfg, agents, nil), hits
}

func wsDial(t *testing.T, url string, d *websocket.Dialer) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	if d == nil {
		d = &websocket.Dialer{}
	}
	d.HandshakeTimeout = hangGuard
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	return d.DialContext(ctx, url, nil)
}

func echo(t *testing.T, c *websocket.Conn, msg string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(hangGuard))
	if err := c.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
		t.Fatal(err)
	}
	_, got, err := c.ReadMessage()
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "echo:"+msg {
		t.Fatalf("echo %q, want %q", got, "echo:"+msg)
	}
}

func TestWebSocketEchoThroughAgents(t *testing.T) {
	rec := &mdRecorder{}
	p, _ := wsSetup(t, map[string]any{}, rec.handler(nil))
	c, resp, err := wsDial(t, "ws://"+p.addr+"/chat", nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Get("X-Upstream") != "yes" {
		t.Errorf("101 headers %v", resp.Header)
	}
	big := strings.Repeat("x", 200<<10) // several reads each way
	for _, m := range []string{"hello", "", big, "bye"} {
		echo(t, c, m)
	}
	_, hdr := rec.last(t)
	saw := map[string]string{}
	for _, h := range hdr {
		saw[string(h.Name)] = string(h.Value)
	}
	if saw["upgrade"] != "websocket" || !strings.EqualFold(saw["connection"], "upgrade") || saw["sec-websocket-key"] == "" {
		t.Errorf("agent saw %v", saw)
	}
	st := p.srv.Stats().Tunnels
	if st.Opened != 1 || st.Open != 1 || st.BytesIn < uint64(len(big)) || st.BytesOut < uint64(len(big)) {
		t.Errorf("tunnel stats while open %+v", st)
	}
	c.Close()
	testutil.WaitFor(t, "tunnel closed", func() bool { return p.srv.Stats().Tunnels.Closed == 1 })
	if st := p.srv.Stats().Tunnels; st.Open != 0 || st.IdleClosed != 0 {
		t.Errorf("tunnel stats after close %+v", st)
	}
	// The listener still serves ordinary requests, also on a new connection.
	c2, _, err := wsDial(t, "ws://"+p.addr+"/again", nil)
	if err != nil {
		t.Fatal(err)
	}
	echo(t, c2, "again")
	c2.Close()
}

func TestWebSocketOverTLSListenerAndTLSUpstream(t *testing.T) {
	pki := testutil.NewPKI(t, "edge")
	a := pki.Server(t, "a", "a.example")
	upCert := pki.Server(t, "up", "upstream.internal")
	up, hits := wsEchoTLS(t, &upCert.TLS)
	rec := &mdRecorder{}
	h := rec.handler(nil)
	data := map[string]any{"CertA": a.CertFile, "KeyA": a.KeyFile, "UpCA": pki.CAFile,
		"Upstream": strings.TrimPrefix(up.URL, "https://"), "Agent": serveAgent(t, h)}
	p := startProxy(t, configText(t, upgradeConfig, data), map[string]agentmux.Agent{"a": udsAgent(t, "a", data["Agent"].(string), nil)}, nil)
	c, _, err := wsDial(t, "wss://"+p.addr+"/secure", &websocket.Dialer{TLSClientConfig: &tls.Config{RootCAs: pki.Pool, ServerName: "a.example"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo(t, c, "over tls")
	echo(t, c, strings.Repeat("y", 100<<10))
	if hits.Load() != 1 {
		t.Errorf("upstream hits %d", hits.Load())
	}
	if md, _ := rec.last(t); string(md.TLSServerName) != "a.example" {
		t.Errorf("metadata sni %q", md.TLSServerName)
	}
}

func TestBlockedUpgradeGetsNo101(t *testing.T) {
	rec := &mdRecorder{}
	p, hits := wsSetup(t, map[string]any{}, rec.handler(func(m *protocol.RequestHeaders) bool {
		return strings.HasPrefix(string(m.URI), "/admin")
	}))
	_, resp, err := wsDial(t, "ws://"+p.addr+"/admin", nil)
	if !errors.Is(err, websocket.ErrBadHandshake) || resp == nil || resp.StatusCode != 403 {
		t.Fatalf("blocked upgrade: err %v resp %v", err, resp)
	}
	if hits.Load() != 0 {
		t.Error("a blocked upgrade reached the upstream")
	}
	if st := p.srv.Stats().Tunnels; st.Opened != 0 {
		t.Errorf("tunnel opened for a blocked upgrade: %+v", st)
	}
	c, _, err := wsDial(t, "ws://"+p.addr+"/public", nil)
	if err != nil {
		t.Fatal(err)
	}
	echo(t, c, "allowed")
	c.Close()
}

func TestUpgradeRefusedByUpstreamIsAResponse(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUpgradeRequired)
		fmt.Fprint(w, "no websocket here")
	})
	p := startProxy(t, configText(t, upgradeConfig, map[string]any{"Upstream": up.addr()}), nil, nil)
	_, resp, err := wsDial(t, "ws://"+p.addr+"/", nil)
	if !errors.Is(err, websocket.ErrBadHandshake) || resp == nil || resp.StatusCode != http.StatusUpgradeRequired {
		t.Fatalf("err %v resp %v", err, resp)
	}
	if got := up.last(t); got.Header.Get("Upgrade") != "websocket" || !strings.EqualFold(got.Header.Get("Connection"), "upgrade") {
		t.Errorf("upstream got Upgrade %q Connection %q", got.Header.Get("Upgrade"), got.Header.Get("Connection"))
	}
	if st := p.srv.Stats().Tunnels; st.Opened != 0 {
		t.Errorf("stats %+v", st)
	}
}

// A Connection: upgrade request that is not a valid upgrade (a body, or
// Connection: close) loses both headers, as any hop-by-hop header.
func TestUpgradeHeadersStrippedWhenNotAnUpgrade(t *testing.T) {
	up := newUpstream(t, nil)
	p := startProxy(t, configText(t, upgradeConfig, map[string]any{"Upstream": up.addr()}), nil, nil)
	for _, extra := range []string{"Content-Length: 3\r\n", "Connection: close\r\n"} {
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		body := ""
		if strings.HasPrefix(extra, "Content") {
			body = "abc"
		}
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: websocket\r\n%s\r\n%s", extra, body)
		_ = c.SetReadDeadline(time.Now().Add(hangGuard))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%q: status %d", extra, resp.StatusCode)
		}
		if got := up.last(t); got.Header.Get("Upgrade") != "" {
			t.Errorf("%q: upstream got Upgrade %q", extra, got.Header.Get("Upgrade"))
		}
	}
}

func TestTunnelIdleTimeout(t *testing.T) {
	p, _ := wsSetup(t, map[string]any{"Idle": "150ms"}, nil)
	c, _, err := wsDial(t, "ws://"+p.addr+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo(t, c, "one")
	_ = c.SetReadDeadline(time.Now().Add(hangGuard))
	if _, _, err := c.ReadMessage(); err == nil {
		t.Fatal("read a message from an idle tunnel")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the idle tunnel was not closed by the proxy")
	}
	testutil.WaitFor(t, "idle close counted", func() bool {
		st := p.srv.Stats().Tunnels
		return st.IdleClosed == 1 && st.Closed == 1
	})
}

func TestMaxTunnels(t *testing.T) {
	p, hits := wsSetup(t, map[string]any{"Max": "1"}, nil)
	c, _, err := wsDial(t, "ws://"+p.addr+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	echo(t, c, "first")
	_, resp, err := wsDial(t, "ws://"+p.addr+"/", nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("second tunnel: err %v resp %v", err, resp)
	}
	if hits.Load() != 1 || p.srv.Stats().Tunnels.Refused != 1 {
		t.Errorf("hits %d stats %+v", hits.Load(), p.srv.Stats().Tunnels)
	}
	c.Close()
	testutil.WaitFor(t, "slot freed", func() bool { return p.srv.Stats().Tunnels.Open == 0 })
	c, _, err = wsDial(t, "ws://"+p.addr+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	echo(t, c, "after")
	c.Close()
}

func TestShutdownClosesTunnelsAfterGrace(t *testing.T) {
	p, _ := wsSetup(t, map[string]any{}, nil)
	c, _, err := wsDial(t, "ws://"+p.addr+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo(t, c, "before shutdown")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.srv.Shutdown(ctx) }()
	testutil.WaitFor(t, "shutdown started", func() bool { return !p.srv.Listening() })
	// The tunnel works during the grace period: Shutdown waits for it.
	echo(t, c, "during grace")
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned (%v) with a tunnel open before its grace period ended", err)
	default:
	}
	cancel() // the grace period ends
	select {
	case <-done:
	case <-time.After(hangGuard):
		t.Fatal("Shutdown did not return after its grace period")
	}
	_ = c.SetReadDeadline(time.Now().Add(hangGuard))
	if _, _, err := c.ReadMessage(); err == nil {
		t.Fatal("tunnel still open after shutdown")
	}
	testutil.WaitFor(t, "drained tunnel counted", func() bool {
		st := p.srv.Stats().Tunnels
		return st.DrainClosed == 1 && st.Closed == 1 && st.Open == 0
	})
}

// An upstream that switches protocols on a request that asked for no
// upgrade is an upstream error: the client never gets a 101.
func TestUnaskedSwitchIsABadGateway(t *testing.T) {
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
				_ = c.SetDeadline(time.Now().Add(hangGuard))
				br := bufio.NewReader(c)
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				fmt.Fprintf(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: sneaky\r\n\r\nraw bytes")
				_, _ = br.ReadByte() // hold the connection until the proxy drops it
			}()
		}
	}()
	p := startProxy(t, configText(t, upgradeConfig, map[string]any{"Upstream": ln.Addr().String()}), nil, nil)
	resp, body := p.do(t, "GET", "/", nil)
	if resp.StatusCode != http.StatusBadGateway || strings.Contains(body, "raw bytes") {
		t.Fatalf("status %d body %q, want 502", resp.StatusCode, body)
	}
	if st := p.srv.Stats(); st.UpstreamErrors != 1 || st.Tunnels.Opened != 0 {
		t.Errorf("upstream errors %d tunnels %+v", st.UpstreamErrors, st.Tunnels)
	}
}
