package edgetest

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// A body's chunks for the agents follow its bytes, not its sender's
// framing: 20,000 one-byte chunks that arrive together are a few agent
// events, not 20,000.

const floodChunks = 20000

// floodBody is the body of n one-byte chunks, and its chunked framing.
func floodBody(n int) (body, framed string) {
	var b, f strings.Builder
	for i := 0; i < n; i++ {
		c := byte('a' + i%26)
		b.WriteByte(c)
		f.WriteString("1\r\n")
		f.WriteByte(c)
		f.WriteString("\r\n")
	}
	f.WriteString("0\r\n\r\n")
	return b.String(), f.String()
}

// unchunk decodes a chunked body (the rest of the message after its head).
func unchunk(t *testing.T, framed string) string {
	t.Helper()
	br := bufio.NewReader(strings.NewReader(framed))
	var out strings.Builder
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("chunked body cut short: %v", err)
		}
		size, err := strconv.ParseInt(strings.TrimRight(line, "\r\n"), 16, 64)
		if err != nil {
			t.Fatalf("bad chunk size line %q", line)
		}
		if size == 0 {
			return out.String()
		}
		data := make([]byte, size+2)
		if _, err := io.ReadFull(br, data); err != nil {
			t.Fatal(err)
		}
		out.Write(data[:size])
	}
}

// countingAgent streams both bodies, passes every chunk and counts them.
type countingAgent struct {
	sdk.Base
	req, resp atomic.Int64
}

func (a *countingAgent) OnRequestBody(_ context.Context, _ *protocol.BodyChunk, r *sdk.BodyReply) error {
	a.req.Add(1)
	r.Pass()
	return nil
}

func (a *countingAgent) OnResponseBody(_ context.Context, _ *protocol.BodyChunk, r *sdk.BodyReply) error {
	a.resp.Add(1)
	r.Pass()
	return nil
}

func TestBodyChunksCoalesced(t *testing.T) {
	dir := testutil.SocketDir(t)
	body, framed := floodBody(floodChunks)
	got := make(chan string, 1)
	up := startScripted(t, func(c net.Conn, raw, target string) bool {
		if target == "/down" {
			_, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"+framed)
			return err == nil
		}
		_, rest, _ := strings.Cut(raw, "\r\n\r\n")
		got <- rest
		_, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return err == nil
	})
	agent := &countingAgent{Base: sdk.Base{Caps: protocol.Capabilities{
		HandlesRequestBody: true, HandlesResponseBody: true, SupportsStreaming: true,
	}}}
	path := agentSocket(dir, "count")
	testagent.Serve(t, path, agent)
	agents := "  - name: count\n    transport: uds\n    address: " + path +
		"\n    failure_mode: closed\n    timeouts: {message: 10s, request: 60s}\n"
	sc := startSidecar(t, dir, plainConfig(up.addr, "", agents, "count"), "")
	waitReady(t, sc)

	t.Run("request", func(t *testing.T) {
		c, err := net.Dial("tcp", sc.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(longWait))
		req := "POST /up HTTP/1.1\r\nHost: public.example\r\nTransfer-Encoding: chunked\r\n\r\n" + framed
		if _, err := io.WriteString(c, req); err != nil { // one write
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: "POST"})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		select {
		case rest := <-got:
			if upBody := unchunk(t, rest); upBody != body {
				t.Fatalf("the upstream got %d bytes, not the %d sent (or not in order)", len(upBody), len(body))
			}
		case <-time.After(longWait):
			t.Fatal("the upstream got no request")
		}
		n := agent.req.Load()
		t.Logf("%d one-byte chunks: %d request body events", floodChunks, n)
		if n < 1 || n > 40 {
			t.Errorf("%d request body events for %d one-byte chunks sent at once, want 1..40", n, floodChunks)
		}
		if v := sc.counter(t, "request_body_reads_joined"); v < floodChunks/2 {
			t.Errorf("request_body_reads_joined %v, want >= %d", v, floodChunks/2)
		}
	})

	t.Run("response", func(t *testing.T) {
		client := &http.Client{Timeout: longWait}
		resp, err := client.Get("http://" + sc.addr + "/down")
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != body {
			t.Fatalf("client got %d bytes (%v), want the %d sent", len(b), err, len(body))
		}
		n := agent.resp.Load()
		t.Logf("%d one-byte chunks: %d response body events", floodChunks, n)
		if n < 1 || n > 40 {
			t.Errorf("%d response body events for %d one-byte chunks sent at once, want 1..40", n, floodChunks)
		}
		if v := sc.counter(t, "response_body_reads_joined"); v < floodChunks/2 {
			t.Errorf("response_body_reads_joined %v, want >= %d", v, floodChunks/2)
		}
	})
}

// TestSlowChunkedStreamNotHeldBack: chunks sent one by one, each waiting
// for the agent to have seen the one before, reach the agent one by one:
// bytes not yet received are never waited for.
func TestSlowChunkedStreamNotHeldBack(t *testing.T) {
	dir := testutil.SocketDir(t)
	seen := make(chan string, 16)
	agent := &streamAgent{seen: seen}
	path := agentSocket(dir, "stream")
	testagent.Serve(t, path, agent)
	up := startScripted(t, func(c net.Conn, _, _ string) bool {
		_, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return err == nil
	})
	agents := "  - name: stream\n    transport: uds\n    address: " + path +
		"\n    failure_mode: closed\n    timeouts: {message: 10s, request: 60s}\n"
	sc := startSidecar(t, dir, plainConfig(up.addr, "", agents, "stream"), "")
	waitReady(t, sc)
	c, err := net.Dial("tcp", sc.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(longWait))
	if _, err := io.WriteString(c, "POST /s HTTP/1.1\r\nHost: public.example\r\nTransfer-Encoding: chunked\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	for _, piece := range []string{"one", "two", "three"} {
		if _, err := io.WriteString(c, strconv.FormatInt(int64(len(piece)), 16)+"\r\n"+piece+"\r\n"); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-seen:
			if got != piece {
				t.Fatalf("the agent saw %q, want %q", got, piece)
			}
		case <-time.After(longWait):
			t.Fatalf("the agent never saw %q: held back waiting for more", piece)
		}
	}
	_, _ = io.WriteString(c, "0\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: "POST"})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

// streamAgent reports each request body chunk it sees.
type streamAgent struct {
	sdk.Base
	seen chan<- string
}

func (a *streamAgent) Capabilities() protocol.Capabilities {
	return protocol.Capabilities{HandlesRequestBody: true, SupportsStreaming: true}
}

func (a *streamAgent) OnRequestBody(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
	if len(m.Data) > 0 {
		a.seen <- string(m.Data)
	}
	r.Pass()
	return nil
}
