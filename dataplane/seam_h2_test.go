package dataplane_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/dataplane/internal/exchange"
	upstreampkg "github.com/zentinelproxy/sidecar/dataplane/internal/upstream"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// The exchange's front seam on a second HTTP engine: net/http's HTTP/2
// server, one handler call per stream, a ResponseWriter with Flush, the
// request's context for disconnects, no hijack. h2Front is all a front
// end on that engine needs; the core is the one the HTTP/1 front end
// drives.

// h2Front is one HTTP/2 stream's exchange.
type h2Front struct {
	ex   exchange.Exchange
	w    http.ResponseWriter
	r    *http.Request
	conn exchange.Conn
	body h2Body
}

var h2Fronts = sync.Pool{New: func() any {
	f := new(h2Front)
	f.ex.Init(f)
	return f
}}

func (f *h2Front) Conn() *exchange.Conn { return &f.conn }
func (f *h2Front) Gone() bool           { return f.r.Context().Err() != nil }
func (f *h2Front) TunnelRoom() bool     { return false }
func (f *h2Front) Tunnel(*exchange.Tunnel) error {
	return exchange.ErrNoTunnel
}

func (f *h2Front) Body() exchange.Source {
	f.body = h2Body{r: f.r.Body}
	return &f.body
}

// h2Body is a request body of net/http: no buffer to look into, deadlines
// left to the server (a stream's end is an io.EOF, its reset an error).
type h2Body struct{ r io.Reader }

func (b *h2Body) Read(p []byte) (int, error)  { return b.r.Read(p) }
func (b *h2Body) Pending() bool               { return false }
func (b *h2Body) Buffered(int64) bool         { return true }
func (b *h2Body) ExtendRead()                 {}
func (b *h2Body) SetReadDeadline(_ time.Time) {}
func (b *h2Body) Truncated() bool             { return false }

// serveH2 is the handler: the head from the request, the exchange, the
// response it staged written out (a streamed body flushed piece by piece).
func serveH2(core *exchange.Core, lst *exchange.Listener) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f := h2Fronts.Get().(*h2Front)
		f.w, f.r = w, r
		f.conn = exchange.Conn{Listener: lst}
		if ap, err := netipAddrPort(r.RemoteAddr); err == nil {
			f.conn.ClientIP, f.conn.ClientPort = []byte(ap.Host), ap.Port
		}
		ex := &f.ex
		core.Begin(ex, time.Now())
		h := ex.Head()
		h.Method, h.Target, h.Path = []byte(r.Method), []byte(r.RequestURI), []byte(r.URL.Path)
		h.Proto, h.Host, h.HTTP11 = []byte(r.Proto), []byte(r.Host), true
		h.ContentLength = r.ContentLength
		if r.ContentLength < 0 {
			h.ContentLength = -1
		}
		keys := make([]string, 0, len(r.Header))
		for k := range r.Header {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		h.Fields = h.Fields[:0]
		for _, k := range keys {
			for _, v := range r.Header[k] {
				h.Fields = append(h.Fields, exchange.Field{Name: []byte(k), Value: []byte(v)})
			}
		}
		ex.Serve()
		res := ex.Response()
		if res.Kind != exchange.ResponseNone {
			for _, fl := range res.Fields {
				if !strings.EqualFold(string(fl.Name), "content-length") {
					w.Header().Add(string(fl.Name), string(fl.Value))
				}
			}
			w.WriteHeader(res.Status)
		}
		switch res.Kind {
		case exchange.ResponseFull:
			_, _ = w.Write(res.Body)
		case exchange.ResponseStream:
			var written int64
			var err error
			for {
				data, last, nerr := ex.NextBody()
				if nerr != nil {
					err = nerr
					break
				}
				n, werr := w.Write(data)
				written += int64(n)
				if werr != nil {
					err = werr
					break
				}
				w.(http.Flusher).Flush()
				if last {
					break
				}
			}
			ex.StreamDone(written, err)
		}
		ex.Finish()
		f.w, f.r = nil, nil
		h2Fronts.Put(f)
	}
}

