package dataplane_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"text/template"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/dataplane"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/uds"
)

// hangGuard bounds waits for things that must happen promptly; it is a
// liveness bound, not a speed assertion.
const hangGuard = 10 * time.Second

// agentFuncs is an sdk.Handler assembled from optional functions; unset
// ones allow (headers) or pass (chunks).
type agentFuncs struct {
	sdk.Base
	reqHeaders  func(ctx context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error
	reqBody     func(ctx context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error
	respHeaders func(ctx context.Context, m *protocol.ResponseHeaders, d *protocol.Decision) error
	respBody    func(ctx context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error
}

func (a *agentFuncs) OnRequestHeaders(ctx context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
	if a.reqHeaders != nil {
		return a.reqHeaders(ctx, m, d)
	}
	return nil
}

func (a *agentFuncs) OnRequestBody(ctx context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
	if a.reqBody != nil {
		return a.reqBody(ctx, m, r)
	}
	r.Pass()
	return nil
}

func (a *agentFuncs) OnResponseHeaders(ctx context.Context, m *protocol.ResponseHeaders, d *protocol.Decision) error {
	if a.respHeaders != nil {
		return a.respHeaders(ctx, m, d)
	}
	return nil
}

func (a *agentFuncs) OnResponseBody(ctx context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
	if a.respBody != nil {
		return a.respBody(ctx, m, r)
	}
	r.Pass()
	return nil
}

func headersOnly() protocol.Capabilities {
	return protocol.Capabilities{HandlesRequestHeaders: true, SupportsCancellation: true}
}

// serveAgent runs h on a fresh Unix socket and returns its path.
func serveAgent(t testing.TB, h sdk.Handler) string {
	t.Helper()
	path := testutil.SocketPath(t)
	testagent.Serve(t, path, h)
	return path
}

// serveAgentUpstreamView is serveAgent for an agent that does not
// declare supports_client_request: it sees the request as the sidecar
// forwards it.
func serveAgentUpstreamView(t testing.TB, h sdk.Handler) string {
	t.Helper()
	path := testutil.SocketPath(t)
	testagent.ServeWith(t, path, h, &sdk.Options{NoClientRequest: true})
	return path
}

// udsAgent connects a udsclient.Client to the agent at path and waits for it.
func udsAgent(t testing.TB, name, path string, mod func(*udsclient.Config)) agentmux.Agent {
	t.Helper()
	cfg := udsclient.DefaultConfig(name, path)
	cfg.BackoffMin = 5 * time.Millisecond
	cfg.BackoffMax = 50 * time.Millisecond
	if mod != nil {
		mod(&cfg)
	}
	c, err := udsclient.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		c.Close()
		t.Fatal(err)
	}
	return c
}

// proxy is a running dataplane with its upstream.
type proxy struct {
	srv    *dataplane.Server
	addr   string
	client *http.Client
	logs   *testutil.LogBuffer
}

// configText renders a YAML configuration template; fields: Upstream
// (host:port) and Agents (name → socket path).
func configText(t testing.TB, tmpl string, data map[string]any) *config.Config {
	t.Helper()
	var b strings.Builder
	if err := template.Must(template.New("cfg").Parse(tmpl)).Execute(&b, data); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]byte(b.String()))
	if err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	return cfg
}

// startProxy serves cfg with agents on a loopback listener.
func startProxy(t testing.TB, cfg *config.Config, agents map[string]agentmux.Agent, obs dataplane.Observer) *proxy {
	t.Helper()
	logs := &testutil.LogBuffer{}
	log := zerolog.New(logs).Level(zerolog.DebugLevel)
	if _, bench := t.(*testing.B); bench {
		log = log.Level(zerolog.WarnLevel)
	}
	srv, err := dataplane.New(dataplane.Config{File: cfg, Observer: obs}, agents, log)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	p := &proxy{srv: srv, addr: ln.Addr().String(), logs: logs}
	p.client = &http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: 16, DisableCompression: true},
		Timeout:   hangGuard,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
		p.client.CloseIdleConnections()
		if t.Failed() {
			t.Logf("proxy log:\n%s", logs.String())
		}
	})
	return p
}

func (p *proxy) url(path string) string { return "http://" + p.addr + path }

// do sends a request and returns the response with its body read.
func (p *proxy) do(t testing.TB, method, path string, body io.Reader, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, p.url(path), body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if strings.EqualFold(hdr[i], "host") {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := p.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("reading response body: %v", err)
	}
	return resp, string(b)
}

// upstream is a net/http server that records what it received.
type upstream struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []seenRequest
}

type seenRequest struct {
	Method string
	URI    string
	Host   string
	Header http.Header
	Body   []byte
	TE     []string
	CL     int64
}

