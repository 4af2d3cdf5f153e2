package admin

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/dataplane"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/metrics"
	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// rawRequest sends one request over a fresh TCP connection, byte for byte,
// so that the Host header is exactly host (no Host line when host is "",
// in HTTP/1.0, which does not require one).
func rawRequest(t *testing.T, addr, method, path, host string) (int, string) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	req := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", method, path, host)
	if host == "" {
		req = fmt.Sprintf("%s %s HTTP/1.0\r\nContent-Length: 0\r\n\r\n", method, path)
	}
	if _, err := io.WriteString(nc, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil {
		t.Fatalf("%s %s (Host %q): %v", method, path, host, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// hostFixture is an admin listener with every endpoint configured and a
// reload that counts its calls.
func hostFixture(t *testing.T, mutate func(*Config)) (addr string, reloads *atomic.Int64) {
	t.Helper()
	m, err := metrics.New(metrics.Config{Version: "v9"})
	if err != nil {
		t.Fatal(err)
	}
	reloads = new(atomic.Int64)
	cfg := Config{
		Version:  "v9",
		Gatherer: m.Registry(),
		Routes:   func() []string { return []string{"secret-route"} },
		Stats:    func() dataplane.Stats { return dataplane.Stats{Requests: 7} },
		Reload:   func() error { reloads.Add(1); return nil },
	}
	if mutate != nil {
		mutate(&cfg)
	}
	s, _ := start(t, cfg)
	return s.Addr().String(), reloads
}

var endpoints = []struct{ method, path string }{
	{"GET", "/metrics"}, {"GET", "/status"}, {"GET", "/healthz"}, {"GET", "/readyz"}, {"POST", "/reload"},
}

// TestForeignHostRefused: a request naming a host the admin listener does
// not answer to (what a DNS-rebound browser page sends) is refused with
// 421 on every endpoint, before the endpoint runs, with a body that tells
// nothing; the refusals are counted on /metrics and /status.
func TestForeignHostRefused(t *testing.T) {
	addr, reloads := hostFixture(t, nil)
	_, port, _ := net.SplitHostPort(addr)
	foreign := []string{
		"evil.example",
		"evil.example:" + port,
		"localhost.evil.example",
		"127.0.0.1.nip.io:" + port,
		"::1",         // IPv6 without brackets is not a Host
		"[evil]",      // brackets hold an IPv6 address or nothing
		"[127.0.0.1]", // nor IPv4
		"127.0.0.1:x", // a port is digits
		"",            // no Host at all
	}
	refused := 0
	for _, host := range foreign {
		for _, e := range endpoints {
			code, body := rawRequest(t, addr, e.method, e.path, host)
			if code != http.StatusMisdirectedRequest {
				t.Errorf("%s %s with Host %q: %d, want 421", e.method, e.path, host, code)
				continue
			}
			refused++
			if strings.Contains(body, "secret-route") || strings.Contains(body, "sidecar_") || host != "" && strings.Contains(body, host) {
				t.Errorf("%s %s with Host %q: refusal body says too much: %q", e.method, e.path, host, body)
			}
		}
	}
	if n := reloads.Load(); n != 0 {
		t.Errorf("reload ran %d times for foreign hosts", n)
	}
	local := "127.0.0.1:" + port
	code, body := rawRequest(t, addr, "GET", "/metrics", local)
	if want := fmt.Sprintf(`sidecar_admin_refused_total{reason="host"} %d`, refused); code != 200 || !strings.Contains(body, want) {
		t.Errorf("/metrics %d lacks %q", code, want)
	}
	code, body = rawRequest(t, addr, "GET", "/status", local)
	var st Status
	if err := json.Unmarshal([]byte(body), &st); err != nil || code != 200 {
		t.Fatalf("/status %d %q: %v", code, body, err)
	}
	var doc map[string]map[string]any
	_ = json.Unmarshal([]byte(body), &doc)
	if got := doc["admin"]["refused_host"]; got != float64(refused) {
		t.Errorf("/status admin.refused_host %v, want %d", got, refused)
	}
}

// TestLocalHostsAllowed: IP literals (v4, or v6 in brackets), localhost
// and the configured names, with or without a port, reach every endpoint.
func TestLocalHostsAllowed(t *testing.T) {
	addr, reloads := hostFixture(t, func(c *Config) { c.AllowedHosts = []string{"Admin.Internal", "sidecar-0.sidecar"} })
	_, port, _ := net.SplitHostPort(addr)
	allowed := []string{
		"127.0.0.1:" + port, "127.0.0.1", "10.1.2.3:9901",
		"localhost", "localhost:" + port, "LocalHost:1", "localhost.",
		"[::1]", "[::1]:" + port, "[fe80::1]:9901", "[::ffff:127.0.0.1]",
		"admin.internal", "ADMIN.internal:" + port, "admin.internal.", "sidecar-0.sidecar:9901",
	}
	for _, host := range allowed {
		for _, e := range endpoints {
			if code, body := rawRequest(t, addr, e.method, e.path, host); code != 200 {
				t.Errorf("%s %s with Host %q: %d %q", e.method, e.path, host, code, body)
			}
		}
	}
	if n := reloads.Load(); n != int64(len(allowed)) {
		t.Errorf("reload ran %d times, want %d", n, len(allowed))
	}
	// Only the names listed: not their subdomains, not their parents.
	for _, host := range []string{"x.admin.internal", "internal", "sidecar-0", "admin.internal.evil.example"} {
		if code, _ := rawRequest(t, addr, "GET", "/status", host); code != http.StatusMisdirectedRequest {
			t.Errorf("Host %q: %d, want 421", host, code)
		}
	}
}

func TestAllowedHostsValidation(t *testing.T) {
	for _, bad := range []string{"", "admin.internal:9901", "127.0.0.1", "[::1]", "*.example.com", "a b", "-", "http://x"} {
		if _, err := New(Config{AllowedHosts: []string{bad}}); err == nil {
			t.Errorf("allowed host %q accepted", bad)
		}
	}
	if _, err := New(Config{AllowedHosts: []string{"admin.internal", "Sidecar.Example.COM."}}); err != nil {
		t.Errorf("valid allowed hosts: %v", err)
	}
}

// TestAllowedHostsConfigKey: admin.allowed_hosts in the configuration file,
// checked with the rest of the file.
func TestAllowedHostsConfigKey(t *testing.T) {
	c, err := config.Parse([]byte(goodConfig + "admin:\n  allowed_hosts: [admin.internal, sidecar.example.com]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(c.Admin.AllowedHosts) != "[admin.internal sidecar.example.com]" {
		t.Errorf("allowed_hosts %v", c.Admin.AllowedHosts)
	}
	for bad, want := range map[string]string{
		"[admin.internal:9901]":  `admin.allowed_hosts[0]: "admin.internal:9901" is not a host name`,
		"[ok.example, 10.0.0.1]": `admin.allowed_hosts[1]: "10.0.0.1" is not a host name`,
		"['*.example.com']":      `admin.allowed_hosts[0]: "*.example.com" is not a host name`,
	} {
		_, err := config.Parse([]byte(goodConfig + "admin:\n  allowed_hosts: " + bad + "\n"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("allowed_hosts %s: %v, want %q", bad, err, want)
		}
	}
}

// TestHostRefusalLogLimited: a burst of refused requests is counted in
// full but logged at most once per refuseLogEvery.
func TestHostRefusalLogLimited(t *testing.T) {
	var logs testutil.LogBuffer
	addr, _ := hostFixture(t, func(c *Config) { c.Log = zerolog.New(&logs) })
	began := time.Now()
	const n = 50
	for range n {
		if code, _ := rawRequest(t, addr, "GET", "/status", "evil.example"); code != http.StatusMisdirectedRequest {
			t.Fatalf("refused with %d", code)
		}
	}
	elapsed := time.Since(began)
	lines := strings.Count(logs.String(), "admin request refused")
	if limit := 1 + int(elapsed/refuseLogEvery); lines < 1 || lines > limit {
		t.Errorf("%d log lines for %d refusals in %v, want 1..%d", lines, n, elapsed, limit)
	}
	if !strings.Contains(logs.String(), `"host":"evil.example"`) {
		t.Errorf("log does not name the host: %s", logs.String())
	}
	_, body := rawRequest(t, addr, "GET", "/metrics", "localhost")
	if want := fmt.Sprintf(`sidecar_admin_refused_total{reason="host"} %d`, n); !strings.Contains(body, want) {
		t.Errorf("/metrics lacks %q", want)
	}
}

// TestErrorLogLimited: net/http's error lines (an accept retry every
// second while descriptors are exhausted, one per broken connection) reach
// the log at most once per refuseLogEvery, the next line carrying the
// count of those dropped.
func TestErrorLogLimited(t *testing.T) {
	var buf bytes.Buffer
	l := &limitedLog{log: zerolog.New(&buf)}
	for i := 0; i < 50; i++ {
		if _, err := fmt.Fprintf(l, "http: Accept error: accept tcp: too many open files; retrying in 1s\n"); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(buf.String(), "\n"); n != 1 {
		t.Fatalf("%d lines after 50 writes, want 1:\n%s", n, buf.String())
	}
	if strings.Contains(buf.String(), "suppressed") || !strings.Contains(buf.String(), `"message":"http: Accept error`) {
		t.Fatalf("first line %q", buf.String())
	}
	l.limit.mu.Lock()
	l.limit.next = time.Now().Add(-time.Second) // the window ended
	l.limit.mu.Unlock()
	buf.Reset()
	fmt.Fprintf(l, "http: TLS handshake error\n")
	if !strings.Contains(buf.String(), `"suppressed":49`) {
		t.Fatalf("line after the window %q, want the 49 dropped counted", buf.String())
	}
}
