package edgetest

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestIdleConnectionClosedSilently: a connection on which no byte of a
// request arrived is closed at read_timeout (a fresh one) or idle_timeout
// (a kept-alive one) without an answer. A 408 there would be read by a
// client that picks the connection for its next request at that moment,
// as the answer to a request it never sent. A request head that started
// arriving and stalled gets its 408.
func TestIdleConnectionClosedSilently(t *testing.T) {
	env := startLifecycle(t, `  - name: edge
    address: 127.0.0.1:0
    read_timeout: 1s
    idle_timeout: 1s
  - name: edge-tls
    address: 127.0.0.2:0
    read_timeout: 1s
    idle_timeout: 1s
%[1]s`)
	plain, secure := env.addrs[0], env.addrs[1]
	// The rows run in parallel, within a group: the counters follow them.
	t.Run("rows", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			tls  bool
			keep bool   // a request is answered first (the connection is kept alive)
			send string // then these bytes, then silence
			want int    // 0: closed without a byte
		}{
			{name: "fresh connection, no byte", want: 0},
			{name: "kept-alive connection, no byte", keep: true, want: 0},
			{name: "fresh connection, request line started", send: "GET /stalled HT", want: 408},
			{name: "fresh connection, head without its end", send: "GET / HTTP/1.1\r\nHost: public.example\r\n", want: 408},
			{name: "kept-alive connection, next head started", keep: true, send: "GET /next HTTP/1.1\r\n", want: 408},
			{name: "TLS, handshake done, no byte", tls: true, want: 0},
			{name: "TLS, kept-alive, no byte", tls: true, keep: true, want: 0},
			{name: "TLS, request line started", tls: true, send: "GET /", want: 408},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				var c net.Conn
				if tc.tls {
					c = env.tlsDial(t, secure)
				} else {
					var err error
					if c, err = net.Dial("tcp", plain); err != nil {
						t.Fatal(err)
					}
				}
				defer c.Close()
				br := bufio.NewReader(c)
				if tc.keep {
					if st, err := roundTrip(c, br, "/first", "public.example", "idle-first"); err != nil || st != 200 {
						t.Fatalf("first request: %d %v", st, err)
					}
				}
				if tc.send != "" {
					if _, err := io.WriteString(c, tc.send); err != nil {
						t.Fatal(err)
					}
				}
				_ = c.SetReadDeadline(time.Now().Add(longWait))
				if tc.want == 0 {
					if err := closedUnanswered(readerConn{c, br}); err != nil {
						t.Fatal(err)
					}
					return
				}
				resp, err := http.ReadResponse(br, &http.Request{Method: "GET"})
				if err != nil {
					t.Fatalf("want %d: %v", tc.want, err)
				}
				resp.Body.Close()
				if resp.StatusCode != tc.want {
					t.Fatalf("status %d, want %d", resp.StatusCode, tc.want)
				}
			})
		}
	})
	t.Run("counters", func(t *testing.T) {
		rej, _ := env.sc.status(t)["requests"].(map[string]any)["rejected"].(map[string]any)
		if v, _ := rej["timeout"].(float64); v != 4 {
			t.Errorf("rejected[timeout] = %v, want 4 (the stalled heads only)", v)
		}
		for _, l := range []string{"edge", "edge-tls"} {
			if v := connStats(t, env.sc, l)["idle_closed"]; v != 1 {
				t.Errorf("%s: idle_closed %v, want 1 (the fresh connection)", l, v)
			}
		}
		if prom := promText(t, env.sc); !strings.Contains(prom, `sidecar_connections_idle_closed_total{listener="edge"} 1`) {
			t.Errorf("/metrics lacks the idle closes:\n%s", grepLines(prom, "sidecar_connections"))
		}
	})
}
