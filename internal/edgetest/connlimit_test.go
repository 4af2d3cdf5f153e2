package edgetest

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// TestConnectionLimit: past max_connections a connection is closed
// without a byte (a 503 written right after accept is read by an HTTP
// client as the answer to whatever it sends next, or logged as an
// unsolicited response), counted and logged at a bounded rate. Every
// connection gives its place back exactly once, however it ends: the
// count returns to zero, and the limit admits exactly max_connections
// afterwards. A tunnel leaves the count when it starts (max_tunnels
// bounds it).
func TestConnectionLimit(t *testing.T) {
	env := startLifecycle(t, `  - name: edge
    address: 127.0.0.1:0
    read_timeout: 1s
    max_connections: 4
    lingering_timeout: 1s
  - name: edge-tls
    address: 127.0.0.2:0
    read_timeout: 1s
    max_connections: 2
%[1]s`)
	plain, secure := env.addrs[0], env.addrs[1]
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	hold := func(t *testing.T, n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			c, err := net.Dial("tcp", plain)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
			if st, err := roundTrip(c, bufio.NewReader(c), "/held", "public.example", fmt.Sprintf("held-%d", i)); err != nil || st != 200 {
				t.Fatalf("connection %d of %d: %d %v", i+1, n, st, err)
			}
		}
	}
	refused := func(t *testing.T, addr string) {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, _ = io.WriteString(c, get("/over", "public.example", "over"))
		if err := closedUnanswered(c); err != nil {
			t.Fatalf("connection over max_connections: %v", err)
		}
	}
	release := func(t *testing.T) {
		t.Helper()
		for _, c := range held {
			c.Close()
		}
		held = nil
		testutil.WaitFor(t, "the connections to close", func() bool {
			return connStats(t, env.sc, "edge")["open"] == 0 && connStats(t, env.sc, "edge-tls")["open"] == 0
		})
	}

	t.Run("over the limit: closed unanswered", func(t *testing.T) {
		hold(t, 4)
		refused(t, plain)
		if st := connStats(t, env.sc, "edge"); st["open"] != 4 || st["refused_max_connections"] != 1 {
			t.Fatalf("counters %v, want open 4, refused_max_connections 1", st)
		}
	})
	t.Run("refusals counted, logged at a bounded rate", func(t *testing.T) {
		for i := 0; i < 30; i++ {
			refused(t, plain)
		}
		if v := connStats(t, env.sc, "edge")["refused_max_connections"]; v != 31 {
			t.Errorf("refused_max_connections %v, want 31", v)
		}
		want := `sidecar_connections_refused_total{listener="edge",reason="max_connections"} 31`
		if prom := promText(t, env.sc); !strings.Contains(prom, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, grepLines(prom, "sidecar_connections"))
		}
		lines := 0
		for _, l := range env.sc.log() {
			if strings.Contains(l, "max_connections") && strings.Contains(l, "refused") {
				lines++
				if !strings.Contains(l, `"listener":"edge"`) {
					t.Errorf("refusal line without its listener: %s", l)
				}
			}
		}
		if lines < 1 || lines > 2 {
			t.Errorf("%d refusal lines for 31 refusals, want 1..2", lines)
		}
	})
	t.Run("a closed connection gives its place back", func(t *testing.T) {
		held[0].Close()
		held = held[1:]
		testutil.WaitFor(t, "the closed connection to leave the count", func() bool {
			return connStats(t, env.sc, "edge")["open"] == 3
		})
		hold(t, 1)
		refused(t, plain)
		release(t)
	})

	// Every way a connection ends, several times over; then the count
	// must be back at zero (a double release would make it negative and
	// let more in, a missing one would fill the limit for good).
	t.Run("every end releases once", func(t *testing.T) {
		flows := []struct {
			name string
			f    func() error
		}{
			{"tunnel closed by the client", func() error {
				c, up, err := openTunnelPair(env.tun, plain, "t-client")
				if err != nil {
					return err
				}
				defer up.Close()
				c.Close()
				return closedUnanswered(up)
			}},
			{"tunnel closed by the upstream", func() error {
				c, up, err := openTunnelPair(env.tun, plain, "t-up")
				if err != nil {
					return err
				}
				defer c.Close()
				up.Close()
				return closedUnanswered(c)
			}},
			{"blocked POST with its body unread", func() error {
				st, reset, err := blockedPost(plain, 64<<10)
				switch {
				case reset:
					return errors.New("reset")
				case err == nil && st != 403:
					err = fmt.Errorf("status %d", st)
				}
				return err
			}},
			{"unparsable head", func() error {
				c, err := net.Dial("tcp", plain)
				if err != nil {
					return err
				}
				defer c.Close()
				_ = c.SetReadDeadline(time.Now().Add(longWait))
				_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
				b, err := io.ReadAll(c)
				if err == nil && !strings.HasPrefix(string(b), "HTTP/1.1 400") {
					err = fmt.Errorf("answer %q, want 400", clipText(b))
				}
				return err
			}},
			{"reset by the client mid-head", func() error {
				c, err := net.Dial("tcp", plain)
				if err != nil {
					return err
				}
				_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: pub")
				_ = c.(*net.TCPConn).SetLinger(0)
				return c.Close()
			}},
			{"kept-alive request, closed by the client", func() error {
				c, err := net.Dial("tcp", plain)
				if err != nil {
					return err
				}
				defer c.Close()
				st, err := roundTrip(c, bufio.NewReader(c), "/ka", "public.example", "ka")
				if err == nil && st != 200 {
					err = fmt.Errorf("status %d", st)
				}
				return err
			}},
			{"TLS handshake failure", func() error {
				c, err := net.Dial("tcp", secure)
				if err != nil {
					return err
				}
				defer c.Close()
				_ = c.SetReadDeadline(time.Now().Add(longWait))
				_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: public.example\r\n\r\n")
				_, _ = io.ReadAll(c)
				c.Close()
				// Plain HTTP on the TLS port is answered 400 and closed
				// lingeringly: the place is given back once the sidecar
				// reads the client's close, a moment after the client
				// saw the end. Of edge-tls's two places, at most the idle
				// connection's may still be taken before the next flow.
				testutil.WaitFor(t, "the lingering connection to leave the count", func() bool {
					return connStats(t, env.sc, "edge-tls")["open"] <= 1
				})
				return nil
			}},
			{"TLS request", func() error {
				c, err := tls.Dial("tcp", secure, &tls.Config{RootCAs: env.pki.Pool, ServerName: "edge.example"})
				if err != nil {
					return err
				}
				defer c.Close()
				st, err := roundTrip(c, bufio.NewReader(c), "/tls", "public.example", "tls")
				if err == nil && st != 200 {
					err = fmt.Errorf("status %d", st)
				}
				return err
			}},
		}
		for round := 0; round < 2; round++ {
			// Idle connections (closed at read_timeout) alongside the
			// rest, which runs one at a time: within the limits.
			idle := make(chan error, 2)
			for _, addr := range []string{plain, secure} {
				go func() {
					c, err := net.Dial("tcp", addr)
					if err != nil {
						idle <- err
						return
					}
					defer c.Close()
					idle <- closedUnanswered(c)
				}()
			}
			for _, f := range flows {
				if err := f.f(); err != nil {
					t.Errorf("%s: %v", f.name, err)
				}
			}
			for range 2 {
				if err := <-idle; err != nil {
					t.Errorf("idle until read_timeout: %v", err)
				}
			}
		}
		testutil.WaitFor(t, "every connection to leave the count", func() bool {
			return connStats(t, env.sc, "edge")["open"] == 0 && connStats(t, env.sc, "edge-tls")["open"] == 0
		})
		// A tunnel left the count when it started: it does not hold one
		// of the four places.
		tc, up, err := openTunnelPair(env.tun, plain, "t-held")
		if err != nil {
			t.Fatal(err)
		}
		defer tc.Close()
		defer up.Close()
		hold(t, 4)
		refused(t, plain)
		for i := 0; i < 2; i++ {
			held = append(held, env.tlsDial(t, secure))
		}
		refused(t, secure)
		if st := tunnelStats(t, env.sc); st["open"] != 1.0 {
			t.Errorf("tunnels open %v, want 1", st["open"])
		}
	})
}
