package edgetest

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// An HTTP/1.1 connection carries one response per request, in order: a
// byte the upstream sends that no request asked for ends the connection.
// Were it pooled, the next request on it would be answered with those
// bytes, and every later one with the answer to the one before.

// idUpstream answers GET /id/N with the body "id=N"; with extra, it then
// sends a second, unsolicited response on the same connection, after
// delay (0: in the same write), and reports N on sent once it is out.
func idUpstream(t *testing.T, delay time.Duration, sent chan<- string) *scriptedUpstream {
	return startScripted(t, func(c net.Conn, _, target string) bool {
		id := strings.TrimPrefix(target, "/id/")
		resp := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\nid=%s", len(id)+3, id)
		extra := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\nunsolicited-%s", len(id)+12, id)
		if delay == 0 {
			_, err := io.WriteString(c, resp+extra)
			sent <- id
			return err == nil
		}
		if _, err := io.WriteString(c, resp); err != nil {
			return false
		}
		time.Sleep(delay)
		_, err := io.WriteString(c, extra)
		sent <- id
		return err == nil
	})
}

// getID sends GET /id/<id> on a fresh client connection and returns the
// status and body.
func getID(t *testing.T, addr, id string) (int, string) {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: longWait}).Get("http://" + addr + "/id/" + id)
	if err != nil {
		t.Fatalf("request %s: %v", id, err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("request %s: reading body: %v", id, err)
	}
	return resp.StatusCode, string(body)
}

// TestUnsolicitedResponseLate: the upstream sends a second response 50 ms
// after each valid one, while the connection sits in the pool. Every
// client, each on a fresh connection, gets its own answer: the pooled
// connection is found readable before the next request is written on it,
// and closed.
func TestUnsolicitedResponseLate(t *testing.T) {
	sent := make(chan string, 64)
	up := idUpstream(t, 50*time.Millisecond, sent)
	sc := startSidecar(t, t.TempDir(), plainConfig(up.addr, "", "", ""), "")
	const n = 8
	for i := 0; i < n; i++ {
		id := fmt.Sprint(i)
		status, body := getID(t, sc.addr, id)
		if status != 200 || body != "id="+id {
			t.Errorf("client %s got %d %q, want 200 %q", id, status, body, "id="+id)
		}
		select {
		case <-sent:
		case <-time.After(longWait):
			t.Fatal("the upstream never sent its extra response")
		}
		// The extra response is written: let it reach the sidecar's
		// socket, where the connection lies idle in the pool.
		time.Sleep(10 * time.Millisecond)
	}
	if v := sc.counter(t, "upstream_discarded_unsolicited"); v < 1 {
		t.Errorf("upstream_discarded_unsolicited %v, want >= 1", v)
	}
	if got := up.accepted(); got < n/2 {
		t.Errorf("%d upstream connections for %d requests: the poisoned ones were reused", got, n)
	}
}

// TestUnsolicitedResponseSameWrite: the extra response comes in the same
// write as the valid one, so it is read into the connection's buffer with
// it: bytes past the end of a response end the connection.
func TestUnsolicitedResponseSameWrite(t *testing.T) {
	sent := make(chan string, 64)
	up := idUpstream(t, 0, sent)
	sc := startSidecar(t, t.TempDir(), plainConfig(up.addr, "", "", ""), "")
	const n = 6
	for i := 0; i < n; i++ {
		id := fmt.Sprint(i)
		status, body := getID(t, sc.addr, id)
		if status != 200 || body != "id="+id {
			t.Errorf("client %s got %d %q, want 200 %q", id, status, body, "id="+id)
		}
		<-sent
	}
	if v := sc.counter(t, "upstream_discarded_unsolicited"); v < 1 {
		t.Errorf("upstream_discarded_unsolicited %v, want >= 1", v)
	}
}

// TestPooledConnClosedIdle: an upstream that closes keep-alive connections
// idle for 20 ms, without saying so in its answers. The closed pooled
// connection is found at once before a request is written on it
// (counted), and every request is answered.
func TestPooledConnClosedIdle(t *testing.T) {
	up := startScripted(t, func(c net.Conn, _, target string) bool {
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
			return false
		}
		// Close once idle: the next request would arrive within 20 ms.
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		return true
	})
	sc := startSidecar(t, t.TempDir(), plainConfig(up.addr, "", "", ""), "")
	for i := 0; i < 5; i++ {
		status, body := getID(t, sc.addr, fmt.Sprint(i))
		if status != 200 || body != "ok" {
			t.Fatalf("request %d: %d %q, want 200 ok", i, status, body)
		}
		time.Sleep(60 * time.Millisecond)
	}
	if v := sc.counter(t, "upstream_discarded_closed"); v < 1 {
		t.Errorf("upstream_discarded_closed %v, want >= 1", v)
	}
}
