package dataplane_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/observe"
)

// trailerProxy is a proxy on listeners of HTTP/1.1 and h2c to one
// upstream at addr (upYAML: its protocol).
func trailerProxy(t *testing.T, addr, upYAML string) *proxy {
	t.Helper()
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0", protocols: [http1, h2c]}]
upstreams: [{name: app, address: %q %s}]
routes: [{upstream: app}]
`, addr, upYAML)))
	if err != nil {
		t.Fatal(err)
	}
	return startProxy(t, cfg, nil, nil)
}

// trailerSeen is what an upstream saw of the requests' trailers, by the
// request's path.
type trailerSeen struct {
	mu   sync.Mutex
	seen map[string]http.Header
	body map[string]string
}

func (s *trailerSeen) handler(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body) // r.Trailer is complete after the body
	s.mu.Lock()
	s.seen[r.URL.Path] = r.Trailer.Clone()
	s.body[r.URL.Path] = string(body)
	s.mu.Unlock()
}

func (s *trailerSeen) get(path string) (http.Header, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[path], s.body[path]
}

// h2TrailerRequest sends a POST of "hello" with trailers over h2c to p:
// two that may go on, two RFC 9110 §6.5.1 keeps out (which x/net lets
// through). size: the body's Content-Length (-1: none).
func h2TrailerRequest(t *testing.T, p *proxy, path string, size int64) {
	t.Helper()
	req, err := http.NewRequest("POST", "http://"+p.addr+path, io.NopCloser(strings.NewReader("hello")))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = size
	req.Trailer = http.Header{
		"X-Checksum":      {"abc"},
		"X-Count":         {"3"},
		"X-Forwarded-For": {"6.6.6.6"},
		"Cookie":          {"session=stolen"},
	}
	resp, err := h2cClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%s: status %d", path, resp.StatusCode)
	}
}

func checkTrailers(t *testing.T, what string, got http.Header, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got.Get(k) != v {
			t.Errorf("%s: trailer %s = %q, want %q (all: %v)", what, k, got.Get(k), v, got)
		}
	}
	for _, k := range []string{"X-Forwarded-For", "Cookie", "Forwarded"} {
		if _, ok := got[k]; ok {
			t.Errorf("%s: the refused trailer %s reached the upstream: %v", what, k, got)
		}
	}
}

// TestRequestTrailersForwarded: an HTTP/2 client's request trailers reach
// an h2c upstream as the stream's trailers, and an HTTP/1.1 upstream as
// the trailer section of a chunked body; fields RFC 9110 §6.5.1 keeps
// out of trailers do not; with a Content-Length to an HTTP/1.1 upstream
// (no trailer section) they are dropped. Counted each way.
func TestRequestTrailersForwarded(t *testing.T) {
	for _, tc := range []struct {
		name, upYAML string
		serve        func(*testing.T, http.HandlerFunc) string
	}{
		{"h2c upstream", ", protocol: h2c", h2cServer},
		{"HTTP/1.1 upstream", "", func(t *testing.T, h http.HandlerFunc) string { return newUpstreamRaw(t, h) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := &trailerSeen{seen: map[string]http.Header{}, body: map[string]string{}}
			p := trailerProxy(t, tc.serve(t, seen.handler), tc.upYAML)
			h2TrailerRequest(t, p, "/chunked", -1)
			got, body := seen.get("/chunked")
			if body != "hello" {
				t.Errorf("body %q", body)
			}
			checkTrailers(t, "h2 client", got, map[string]string{"X-Checksum": "abc", "X-Count": "3"})
			st := p.srv.Stats().Trailers
			if st.RequestForwarded != 2 || st.RequestRefused != 2 || st.RequestDropped != 0 {
				t.Errorf("counters %+v, want 2 forwarded and 2 refused", st)
			}

			// An HTTP/1.1 client's chunked body with a trailer section.
			c, err := net.DialTimeout("tcp", p.addr, hangGuard)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(hangGuard))
			_, _ = io.WriteString(c, "POST /h1 HTTP/1.1\r\nHost: app.example\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n"+
				"5\r\nhello\r\n0\r\nX-Checksum: def\r\nForwarded: for=6.6.6.6\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			got, body = seen.get("/h1")
			if resp.StatusCode != 200 || body != "hello" {
				t.Errorf("HTTP/1.1 client: %d %q", resp.StatusCode, body)
			}
			checkTrailers(t, "HTTP/1.1 client", got, map[string]string{"X-Checksum": "def"})

			// With a Content-Length: an HTTP/2 upstream still carries them,
			// an HTTP/1.1 one cannot.
			h2TrailerRequest(t, p, "/sized", 5)
			got, _ = seen.get("/sized")
			st = p.srv.Stats().Trailers
			if tc.upYAML == "" {
				if len(got) != 0 || st.RequestDropped != 4 {
					t.Errorf("Content-Length to HTTP/1.1: trailers %v, counters %+v, want none and 4 dropped", got, st)
				}
			} else {
				checkTrailers(t, "Content-Length to h2c", got, map[string]string{"X-Checksum": "abc", "X-Count": "3"})
			}
		})
	}
}

// readChunked reads a chunked HTTP/1.1 response from br by hand: the
// head, the body and the trailer section, which net/http's client would
// hide in Response.Trailer.
func readChunked(t *testing.T, br *bufio.Reader) (head textproto.MIMEHeader, body string, trailer textproto.MIMEHeader) {
	t.Helper()
	tp := textproto.NewReader(br)
	status, err := tp.ReadLine()
	if err != nil || !strings.HasPrefix(status, "HTTP/1.1 200") {
		t.Fatalf("status line %q: %v", status, err)
	}
	if head, err = tp.ReadMIMEHeader(); err != nil {
		t.Fatal(err)
	}
	if head.Get("Transfer-Encoding") != "chunked" {
		t.Fatalf("response not chunked: %v", head)
	}
	var b strings.Builder
	for {
		line, err := tp.ReadLine()
		if err != nil {
			t.Fatal(err)
		}
		var n int
		if _, err := fmt.Sscanf(line, "%x", &n); err != nil {
			t.Fatalf("chunk size %q: %v", line, err)
		}
		if n == 0 {
			break
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(br, buf); err != nil {
			t.Fatal(err)
		}
		b.Write(buf[:n])
	}
	if trailer, err = tp.ReadMIMEHeader(); err != nil {
		t.Fatal(err)
	}
	return head, b.String(), trailer
}

// TestResponseTrailersToHTTP1Client: an upstream's response trailers (an
// h2c upstream's, gRPC-style; a chunked HTTP/1.1 upstream's) reach an
// HTTP/1.1 client in the trailer section of its chunked response, but a
// field RFC 9110 §6.5.1 keeps out; an HTTP/1.0 client, whose response is
// delimited by the close, gets none, and they count as dropped.
func TestResponseTrailersToHTTP1Client(t *testing.T) {
	handler := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = io.WriteString(w, "payload")
		w.(http.Flusher).Flush() // chunked over HTTP/1.1: no Content-Length
		w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
		w.Header().Set(http.TrailerPrefix+"X-Sum", "42")
		// Refused by the sidecar (fasthttp refuses a chunked body whose
		// trailers hold Set-Cookie and the like outright).
		w.Header().Set(http.TrailerPrefix+"Retry-After", "1")
	}
	for _, tc := range []struct {
		name, upYAML string
		serve        func(*testing.T, http.HandlerFunc) string
	}{
		{"h2c upstream", ", protocol: h2c", h2cServer},
		{"chunked HTTP/1.1 upstream", "", func(t *testing.T, h http.HandlerFunc) string { return newUpstreamRaw(t, h) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := trailerProxy(t, tc.serve(t, handler), tc.upYAML)
			c, err := net.DialTimeout("tcp", p.addr, hangGuard)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(hangGuard))
			br := bufio.NewReader(c)
			for i := range 2 { // the connection stays usable after a trailer section
				_, _ = io.WriteString(c, "GET /t HTTP/1.1\r\nHost: app.example\r\n\r\n")
				_, body, tr := readChunked(t, br)
				if body != "payload" || tr.Get("Grpc-Status") != "0" || tr.Get("X-Sum") != "42" || tr.Get("Retry-After") != "" {
					t.Errorf("response %d: body %q, trailers %v", i, body, tr)
				}
			}
			st := p.srv.Stats().Trailers
			if st.ResponseForwarded != 4 || st.ResponseRefused != 2 {
				t.Errorf("counters %+v, want 4 forwarded and 2 refused", st)
			}

			// HTTP/1.0: the body ends with the connection, no trailers.
			c2, err := net.DialTimeout("tcp", p.addr, hangGuard)
			if err != nil {
				t.Fatal(err)
			}
			defer c2.Close()
			_ = c2.SetDeadline(time.Now().Add(hangGuard))
			_, _ = io.WriteString(c2, "GET /t HTTP/1.0\r\nHost: app.example\r\n\r\n")
			raw, _ := io.ReadAll(c2)
			if !strings.HasSuffix(string(raw), "\r\n\r\npayload") || strings.Contains(string(raw), "X-Sum") {
				t.Errorf("HTTP/1.0 response: %q", raw)
			}
			waitTrailerStats(t, p, func(st observe.TrailerStats) bool { return st.ResponseDropped == 3 })
		})
	}
}

func waitTrailerStats(t *testing.T, p *proxy, ok func(observe.TrailerStats) bool) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for {
		st := p.srv.Stats().Trailers
		if ok(st) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("trailer counters %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRequestTrailersNoSidecarMarkers: a client cannot speak for the
// sidecar in a trailer section either: X-Sidecar-* trailers (and their
// names in the Trailer list) never reach the upstream, from an HTTP/1.1
// chunked body or an HTTP/2 stream; they are counted as refused.
func TestRequestTrailersNoSidecarMarkers(t *testing.T) {
	seen := &trailerSeen{seen: map[string]http.Header{}, body: map[string]string{}}
	p := trailerProxy(t, newUpstreamRaw(t, seen.handler), "")
	c, err := net.DialTimeout("tcp", p.addr, hangGuard)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(hangGuard))
	_, _ = io.WriteString(c, "POST /h1 HTTP/1.1\r\nHost: app.example\r\nTransfer-Encoding: chunked\r\n"+
		"Trailer: X-Sidecar-Inspection, X-Checksum\r\n\r\n"+
		"5\r\nhello\r\n0\r\nX-Sidecar-Inspection: skipped\r\nx-sidecar-fail-open: true\r\nX-Checksum: def\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	got, body := seen.get("/h1")
	if resp.StatusCode != 200 || body != "hello" {
		t.Fatalf("HTTP/1.1 client: %d %q", resp.StatusCode, body)
	}
	if got.Get("X-Checksum") != "def" {
		t.Errorf("X-Checksum did not reach the upstream: %v", got)
	}
	for k := range got {
		if strings.HasPrefix(strings.ToLower(k), "x-sidecar-") {
			t.Errorf("the client's trailer %s reached the upstream: %v", k, got)
		}
	}

	req, err := http.NewRequest("POST", "http://"+p.addr+"/h2", io.NopCloser(strings.NewReader("hello")))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = -1
	req.Trailer = http.Header{"X-Sidecar-Inspection": {"skipped"}, "X-Checksum": {"abc"}}
	resp, err = h2cClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	got, _ = seen.get("/h2")
	if got.Get("X-Checksum") != "abc" {
		t.Errorf("h2: X-Checksum did not reach the upstream: %v", got)
	}
	if _, ok := got["X-Sidecar-Inspection"]; ok {
		t.Errorf("h2: the client's trailer X-Sidecar-Inspection reached the upstream: %v", got)
	}
	if st := p.srv.Stats().Trailers; st.RequestRefused != 3 {
		t.Errorf("refused %d, want 3 (%+v)", st.RequestRefused, st)
	}
}
