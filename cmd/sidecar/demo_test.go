package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// startDemo runs the demo in-process on free ports and returns its
// addresses; the demo stops (and must return nil) when the test ends.
func startDemo(t *testing.T, transport string) demoAddrs {
	t.Helper()
	return startDemoWith(t, demoOptions{Transport: transport}, nil)
}

// startDemoWith is startDemo with o's agent and transport; ready (which
// may be nil) sees the addresses first.
func startDemoWith(t *testing.T, o demoOptions, ready func(demoAddrs)) demoAddrs {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	readyc := make(chan demoAddrs, 1)
	done := make(chan error, 1)
	o.Listen, o.LogLevel = "127.0.0.1:0", "warn"
	o.Log = zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
	go func() {
		done <- runDemo(ctx, o, func(a demoAddrs) {
			if ready != nil {
				ready(a)
			}
			readyc <- a
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("demo returned %v after cancel", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("demo did not stop")
		}
	})
	select {
	case a := <-readyc:
		return a
	case err := <-done:
		t.Fatalf("demo failed to start: %v", err)
	case <-time.After(30 * time.Second): // the WAF's rules take a while to load
		t.Fatal("demo not ready")
	}
	return demoAddrs{}
}

var noRedirects = &http.Client{
	Timeout: 10 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	},
}

func get(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("User-Agent", "curl/8.0")
	resp, err := noRedirects.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading body: %v", url, err)
	}
	return resp, string(b)
}

func TestDemo(t *testing.T) {
	for _, transport := range []string{"uds", "grpc", "reverse"} {
		t.Run(transport, func(t *testing.T) {
			a := startDemo(t, transport)
			base := "http://" + a.Sidecar

			// Allowed: the upstream sees the headers the agent added.
			resp, body := get(t, base+"/hello?x=1")
			if resp.StatusCode != 200 {
				t.Fatalf("/hello: %d %s", resp.StatusCode, body)
			}
			var echo echoReply
			if err := json.Unmarshal([]byte(body), &echo); err != nil {
				t.Fatalf("/hello: %v in %s", err, body)
			}
			if echo.URI != "/hello?x=1" || first(echo.Headers["x-demo"]) != "1" || first(echo.Headers["x-client-class"]) != "cli" {
				t.Fatalf("/hello: upstream saw %+v", echo)
			}
			if got := resp.Header.Get("X-Inspected-By"); got != "demoagent" {
				t.Errorf("/hello: X-Inspected-By = %q", got)
			}

			// Blocked: 403, JSON body, marker header.
			resp, body = get(t, base+"/admin/settings")
			if resp.StatusCode != 403 || resp.Header.Get("X-Blocked-By") != "demoagent" ||
				resp.Header.Get("Content-Type") != "application/json" || !strings.Contains(body, `"forbidden"`) {
				t.Fatalf("/admin: %d %v %s", resp.StatusCode, resp.Header, body)
			}

			// Redirected.
			resp, _ = get(t, base+"/old/page?q=2")
			if resp.StatusCode != 302 || resp.Header.Get("Location") != "/new/page?q=2" {
				t.Fatalf("/old/page: %d Location %q", resp.StatusCode, resp.Header.Get("Location"))
			}

			// Redacted, also where the upstream splits the word.
			for _, path := range []string{"/page", "/page?repeat=300"} {
				resp, body = get(t, base+path)
				if resp.StatusCode != 200 {
					t.Fatalf("%s: %d", path, resp.StatusCode)
				}
				_, direct := get(t, "http://"+a.Upstream+path)
				if n := strings.Count(strings.ToLower(body), "secret"); n != 0 {
					t.Errorf("%s: %d unredacted occurrences", path, n)
				}
				want := strings.Count(strings.ToLower(direct), "secret")
				if n := strings.Count(body, "******"); n != want || len(body) != len(direct) {
					t.Errorf("%s: %d masked of %d, %d bytes of %d", path, n, want, len(body), len(direct))
				}
			}
		})
	}
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

func TestDemoPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	err = runDemo(context.Background(), demoOptions{Listen: ln.Addr().String(), Log: zerolog.Nop()}, nil)
	if !errors.Is(err, errDemoListen) || !strings.Contains(err.Error(), "-listen 127.0.0.1:0") {
		t.Fatalf("got %v", err)
	}
}

func TestDemoUnknownTransport(t *testing.T) {
	err := runDemo(context.Background(), demoOptions{Listen: "127.0.0.1:0", Transport: "carrier-pigeon", Log: zerolog.Nop()}, nil)
	if !errors.Is(err, errDemoTransport) {
		t.Fatalf("got %v", err)
	}
}
