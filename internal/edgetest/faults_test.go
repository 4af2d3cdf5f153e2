package edgetest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
)

// TestSlowUpstreamAndLongDownload: read_timeout bounds reading a request
// head, never the response. With read_timeout 1s, an upstream that answers
// after 2.5s and a download that takes 3s both complete in full (the
// production case: 15s / a 400 MB download against a 10s read_timeout).
func TestSlowUpstreamAndLongDownload(t *testing.T) {
	env := startEdge(t)
	client := &http.Client{Timeout: longWait}
	t.Run("slow upstream", func(t *testing.T) {
		resp, err := client.Get("http://" + env.sc.addr + "/slow?ms=2500")
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || string(body) != "slow-ok" {
			t.Fatalf("got %d %q (%v), want 200 slow-ok", resp.StatusCode, body, err)
		}
	})
	t.Run("long download", func(t *testing.T) {
		const kb = 8 << 10 // 8 MiB over 3 s
		resp, err := client.Get(fmt.Sprintf("http://%s/download?kb=%d&ms=3000", env.sc.addr, kb))
		if err != nil {
			t.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || n != kb<<10 {
			t.Fatalf("downloaded %d of %d bytes: %v", n, kb<<10, err)
		}
	})
	if v := env.sc.counter(t, "client_gone"); v != 0 {
		t.Errorf("client_gone %v: a connected client was taken for gone", v)
	}
}

// TestUpstreamRestart: after the upstream restarts, the sidecar's pool
// holds dead keep-alive connections. Idempotent requests that fail on one
// before any response byte are retried on a fresh connection: none fails.
func TestUpstreamRestart(t *testing.T) {
	env := startEdge(t)
	// Warm the pool with 40 connections: 40 concurrent slow requests.
	var wg sync.WaitGroup
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr, Timeout: longWait}).Get("http://" + env.sc.addr + "/slow?ms=300")
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	if n := env.up.accepted(); n < 20 {
		t.Fatalf("pool warmed with only %d upstream connections", n)
	}
	env.up.restart(t)
	// Let the sidecar's end of the dead connections see the FIN.
	time.Sleep(100 * time.Millisecond)
	failed := 0
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: longWait}
	for i := 0; i < 40; i++ {
		resp, err := client.Get(fmt.Sprintf("http://%s/after-restart-%d", env.sc.addr, i))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			failed++
			t.Logf("request %d: %d %q", i, resp.StatusCode, body)
		}
	}
	if failed > 0 {
		t.Fatalf("%d of 40 idempotent requests failed after the upstream restarted", failed)
	}
	if v := env.sc.counter(t, "upstream_stale"); v < 1 {
		t.Errorf("upstream_stale %v, want >= 1", v)
	}
}

// TestFDExhaustion: with RLIMIT_NOFILE at 256, idle connections to the
// admin listener use up the descriptors, so the data listener's accept
// fails with EMFILE. The sidecar backs off and keeps serving: the
// connections it has go on working, and once descriptors free up it
// accepts again. The accept failures are counted and their log line is
// rate-limited.
func TestFDExhaustion(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh to set the descriptor limit")
	}
	dir := testutil.SocketDir(t)
	up := startUpstream(t)
	agent := newPolicyAgent()
	testagent.Serve(t, filepath.Join(dir, "policy.sock"), agent)
	sc := startSidecar(t, dir, edgeConfig(dir, up.addr, "    max_connections: 100"), "ulimit -n 256; exec")

	// A keep-alive connection opened before the exhaustion.
	early, err := net.Dial("tcp", sc.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer early.Close()
	earlyR := bufio.NewReader(early)
	roundTrip := func(c net.Conn, br *bufio.Reader, id string) error {
		_ = c.SetDeadline(time.Now().Add(longWait))
		if _, err := io.WriteString(c, get("/fd", "public.example", id)); err != nil {
			return err
		}
		resp, err := http.ReadResponse(br, &http.Request{Method: "GET"})
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	if err := roundTrip(early, earlyR, "early-1"); err != nil {
		t.Fatal(err)
	}

	// Exhaust: kept-alive connections to the admin listener, more than
	// the descriptors allow. Each sends a request at once, so that
	// net/http holds it for its idle timeout (60s), not its header
	// timeout (5s, which a loaded machine can outlast before the data
	// listener is tried); the ones it cannot accept wait in its queue.
	var hogs []net.Conn
	defer func() {
		for _, c := range hogs {
			c.Close()
		}
	}()
	for i := 0; i < 300; i++ {
		c, err := net.DialTimeout("tcp", sc.admin, time.Second)
		if err != nil {
			break
		}
		hogs = append(hogs, c)
		_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: "+sc.admin+"\r\n\r\n")
	}
	// Only once the admin listener has met the limit are the data
	// connections made: before, the data listener could accept them
	// while descriptors were left (and never fail).
	testutil.WaitFor(t, "the admin listener to run out of descriptors", func() bool {
		for _, line := range sc.log() {
			if strings.Contains(line, `"component":"admin"`) && strings.Contains(line, "too many open files") {
				return true
			}
		}
		return !sc.alive()
	})
	// New data connections are queued by the kernel but cannot be
	// accepted while descriptors are exhausted.
	var pending []net.Conn
	for i := 0; i < 5; i++ {
		c, err := net.DialTimeout("tcp", sc.addr, time.Second)
		if err != nil {
			continue
		}
		pending = append(pending, c)
		go func() { _, _ = io.WriteString(c, get("/fd", "public.example", fmt.Sprintf("queued-%d", i))) }()
	}
	testutil.WaitFor(t, "an accept failure", func() bool {
		for _, line := range sc.log() {
			if strings.Contains(line, "accept failed") {
				return true
			}
		}
		return !sc.alive()
	})
	time.Sleep(500 * time.Millisecond) // several backoff rounds
	if !sc.alive() {
		t.Fatalf("sidecar exited on descriptor exhaustion:\n%s", sc.tail(20))
	}
	// The connection it already had keeps working.
	if err := roundTrip(early, earlyR, "early-2"); err != nil {
		t.Fatalf("existing connection during exhaustion: %v", err)
	}
	// Free the descriptors: the queued connections are accepted and served.
	for _, c := range hogs {
		c.Close()
	}
	hogs = nil
	for i, c := range pending {
		_ = c.SetDeadline(time.Now().Add(longWait))
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: "GET"})
		if err != nil {
			t.Fatalf("queued connection %d: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("queued connection %d: status %d", i, resp.StatusCode)
		}
		c.Close()
	}
	if !sc.alive() {
		t.Fatal("sidecar exited")
	}
	if v := sc.counter(t, "accept_errors"); v < 1 {
		t.Errorf("accept_errors %v, want >= 1", v)
	}
	lines := 0
	for _, line := range sc.log() {
		if strings.Contains(line, "accept failed") {
			lines++
		}
	}
	if lines > 2 {
		t.Errorf("%d accept-failure lines, want them rate-limited", lines)
	}
}
