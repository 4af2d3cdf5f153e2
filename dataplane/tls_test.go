package dataplane_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// tlsConfigTmpl is one TLS listener (certificates a and b, optional
// client CA) in front of Upstream, with optional upstream TLS and agent.
const tlsConfigTmpl = `
listeners:
  - name: tls
    address: 127.0.0.1:0
    disconnect_check: 20ms
    tls:
      certificates:
        - cert_file: {{.CertA}}
          key_file: {{.KeyA}}
{{- with .CertB}}
        - cert_file: {{.}}
          key_file: {{$.KeyB}}
{{- end}}
      reload_interval: 100ms
{{- with .ClientCA}}
      client_ca_file: {{.}}
      client_auth: {{or $.ClientAuth "require"}}
{{- end}}
upstreams:
  - name: app
    address: {{.Upstream}}
{{- with .UpCA}}
    tls:
      ca_file: {{.}}
      server_name: {{$.UpName}}
{{- with $.UpCert}}
      cert_file: {{.}}
      key_file: {{$.UpKey}}
{{- end}}
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

// mdRecorder is an agent that keeps the metadata of every RequestHeaders.
type mdRecorder struct {
	mu  sync.Mutex
	mds []protocol.Metadata
	hdr []protocol.Headers
}

func (r *mdRecorder) handler(block func(*protocol.RequestHeaders) bool) *agentFuncs {
	return &agentFuncs{Base: sdk.Base{Caps: headersOnly()}, reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
		md := m.Metadata
		cp := func(b []byte) []byte { return append([]byte(nil), b...) }
		c := protocol.Metadata{TLSVersion: cp(md.TLSVersion), TLSCipher: cp(md.TLSCipher), TLSServerName: cp(md.TLSServerName),
			TLSClientSubject: cp(md.TLSClientSubject), TLSClientSAN: cp(md.TLSClientSAN)}
		var h protocol.Headers
		for _, f := range m.Headers {
			h = append(h, protocol.Header{Name: cp(f.Name), Value: cp(f.Value)})
		}
		r.mu.Lock()
		r.mds = append(r.mds, c)
		r.hdr = append(r.hdr, h)
		r.mu.Unlock()
		if block != nil && block(m) {
			d.Kind, d.Status, d.Body = protocol.DecisionBlock, 403, []byte("upgrade refused")
		}
		return nil
	}}
}

func (r *mdRecorder) last(t *testing.T) (protocol.Metadata, protocol.Headers) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.mds) == 0 {
		t.Fatal("agent saw no request")
	}
	return r.mds[len(r.mds)-1], r.hdr[len(r.hdr)-1]
}

// tlsSetup starts a proxy with a TLS listener from data (tlsConfigTmpl),
// with agent "a" when data["Agent"] is a handler.
func tlsSetup(t *testing.T, data map[string]any, h *agentFuncs) *proxy {
	t.Helper()
	agents := map[string]agentmux.Agent{}
	if h != nil {
		data["Agent"] = serveAgent(t, h)
	}
	cfg := configText(t, tlsConfigTmpl, data)
	if h != nil {
		agents["a"] = udsAgent(t, "a", data["Agent"].(string), nil)
	}
	return startProxy(t, cfg, agents, nil)
}

// peerCert dials the proxy with SNI name and returns the served leaf.
func peerCert(t *testing.T, addr, name string, pool *x509.CertPool) *x509.Certificate {
	t.Helper()
	d := &net.Dialer{Timeout: hangGuard}
	// Verified against pool when the name is one the certificates hold.
	skip := name == "" || strings.HasPrefix(name, "other.")
	c, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{ServerName: name, RootCAs: pool, InsecureSkipVerify: skip}) //nolint:gosec // checks the fallback certificate
	if err != nil {
		t.Fatalf("TLS dial with SNI %q: %v", name, err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0]
}

func httpsClient(pool *x509.CertPool, name string, certs ...tls.Certificate) *http.Client {
	return &http.Client{Timeout: hangGuard, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: name, Certificates: certs},
	}}
}

func TestTLSListenerSNIAndMetadata(t *testing.T) {
	pki := testutil.NewPKI(t, "edge")
	a := pki.Server(t, "a", "a.example")
	b := pki.Server(t, "b", "b.example", "*.b.example")
	up := newUpstream(t, nil)
	rec := &mdRecorder{}
	p := tlsSetup(t, map[string]any{"Upstream": up.addr(), "CertA": a.CertFile, "KeyA": a.KeyFile,
		"CertB": b.CertFile, "KeyB": b.KeyFile}, rec.handler(nil))

	for _, c := range []struct{ sni, want string }{
		{"a.example", "a.example"}, {"b.example", "b.example"}, {"x.b.example", "b.example"},
		{"other.example", "a.example"}, {"", "a.example"},
	} {
		got := peerCert(t, p.addr, c.sni, pki.Pool)
		if got.DNSNames[0] != c.want {
			t.Errorf("SNI %q: served %v, want %s", c.sni, got.DNSNames, c.want)
		}
	}

	resp, err := httpsClient(pki.Pool, "b.example").Get("https://" + p.addr + "/x")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "hello from upstream" {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	if got := up.last(t).Header.Get("X-Forwarded-Proto"); got != "https" {
		t.Errorf("X-Forwarded-Proto %q, want https", got)
	}
	md, _ := rec.last(t)
	if string(md.TLSVersion) != "TLS1.3" || string(md.TLSServerName) != "b.example" || !strings.HasPrefix(string(md.TLSCipher), "TLS_") {
		t.Errorf("metadata version %q sni %q cipher %q", md.TLSVersion, md.TLSServerName, md.TLSCipher)
	}
	if len(md.TLSClientSubject) != 0 || len(md.TLSClientSAN) != 0 {
		t.Errorf("client certificate facts without mTLS: %q %q", md.TLSClientSubject, md.TLSClientSAN)
	}
	if st := p.srv.Stats().TLS; st.Handshakes < 6 || st.Reloads != 1 {
		t.Errorf("TLS stats %+v", st)
	}
	// Plain HTTP on the TLS port is answered 400, not served.
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(hangGuard))
	reply, _ := io.ReadAll(c)
	c.Close()
	if strings.Contains(string(reply), "hello from upstream") || !strings.HasPrefix(string(reply), "HTTP/1.1 400 ") {
		t.Errorf("plain HTTP on a TLS listener: %q", reply)
	}
	testutil.WaitFor(t, "plain HTTP counted", func() bool { return p.srv.Stats().TLS.PlainHTTP >= 1 })
	// The answer is the listener's, before any request: not an
	// unparsable request.
	if n := p.srv.Stats().Rejected["parse"]; n != 0 {
		t.Errorf("plain HTTP counted as %d parse rejections", n)
	}
}

// TestTLSListenerAnswersPlainHTTP: a plain HTTP request on a TLS
// listener gets nginx's 400 with Connection: close (it used to be closed
// unanswered), even while the client is still sending its body; bytes
// that are neither TLS nor HTTP stay a failed handshake, and TLS clients
// are served as before.
func TestTLSListenerAnswersPlainHTTP(t *testing.T) {
	pki := testutil.NewPKI(t, "edge")
	a := pki.Server(t, "a", "a.example")
	up := newUpstream(t, nil)
	cfg := configText(t, tlsConfigTmpl, map[string]any{"Upstream": up.addr(), "CertA": a.CertFile, "KeyA": a.KeyFile})
	p := startProxy(t, cfg, nil, nil)

	raw := func(req []byte) *http.Response {
		t.Helper()
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(hangGuard))
		go func() { _, _ = c.Write(req) }() // the body may outlast the answer
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("no HTTP answer to %.20q: %v", req, err)
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("answer's body: %v", err)
		}
		if string(body) != "The plain HTTP request was sent to HTTPS port\n" {
			t.Errorf("body %q", body)
		}
		return resp
	}
	post := append([]byte("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 262144\r\n\r\n"), bytes.Repeat([]byte("a"), 256<<10)...)
	for i, req := range [][]byte{[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), []byte("HEAD / HTTP/1.0\r\n\r\n"), post} {
		resp := raw(req)
		if resp.StatusCode != 400 || !resp.Close {
			t.Errorf("request %d: status %d, close %v", i, resp.StatusCode, resp.Close)
		}
	}
	testutil.WaitFor(t, "plain HTTP counted", func() bool { return p.srv.Stats().TLS.PlainHTTP == 3 })

	// Neither TLS nor HTTP: closed unanswered, a failed handshake.
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(hangGuard))
	_, _ = c.Write([]byte("\x00\x01\x02\x03\x04\x05\x06"))
	if reply, _ := io.ReadAll(c); len(reply) != 0 {
		t.Errorf("garbage answered with %q", reply)
	}
	c.Close()
	testutil.WaitFor(t, "handshake error counted", func() bool { return p.srv.Stats().TLS.HandshakeErrors == 1 })

	resp, err := httpsClient(pki.Pool, "a.example").Get("https://" + p.addr + "/x")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("TLS client: status %d", resp.StatusCode)
	}
	if st := p.srv.Stats().TLS; st.PlainHTTP != 3 || st.HandshakeErrors != 1 || st.Handshakes < 1 {
		t.Errorf("TLS stats %+v", st)
	}
}

func TestTLSMinVersionAndCiphers(t *testing.T) {
	pki := testutil.NewPKI(t, "edge")
	a := pki.Server(t, "a", "a.example")
	up := newUpstream(t, nil)
	cfg := configText(t, tlsConfigTmpl, map[string]any{"Upstream": up.addr(), "CertA": a.CertFile, "KeyA": a.KeyFile})
	cfg.Listeners[0].TLS.CipherSuites = []string{"TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"}
	p := startProxy(t, cfg, nil, nil)
	conf := &tls.Config{ServerName: "a.example", RootCAs: pki.Pool, MaxVersion: tls.VersionTLS12}
	c, err := tls.Dial("tcp", p.addr, conf)
	if err != nil {
		t.Fatal(err)
	}
	if cs := c.ConnectionState().CipherSuite; cs != tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384 {
		t.Errorf("cipher %s, want the configured one", tls.CipherSuiteName(cs))
	}
	c.Close()
	conf.CipherSuites = []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}
	if c, err := tls.Dial("tcp", p.addr, conf); err == nil {
		c.Close()
		t.Error("a TLS 1.2 client without the configured cipher suite was served")
	}
	conf = &tls.Config{ServerName: "a.example", RootCAs: pki.Pool, MaxVersion: tls.VersionTLS11, MinVersion: tls.VersionTLS10}
	if c, err := tls.Dial("tcp", p.addr, conf); err == nil {
		c.Close()
		t.Error("TLS 1.1 accepted")
	}
}

func TestTLSClientCertificates(t *testing.T) {
	pki := testutil.NewPKI(t, "edge")
	other := testutil.NewPKI(t, "rogue")
	a := pki.Server(t, "a", "a.example")
	good := pki.Client(t, "billing", "billing")
	bad := other.Client(t, "mallory", "mallory")
	up := newUpstream(t, nil)
	rec := &mdRecorder{}
	p := tlsSetup(t, map[string]any{"Upstream": up.addr(), "CertA": a.CertFile, "KeyA": a.KeyFile,
		"ClientCA": pki.CAFile}, rec.handler(nil))
	url := "https://" + p.addr + "/mtls"

	resp, err := httpsClient(pki.Pool, "a.example", good.TLS).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("with a client certificate: status %d", resp.StatusCode)
	}
	md, _ := rec.last(t)
	if string(md.TLSClientSubject) != "CN=billing" {
		t.Errorf("client subject %q", md.TLSClientSubject)
	}
	before := up.count()
	for name, certs := range map[string][]tls.Certificate{"none": nil, "other CA": {bad.TLS}} {
		resp, err := httpsClient(pki.Pool, "a.example", certs...).Get(url)
		if err == nil {
			resp.Body.Close()
			t.Errorf("client certificate %s: served with status %d", name, resp.StatusCode)
		}
	}
	if up.count() != before {
		t.Error("a refused client reached the upstream")
	}
	testutil.WaitFor(t, "refused handshakes counted", func() bool { return p.srv.Stats().TLS.HandshakeErrors >= 2 })
	testutil.WaitFor(t, "refused handshake logged", func() bool { return strings.Contains(p.logs.String(), "TLS handshake failed") })
}

func TestTLSClientCertificateOptional(t *testing.T) {
	pki := testutil.NewPKI(t, "edge")
	a := pki.Server(t, "a", "a.example")
	good := pki.Client(t, "svc", "svc")
	up := newUpstream(t, nil)
	rec := &mdRecorder{}
	p := tlsSetup(t, map[string]any{"Upstream": up.addr(), "CertA": a.CertFile, "KeyA": a.KeyFile,
		"ClientCA": pki.CAFile, "ClientAuth": "optional"}, rec.handler(nil))
	for _, certs := range [][]tls.Certificate{nil, {good.TLS}} {
		resp, err := httpsClient(pki.Pool, "a.example", certs...).Get("https://" + p.addr + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		md, _ := rec.last(t)
		if want := map[bool]string{false: "", true: "CN=svc"}[len(certs) > 0]; string(md.TLSClientSubject) != want {
			t.Errorf("certs %d: subject %q, want %q", len(certs), md.TLSClientSubject, want)
		}
	}
}

func TestTLSCertificateRotation(t *testing.T) {
	pki := testutil.NewPKI(t, "edge")
	a := pki.Server(t, "a", "a.example")
	up := newUpstream(t, nil)
	p := tlsSetup(t, map[string]any{"Upstream": up.addr(), "CertA": a.CertFile, "KeyA": a.KeyFile}, nil)
	first := peerCert(t, p.addr, "a.example", pki.Pool).SerialNumber

	// A half-written rotation (garbage certificate) keeps the old one.
	if err := os.WriteFile(a.CertFile, []byte("-----BEGIN CERTIFICATE-----\nnot base64\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "failed reload counted", func() bool { return p.srv.Stats().TLS.ReloadErrors >= 1 })
	if got := peerCert(t, p.addr, "a.example", pki.Pool).SerialNumber; got.Cmp(first) != 0 {
		t.Fatalf("serial %v after a failed reload, want the old %v", got, first)
	}

	// Issuing again rewrites both files: the new certificate is served
	// without a restart.
	next := pki.Server(t, "a", "a.example")
	testutil.WaitFor(t, "rotated certificate served", func() bool {
		return peerCert(t, p.addr, "a.example", pki.Pool).SerialNumber.Cmp(next.TLS.Leaf.SerialNumber) == 0
	})
	if !strings.Contains(p.logs.String(), "TLS certificates not reloaded") || !strings.Contains(p.logs.String(), "file change") {
		t.Errorf("rotation not logged:\n%s", p.logs.String())
	}

	// A reload (Swap) pointing at other files takes effect at once.
	b := pki.Server(t, "b", "a.example")
	cfg := configText(t, tlsConfigTmpl, map[string]any{"Upstream": up.addr(), "CertA": b.CertFile, "KeyA": b.KeyFile})
	if err := p.srv.Swap(cfg, map[string]agentmux.Agent{}); err != nil {
		t.Fatal(err)
	}
	if got := peerCert(t, p.addr, "a.example", pki.Pool).SerialNumber; got.Cmp(b.TLS.Leaf.SerialNumber) != 0 {
		t.Errorf("after Swap: serial %v, want %v", got, b.TLS.Leaf.SerialNumber)
	}
}

// tlsUpstream is an HTTPS upstream with a certificate for upstream.internal
// from pki; clientCAs, when set, requires a client certificate.
func tlsUpstream(t *testing.T, pki *testutil.PKI, clientCAs *x509.CertPool) (*httptest.Server, chan string) {
	t.Helper()
	cert := pki.Server(t, "up", "upstream.internal")
	seen := make(chan string, 8)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cn := ""
		if len(r.TLS.PeerCertificates) > 0 {
			cn = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		seen <- cn
		fmt.Fprint(w, "secure upstream")
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert.TLS}}
	if clientCAs != nil {
		srv.TLS.ClientCAs = clientCAs
		srv.TLS.ClientAuth = tls.RequireAndVerifyClientCert
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, seen
}

func TestUpstreamTLS(t *testing.T) {
	edge := testutil.NewPKI(t, "edge")
	a := edge.Server(t, "a", "a.example")
	upPKI := testutil.NewPKI(t, "internal")
	rogue := testutil.NewPKI(t, "rogue")
	client := upPKI.Client(t, "sidecar", "sidecar")
	srv, seen := tlsUpstream(t, upPKI, upPKI.Pool)
	addr := strings.TrimPrefix(srv.URL, "https://")
	get := func(p *proxy) (int, string) {
		resp, err := httpsClient(edge.Pool, "a.example").Get("https://" + p.addr + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	base := map[string]any{"Upstream": addr, "CertA": a.CertFile, "KeyA": a.KeyFile, "UpName": "upstream.internal",
		"UpCert": client.CertFile, "UpKey": client.KeyFile}
	with := func(kv ...string) map[string]any {
		m := map[string]any{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}

	t.Run("verified with client certificate", func(t *testing.T) {
		p := tlsSetup(t, with("UpCA", upPKI.CAFile), nil)
		if st, body := get(p); st != 200 || body != "secure upstream" {
			t.Fatalf("status %d body %q", st, body)
		}
		if cn := <-seen; cn != "sidecar" {
			t.Errorf("upstream saw client certificate %q", cn)
		}
	})
	t.Run("wrong CA refused", func(t *testing.T) {
		p := tlsSetup(t, with("UpCA", rogue.CAFile), nil)
		if st, _ := get(p); st != http.StatusBadGateway {
			t.Fatalf("status %d with an untrusted upstream, want 502", st)
		}
		if !strings.Contains(p.logs.String(), "certificate signed by unknown authority") {
			t.Errorf("cause not logged:\n%s", p.logs.String())
		}
	})
	t.Run("wrong server name refused", func(t *testing.T) {
		p := tlsSetup(t, with("UpCA", upPKI.CAFile, "UpName", "other.internal"), nil)
		if st, _ := get(p); st != http.StatusBadGateway {
			t.Fatalf("status %d with a mismatched server name, want 502", st)
		}
	})
	t.Run("no client certificate refused by the upstream", func(t *testing.T) {
		p := tlsSetup(t, with("UpCA", upPKI.CAFile, "UpCert", ""), nil)
		if st, _ := get(p); st != http.StatusBadGateway {
			t.Fatalf("status %d, want 502", st)
		}
	})
	t.Run("insecure_skip_verify warns", func(t *testing.T) {
		cfg := configText(t, tlsConfigTmpl, with("UpCA", rogue.CAFile))
		cfg.Upstreams[0].TLS.InsecureSkipVerify = true
		p := startProxy(t, cfg, nil, nil)
		if st, _ := get(p); st != 200 {
			t.Fatalf("status %d", st)
		}
		if !strings.Contains(p.logs.String(), "INSECURE") {
			t.Error("no warning at start")
		}
		n := strings.Count(p.logs.String(), "INSECURE")
		if err := p.srv.Swap(cfg, map[string]agentmux.Agent{}); err != nil {
			t.Fatal(err)
		}
		if strings.Count(p.logs.String(), "INSECURE") != n+1 {
			t.Error("no warning at reload")
		}
	})
}

func TestTLSClientGoneIsNoticed(t *testing.T) {
	pki := testutil.NewPKI(t, "edge")
	a := pki.Server(t, "a", "a.example")
	aborted := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
			close(aborted)
		case <-time.After(hangGuard):
		}
	})
	p := tlsSetup(t, map[string]any{"Upstream": up.addr(), "CertA": a.CertFile, "KeyA": a.KeyFile}, nil)
	c, err := tls.Dial("tcp", p.addr, &tls.Config{ServerName: "a.example", RootCAs: pki.Pool})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "GET /slow HTTP/1.1\r\nHost: a.example\r\n\r\n")
	testutil.WaitFor(t, "request at the upstream", func() bool { return up.count() == 1 })
	c.Close() // close_notify, then FIN
	select {
	case <-aborted:
	case <-time.After(hangGuard):
		t.Fatal("the upstream request was not aborted after the TLS client left")
	}
	testutil.WaitFor(t, "client-gone counter", func() bool { return p.srv.Stats().ClientGone == 1 })
}

func TestTLSConfigErrors(t *testing.T) {
	pki := testutil.NewPKI(t, "edge")
	a := pki.Server(t, "a", "a.example")
	bogus := pki.Dir + "/bogus.pem"
	if err := os.WriteFile(bogus, []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, yaml, want string }{
		{"missing key", "cert_file: " + a.CertFile + "\n          key_file: /nonexistent/key.pem", "no such file"},
		{"bad PEM", "cert_file: " + bogus + "\n          key_file: " + a.KeyFile, "failed to find any PEM data"},
	} {
		text := strings.Replace(`
