package edgetest

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// The sidecar answers in its own HTTP version, and never with chunked
// framing to a client that did not speak HTTP/1.1.

const http10Body = "hello from an HTTP/1.0 upstream"

// http10Upstream answers like python3 -m http.server: an HTTP/1.0 status
// line, no Content-Length, the body delimited by closing.
func http10Upstream(t *testing.T) *scriptedUpstream {
	return startScripted(t, func(c net.Conn, _, _ string) bool {
		_, _ = io.WriteString(c, "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n"+http10Body)
		return false
	})
}

// respBodyAgent is a streaming agent that passes every response chunk.
func respBodyAgent(t *testing.T, dir string) string {
	caps := protocol.Capabilities{HandlesRequestHeaders: true, HandlesResponseBody: true, SupportsStreaming: true}
	path := agentSocket(dir, "respbody")
	testagent.Serve(t, path, sdk.Base{Caps: caps})
	return "  - name: respbody\n    transport: uds\n    address: " + path + "\n    failure_mode: closed\n    timeouts: {message: 5s, request: 10s}\n"
}

// splitResponse splits what the sidecar sent on a closed connection into
// its head lines (the status line first) and body.
func splitResponse(t *testing.T, raw string) ([]string, string) {
	t.Helper()
	head, body, ok := strings.Cut(raw, "\r\n\r\n")
	if !ok {
		t.Fatalf("no complete head in %q", raw)
	}
	return strings.Split(head, "\r\n"), body
}

func hasHeader(lines []string, name string) bool {
	for _, l := range lines[1:] {
		if k, _, ok := strings.Cut(l, ":"); ok && strings.EqualFold(strings.TrimSpace(k), name) {
			return true
		}
	}
	return false
}

// TestHTTP10UpstreamResponseBodyAgent: an HTTP/1.0 upstream's close-
// delimited body streamed through a response-body agent. An HTTP/1.1
// client gets an HTTP/1.1 status line on the chunked body (it reads the
// framing and keeps the connection); an HTTP/1.0 client gets the body
// close-delimited, without chunked framing.
func TestHTTP10UpstreamResponseBodyAgent(t *testing.T) {
	dir := testutil.SocketDir(t)
	up := http10Upstream(t)
	agents := respBodyAgent(t, dir)
	sc := startSidecar(t, dir, plainConfig(up.addr, "", agents, "respbody"), "")
	waitReady(t, sc)

	t.Run("HTTP/1.1 client", func(t *testing.T) {
		c, err := net.Dial("tcp", sc.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(longWait))
		br := bufio.NewReader(c)
		for i := 0; i < 2; i++ { // the connection stays usable
			if _, err := io.WriteString(c, "GET /page HTTP/1.1\r\nHost: public.example\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(br, &http.Request{Method: "GET"})
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			if resp.Proto != "HTTP/1.1" {
				t.Errorf("request %d: status line in %s, want HTTP/1.1", i, resp.Proto)
			}
			// An HTTP/1.0 status line would make the reader take the
			// chunk framing for the body and wait for a close.
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || string(body) != http10Body {
				t.Fatalf("request %d: body %q (%v), want %q", i, body, err, http10Body)
			}
		}
	})

	t.Run("HTTP/1.0 client", func(t *testing.T) {
		raw, closed := rawExchange(t, sc.addr, "GET /page HTTP/1.0\r\nHost: public.example\r\n\r\n", 5*time.Second)
		lines, body := splitResponse(t, raw)
		if !strings.HasPrefix(lines[0], "HTTP/1.1 200") {
			t.Errorf("status line %q, want HTTP/1.1 200", lines[0])
		}
		if hasHeader(lines, "transfer-encoding") {
			t.Errorf("Transfer-Encoding sent to an HTTP/1.0 client:\n%s", raw)
		}
		if body != http10Body {
			t.Errorf("body %q, want %q", body, http10Body)
		}
		if !closed {
			t.Error("connection left open: a close-delimited body never ends")
		}
	})
}

// TestHTTP10ClientStreamedBody: without agents, a chunked upstream body
// (length unknown) reaches an HTTP/1.0 client close-delimited.
func TestHTTP10ClientStreamedBody(t *testing.T) {
	up := startScripted(t, func(c net.Conn, _, _ string) bool {
		_, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
		if err != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond) // two pieces: streamed, not buffered whole
		_, err = io.WriteString(c, "6\r\n world\r\n0\r\n\r\n")
		return err == nil
	})
	sc := startSidecar(t, t.TempDir(), plainConfig(up.addr, "", "", ""), "")
	raw, closed := rawExchange(t, sc.addr, "GET /stream HTTP/1.0\r\nHost: public.example\r\n\r\n", 5*time.Second)
	lines, body := splitResponse(t, raw)
	if !strings.HasPrefix(lines[0], "HTTP/1.1 200") {
		t.Errorf("status line %q, want HTTP/1.1 200", lines[0])
	}
	if hasHeader(lines, "transfer-encoding") {
		t.Errorf("Transfer-Encoding sent to an HTTP/1.0 client:\n%s", raw)
	}
	if body != "hello world" {
		t.Errorf("body %q, want %q", body, "hello world")
	}
	if !closed {
		t.Error("connection left open: a close-delimited body never ends")
	}
}
