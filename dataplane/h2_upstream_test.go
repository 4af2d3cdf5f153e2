package dataplane_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// refusingH2 is an h2c server that refuses every stream with
// RST_STREAM REFUSED_STREAM, before processing it (RFC 9113 §8.7).
type refusingH2 struct {
	ln      net.Listener
	refused atomic.Int64
}

func newRefusingH2(t *testing.T) *refusingH2 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &refusingH2{ln: ln}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go r.serve(c)
		}
	}()
	return r
}

func (r *refusingH2) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(hangGuard))
	pre := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, pre); err != nil {
		return
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		return
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.HeadersFrame:
			r.refused.Add(1)
			_ = fr.WriteRSTStream(f.StreamID, http2.ErrCodeRefusedStream)
		}
	}
}

// h2cServer is a net/http server of cleartext HTTP/2 on a loopback port.
func h2cServer(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	srv := &http.Server{Handler: h, ReadHeaderTimeout: hangGuard}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetUnencryptedHTTP2(true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// TestH2UpstreamRefusedStreamRetried: a stream an endpoint refused
// before processing it goes once more, to another endpoint, whatever its
// method; when every endpoint refuses, the client gets 502 after one
// retry.
func TestH2UpstreamRefusedStreamRetried(t *testing.T) {
	bad := newRefusingH2(t)
	var served atomic.Int64
	good := h2cServer(t, func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		fmt.Fprintf(w, "ok %s", r.Method)
	})
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, endpoints: [%q, %q], protocol: h2c}]
routes: [{upstream: app}]
`, bad.ln.Addr(), good)))
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, cfg, nil, nil)
	for i := 0; i < 6; i++ {
		resp, body := p.do(t, "POST", "/x", nil)
		if resp.StatusCode != 200 || body != "ok POST" {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
	}
	if bad.refused.Load() == 0 || served.Load() != 6 {
		t.Errorf("refused %d, served %d: want some refused and all 6 served", bad.refused.Load(), served.Load())
	}
	if st := p.srv.Stats(); st.EndpointRetries == 0 {
		t.Errorf("endpoint retries %d", st.EndpointRetries)
	}

	bad2 := newRefusingH2(t)
	cfg, err = config.Parse([]byte(fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, endpoints: [%q, %q], protocol: h2c}]
routes: [{upstream: app}]
`, bad.ln.Addr(), bad2.ln.Addr())))
	if err != nil {
		t.Fatal(err)
	}
	p = startProxy(t, cfg, nil, nil)
	before := bad.refused.Load() + bad2.refused.Load()
	resp, _ := p.do(t, "GET", "/y", nil)
	if got := bad.refused.Load() + bad2.refused.Load() - before; resp.StatusCode != 502 || got != 2 {
		t.Errorf("every endpoint refusing: %d after %d refusals, want 502 after 2", resp.StatusCode, got)
	}
}

// TestH2UpstreamBoundedConnections: with max_conns 1, concurrent requests
// share one connection to the endpoint.
func TestH2UpstreamBoundedConnections(t *testing.T) {
	var conns atomic.Int64
	release := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		_, _ = io.WriteString(w, "ok")
	}), ReadHeaderTimeout: hangGuard, ConnState: func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetUnencryptedHTTP2(true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q, protocol: h2c, max_conns: 1}]
routes: [{upstream: app}]
`, ln.Addr())))
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, cfg, nil, nil)
	const n = 8
	errs := make(chan string, n)
	for i := 0; i < n; i++ {
		go func() {
			resp, err := p.client.Get(p.url("/"))
			if err != nil {
				errs <- err.Error()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			errs <- fmt.Sprintf("%d %s", resp.StatusCode, b)
		}()
	}
	testutil.WaitFor(t, "requests in flight upstream", func() bool {
		return p.srv.Upstreams()[0].Endpoints[0].InFlight == n
	})
	close(release)
	for i := 0; i < n; i++ {
		if got := <-errs; !strings.HasPrefix(got, "200 ok") {
			t.Errorf("request: %s", got)
		}
	}
	if conns.Load() != 1 {
		t.Errorf("%d connections to the upstream, want 1", conns.Load())
	}
}

// TestUpgradeToH2UpstreamRefused: HTTP/2 has no Upgrade, so an upgrade
// request for an HTTP/2 upstream fails (502) rather than reaching it
// half-translated.
func TestUpgradeToH2UpstreamRefused(t *testing.T) {
	var served atomic.Int64
	good := h2cServer(t, func(w http.ResponseWriter, r *http.Request) { served.Add(1) })
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0"}]
upstreams: [{name: app, address: %q, protocol: h2c}]
routes: [{upstream: app}]
`, good)))
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, cfg, nil, nil)
	resp, _ := p.do(t, "GET", "/ws", nil, "Connection", "Upgrade", "Upgrade", "websocket",
		"Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	if resp.StatusCode != 502 || served.Load() != 0 {
		t.Errorf("upgrade to an h2c upstream: %d, upstream served %d", resp.StatusCode, served.Load())
	}
	if resp, body := p.do(t, "GET", "/plain", nil); resp.StatusCode != 200 {
		t.Errorf("then a plain request: %d %q", resp.StatusCode, body)
	}
}