func newUpstream(t testing.TB, h http.HandlerFunc) *upstream {
	u := &upstream{}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		u.mu.Lock()
		u.reqs = append(u.reqs, seenRequest{Method: r.Method, URI: r.RequestURI, Host: r.Host, Header: r.Header.Clone(), Body: body, TE: r.TransferEncoding, CL: r.ContentLength})
		u.mu.Unlock()
		var rest io.Reader = bytes.NewReader(body)
		if err != nil {
			rest = io.MultiReader(rest, errReader{err})
		}
		r.Body = io.NopCloser(rest)
		if h != nil {
			h(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "hello from upstream")
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) addr() string { return strings.TrimPrefix(u.srv.URL, "http://") }

func (u *upstream) last(t testing.TB) seenRequest {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.reqs) == 0 {
		t.Fatal("upstream saw no request")
	}
	return u.reqs[len(u.reqs)-1]
}

func (u *upstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.reqs)
}

// oneAgentConfig is a single route through the listed agents.
const oneAgentConfig = `
listeners:
  - name: test
    address: 127.0.0.1:0
    disconnect_check: 20ms
{{- with .MaxBody}}
    max_request_body: {{.}}
{{- end}}
upstreams:
  - name: app
    address: {{.Upstream}}
    response_timeout: {{or .UpstreamTimeout "5s"}}
agents:
{{- range $name, $a := .Agents}}
  - name: {{$name}}
    transport: uds
    address: {{$a.Path}}
    failure_mode: {{or $a.Failure "closed"}}
    timeouts:
      message: {{or $a.Message "2s"}}
      request: {{or $a.Request "5s"}}
    request_body:
      mode: {{or $a.ReqMode "auto"}}
      limit: {{or $a.Limit "1MiB"}}
      over_limit: {{or $a.OverLimit "reject"}}
      chunk_size: {{or $a.Chunk "64KiB"}}
    response_body:
      mode: {{or $a.RespMode "auto"}}
      limit: {{or $a.Limit "1MiB"}}
      over_limit: {{or $a.RespOverLimit "skip"}}
      chunk_size: {{or $a.Chunk "64KiB"}}
{{- end}}
routes:
  - name: main
    upstream: app
    agents: [{{.Chain}}]
`

// agentSpec describes one agent for oneAgentConfig.
type agentSpec struct {
	Path, Failure, Message, Request            string
	ReqMode, RespMode, Limit, OverLimit, Chunk string
	RespOverLimit                              string
}

// setup starts an upstream, the agents (name → handler) and the proxy
// with the agents chained in the order of names.
func setup(t testing.TB, up http.HandlerFunc, names []string, handlers map[string]sdk.Handler, specs map[string]agentSpec, mod func(map[string]any)) (*proxy, *upstream) {
	t.Helper()
	u := newUpstream(t, up)
	agents := map[string]agentmux.Agent{}
	specMap := map[string]agentSpec{}
	for _, name := range names {
		sp := specs[name]
		if sp.Path == "" {
			sp.Path = serveAgent(t, handlers[name])
		}
		specMap[name] = sp
	}
	data := map[string]any{"Upstream": u.addr(), "Agents": specMap, "Chain": strings.Join(names, ", ")}
	if mod != nil {
		mod(data)
	}
	cfg := configText(t, oneAgentConfig, data)
	for _, name := range names {
		a := cfg.Agent(name)
		agents[name] = udsAgent(t, name, a.Address, func(c *udsclient.Config) {
			c.MessageTimeout = a.Timeouts.Message
		})
	}
	return startProxy(t, cfg, agents, nil), u
}

// rawAgent is a frame-level agent that records every event and cancel it
// receives and answers each event with answer's Decision (allow when nil).
type rawAgent struct {
	mu     sync.Mutex
	events []string
	answer func(t protocol.MsgType, id uint64) *protocol.Decision
}

func (r *rawAgent) record(e string) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *rawAgent) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

// serveRaw starts a rawAgent with caps on a fresh socket.
func serveRaw(t testing.TB, caps protocol.Capabilities, answer func(protocol.MsgType, uint64) *protocol.Decision) (string, *rawAgent) {
	t.Helper()
	ra := &rawAgent{answer: answer}
	path := testutil.SocketPath(t)
	testagent.Raw(t, path, caps, func(nc net.Conn, fr *uds.FrameReader) {
		for {
			typ, payload, err := fr.Next()
			if err != nil {
				return
			}
			var id uint64
			switch typ {
			case protocol.TypeCancelRequest:
				var m protocol.CancelRequest
				if m.Decode(payload) == nil {
					ra.record("cancel:" + string(m.Reason))
				}
				continue
			case protocol.TypeRequestHeaders:
				var m protocol.RequestHeaders
				if m.Decode(payload) != nil {
					return
				}
				id = m.RequestID
				ra.record("request_headers")
			case protocol.TypeResponseHeaders:
				var m protocol.ResponseHeaders
				if m.Decode(payload) != nil {
					return
				}
				id = m.RequestID
				ra.record("response_headers")
			case protocol.TypeRequestBodyChunk, protocol.TypeResponseBodyChunk:
				var m protocol.BodyChunk
				if m.Decode(payload) != nil {
					return
				}
				id = m.RequestID
				ra.record(typ.String())
			default:
				continue
			}
			d := &protocol.Decision{}
			if ra.answer != nil {
				if a := ra.answer(typ, id); a != nil {
					d = a
				}
			}
			d.RequestID = id
			if uds.WriteFrame(nc, d) != nil {
				return
			}
		}
	})
	return path, ra
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
