package dataplane_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// An HTTP/1.0 client never gets chunked framing: a streamed body of
// unknown length goes close-delimited (ctx.Hijack), through the agents
// that stream it, and the request is finished once it is written.
func TestHTTP10ClientCloseDelimited(t *testing.T) {
	caps := protocol.Capabilities{HandlesRequestHeaders: true, HandlesResponseBody: true, SupportsStreaming: true}
	upper := &agentFuncs{Base: sdk.Base{Caps: caps}, respBody: func(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
		r.Replace([]byte(strings.ToUpper(string(m.Data))))
		return nil
	}}
	p, _ := setup(t, func(w http.ResponseWriter, _ *http.Request) {
		for _, s := range []string{"hello ", "from ", "a stream"} {
			_, _ = io.WriteString(w, s)
			w.(http.Flusher).Flush()
			time.Sleep(5 * time.Millisecond)
		}
	}, []string{"a"}, map[string]sdk.Handler{"a": upper}, nil, nil)
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(hangGuard))
		_, _ = io.WriteString(c, "GET / HTTP/1.0\r\nHost: x\r\n\r\n")
		raw, err := io.ReadAll(c) // to the close
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		head, body, _ := strings.Cut(string(raw), "\r\n\r\n")
		if !strings.HasPrefix(head, "HTTP/1.1 200") || strings.Contains(strings.ToLower(head), "transfer-encoding") {
			t.Fatalf("head %q", head)
		}
		if body != "HELLO FROM A STREAM" {
			t.Fatalf("body %q", body)
		}
	}
	// Every request finished: none is left in flight.
	deadline := time.Now().Add(hangGuard)
	for p.srv.Stats().InFlight != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests still in flight", p.srv.Stats().InFlight)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