listeners:
  - address: 127.0.0.1:0
    tls:
      cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]
      certificates:
        - CERT
upstreams: [{name: app, address: 127.0.0.1:1}]
routes: [{upstream: app}]
`, "CERT", c.yaml, 1)
		_, err := config.Parse([]byte(text))
		if err == nil || !strings.Contains(err.Error(), "listeners[0].tls.certificates[0].cert_file") ||
			!strings.Contains(err.Error(), "line 7") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v", c.name, err)
		}
	}
	_, err := config.Parse([]byte(`
listeners:
  - address: 127.0.0.1:0
    tls:
      cipher_suites: [TLS_NOPE]
      certificates: [{cert_file: ` + a.CertFile + `, key_file: ` + a.KeyFile + `}]
upstreams: [{name: app, address: 127.0.0.1:1}]
routes: [{upstream: app}]
`))
	if err == nil || !strings.Contains(err.Error(), "line 5") || !strings.Contains(err.Error(), `unknown cipher suite "TLS_NOPE"`) {
		t.Errorf("unknown cipher: %v", err)
	}
	var ce *config.Error
	if !errors.As(err, &ce) {
		t.Errorf("error %T is not a *config.Error", err)
	}
}

// A client that connects and never completes its handshake is dropped
// after read_timeout, like one that never sends its request head.
func TestTLSHandshakeBoundedByReadTimeout(t *testing.T) {
	pki := testutil.NewPKI(t, "edge")
	a := pki.Server(t, "a", "a.example")
	up := newUpstream(t, nil)
	cfg := configText(t, tlsConfigTmpl, map[string]any{"Upstream": up.addr(), "CertA": a.CertFile, "KeyA": a.KeyFile})
	cfg.Listeners[0].ReadTimeout = 200 * time.Millisecond
	p := startProxy(t, cfg, nil, nil)
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(hangGuard))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("the server sent bytes to a client that sent none")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("a silent client was not dropped")
	}
	testutil.WaitFor(t, "handshake error counted", func() bool { return p.srv.Stats().TLS.HandshakeErrors == 1 })
}

// TestTLSClientRefusesCertificate: a TLS 1.3 client that does not trust
// the listener's certificate ends the handshake with a plaintext alert
// (OpenSSL's does: here through Python's ssl module), which crypto/tls
// reports as "bad record MAC"; the log names the client's refusal and
// its alert instead.
func TestTLSClientRefusesCertificate(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 (an OpenSSL client) is not installed")
	}
	pki := testutil.NewPKI(t, "edge")
	a := pki.Server(t, "a", "a.example")
	up := newUpstream(t, nil)
	p := startProxy(t, configText(t, tlsConfigTmpl, map[string]any{"Upstream": up.addr(), "CertA": a.CertFile, "KeyA": a.KeyFile}), nil, nil)
	host, port, _ := net.SplitHostPort(p.addr)
	const script = `import socket, ssl, sys
ctx = ssl.create_default_context()  # the system's roots, without the test's CA
ctx.minimum_version = ssl.TLSVersion.TLSv1_3
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
try:
    ctx.wrap_socket(s, server_hostname="a.example")
except ssl.SSLCertVerificationError:
    sys.exit(0)
sys.exit("the handshake succeeded")
`
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	if out, err := exec.CommandContext(ctx, py, "-c", script, host, port).CombinedOutput(); err != nil {
		t.Fatalf("client: %v: %s", err, out)
	}
	testutil.WaitFor(t, "the refusal logged", func() bool {
		return strings.Contains(p.logs.String(), "TLS handshake refused by the client")
	})
	log := p.logs.String()
	if !strings.Contains(log, `"alert":"unknown_ca"`) || strings.Contains(log, "bad record MAC") {
		t.Errorf("log:\n%s", log)
	}
	if st := p.srv.Stats().TLS; st.HandshakeErrors != 1 {
		t.Errorf("handshake errors %d, want 1", st.HandshakeErrors)
	}
}