type hostPort struct {
	Host string
	Port int
}

func netipAddrPort(s string) (hostPort, error) {
	ta, err := net.ResolveTCPAddr("tcp", s)
	if err != nil {
		return hostPort{}, err
	}
	return hostPort{Host: ta.IP.String(), Port: ta.Port}, nil
}

// TestSeamHTTP2Front: a front end on net/http's HTTP/2 server drives the
// exchange core unchanged: an agent's block answered over HTTP/2, a
// request body buffered for the agent and forwarded to the HTTP/1
// upstream, a large response body streamed and flushed as it comes.
func TestSeamHTTP2Front(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			w.Header().Set("Content-Type", "application/octet-stream")
			_, _ = w.Write(big)
			return
		}
		body, _ := io.ReadAll(r.Body)
		_, _ = w.Write(append([]byte("echo:"), body...))
	})
	var seen sync.Map // path → request body the agent saw
	caps := headersOnly()
	caps.HandlesRequestBody = true
	path := serveAgent(t, &agentFuncs{Base: sdk.Base{Caps: caps},
		reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
			if strings.HasPrefix(string(m.URI), "/admin") {
				d.Kind, d.Status, d.Body = protocol.DecisionBlock, 403, []byte("no")
			}
			return nil
		},
		reqBody: func(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
			seen.Store("body", string(m.Data))
			r.Pass()
			return nil
		},
	})
	cfg := configText(t, oneAgentConfig, map[string]any{"Upstream": up.addr(), "Chain": "a",
		"Agents": map[string]agentSpec{"a": {Path: path, ReqMode: "buffered"}}})
	agents := map[string]agentmux.Agent{"a": udsAgent(t, "a", path, nil)}

	core := exchange.NewCore(nil, zerolog.Nop())
	var counters upstreampkg.Counters
	u := upstreampkg.New(cfg.Upstreams[0], nil, &counters)
	tbl, err := exchange.BuildTable(cfg, agents, []exchange.Upstream{u}, nil)
	if err != nil {
		t.Fatal(err)
	}
	core.Publish(tbl)
	t.Cleanup(func() { u.CloseIdle(); _ = agents["a"].Close() })
	lst := &exchange.Listener{Name: []byte("h2"), TLS: true, BodyTimeout: time.Minute}

	srv := httptest.NewUnstartedServer(serveH2(core, lst))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	client := srv.Client()
	client.Timeout = hangGuard

	get := func(method, path, body string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s %s: reading the body: %v", method, path, err)
		}
		if resp.ProtoMajor != 2 {
			t.Fatalf("%s %s over %s, want HTTP/2", method, path, resp.Proto)
		}
		return resp, string(b)
	}

	if resp, body := get("GET", "/admin/x", ""); resp.StatusCode != 403 || body != "no" {
		t.Errorf("blocked request: %d %q, want 403 \"no\"", resp.StatusCode, body)
	}
	if up.count() != 0 {
		t.Errorf("a blocked request reached the upstream")
	}
	if resp, body := get("POST", "/form", "a=1&b=2"); resp.StatusCode != 200 || body != "echo:a=1&b=2" {
		t.Errorf("POST: %d %q", resp.StatusCode, body)
	}
	if got, _ := seen.Load("body"); got != "a=1&b=2" {
		t.Errorf("the agent saw the body %q", got)
	}
	if got := up.last(t); got.Method != "POST" || string(got.Body) != "a=1&b=2" || got.Header.Get("X-Forwarded-Proto") != "https" {
		t.Errorf("upstream got %s %q X-Forwarded-Proto %q", got.Method, got.Body, got.Header.Get("X-Forwarded-Proto"))
	}
	if resp, body := get("GET", "/big", ""); resp.StatusCode != 200 || body != string(big) || resp.Header.Get("Content-Type") != "application/octet-stream" {
		t.Errorf("streamed body: %d, %d bytes (want %d), type %q", resp.StatusCode, len(body), len(big), resp.Header.Get("Content-Type"))
	}
}
