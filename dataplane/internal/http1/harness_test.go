package http1

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/dataplane/internal/exchange"
	"github.com/zentinelproxy/sidecar/dataplane/internal/upstream"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/observe"
	"github.com/zentinelproxy/sidecar/protocol"
)

// The head harness runs raw request heads through the front end and the
// exchange as a listener would, with an in-process agent that records
// the view it is shown and an upstream that records the head it is sent
// (written by the upstream side's HTTP/1 writer) and fails, so nothing
// leaves the process.

// errRecorded is the recording upstream's answer: a 502.
var errRecorded = errors.New("recorded")

// recUpstream is an exchange.Upstream that writes every request head it
// is given with upstream.WriteHead and keeps the bytes.
type recUpstream struct {
	mu   sync.Mutex
	head []byte
	n    int
	// answer, when set, makes the response (else a 502).
	answer func() exchange.UpstreamResponse
}

func (u *recUpstream) Name() string             { return "u" }
func (u *recUpstream) NameBytes() []byte        { return []byte("u") }
func (u *recUpstream) HostHeader() []byte       { return []byte("upstream.example") }
func (u *recUpstream) LogAllow() (bool, uint64) { return false, 0 }
func (u *recUpstream) RoundTrip(r *exchange.UpstreamRequest) (exchange.UpstreamResponse, error) {
	var b bytes.Buffer
	bw := bufio.NewWriter(&b)
	if _, err := upstream.WriteHead(bw, r); err != nil {
		return nil, err
	}
	_ = bw.Flush()
	u.mu.Lock()
	u.head, u.n = b.Bytes(), u.n+1
	answer := u.answer
	u.mu.Unlock()
	if answer != nil {
		return answer(), nil
	}
	return nil, errRecorded
}

// cannedResponse is an upstream answer without a body, its head parsed
// by fasthttp.
type cannedResponse struct {
	resp fasthttp.Response
	head exchange.ResponseHead
}

func newCanned(tb testing.TB, raw string) *cannedResponse {
	c := &cannedResponse{}
	c.resp.SkipBody = true
	c.resp.Header.SetNoDefaultContentType(true)
	if err := c.resp.Read(bufio.NewReader(bytes.NewReader([]byte(raw)))); err != nil {
		tb.Fatalf("%q: %v", raw, err)
	}
	h := &c.resp.Header
	c.head.Status, c.head.Reason, c.head.ContentLength = h.StatusCode(), h.StatusMessage(), int64(h.ContentLength())
	for k, v := range h.All() {
		c.head.Fields = append(c.head.Fields, exchange.Field{Name: k, Value: v})
	}
	return c
}

func (c *cannedResponse) Head() *exchange.ResponseHead    { return &c.head }
func (c *cannedResponse) Body() exchange.Source           { return nil }
func (c *cannedResponse) Endpoint() string                { return "" }
func (c *cannedResponse) Release(bool)                    {}
func (c *cannedResponse) Detach() (exchange.Tunnel, bool) { return exchange.Tunnel{}, false }

// copyingResponse is a cannedResponse whose head a front end may copy
// whole, as the upstream side's.
type copyingResponse struct{ *cannedResponse }

func (c copyingResponse) CopyHeadTo(dst *fasthttp.ResponseHeader) { c.resp.Header.CopyTo(dst) }

// take returns the head recorded since the last take (nil: none).
func (u *recUpstream) take() []byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	h := u.head
	u.head = nil
	return h
}

// viewLink is an agent connection that records the RequestHeaders it is
// sent (target, Host header, server name) and allows at once.
type viewLink struct {
	s                *agentmux.Session
	mu               sync.Mutex
	uri, host, sname []byte
}

func (l *viewLink) Send(m protocol.Message, _ agentmux.Wait) error {
	rh, ok := m.(*protocol.RequestHeaders)
	if !ok {
		return nil
	}
	l.mu.Lock()
	l.uri = append(l.uri[:0], rh.URI...)
	l.sname = append(l.sname[:0], rh.Metadata.ServerName...)
	l.host = l.host[:0]
	for _, h := range rh.Headers {
		if string(h.Name) == "host" {
			l.host = append(l.host, h.Value...)
		}
	}
	l.mu.Unlock()
	l.s.Deliver(&agentmux.Reply{Type: protocol.TypeDecision, Decision: protocol.Decision{RequestID: rh.RequestID, Kind: protocol.DecisionAllow}})
	return nil
}

func (l *viewLink) SendControl(protocol.Message) error { return nil }
func (l *viewLink) Close() error                       { return nil }

// seen returns what the agent was last shown.
func (l *viewLink) seen() (uri, host, serverName []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]byte(nil), l.uri...), append([]byte(nil), l.host...), append([]byte(nil), l.sname...)
}

// headHarness is a listener over a core whose one route has the viewing
// agent and the recording upstream.
type headHarness struct {
	l     *Listener
	core  *exchange.Core
	up    *recUpstream
	agent *viewLink
}

const harnessConfig = `
listeners: [{name: pub, address: "127.0.0.1:0"}]
upstreams: [{name: u, address: "127.0.0.1:1"}]
agents:
  - {name: a, transport: uds, address: /nonexistent.sock}
routes: [{name: r, upstream: u, agents: [a]}]
`

func newHeadHarness(tb testing.TB) *headHarness {
	tb.Helper()
	cfg, err := config.Parse([]byte(harnessConfig))
	if err != nil {
		tb.Fatal(err)
	}
	link := &viewLink{}
	link.s = agentmux.NewSession(link, protocol.Capabilities{HandlesRequestHeaders: true}, agentmux.SessionConfig{Name: "a", MaxInFlight: 1024})
	pool := agentmux.NewPool("a", "test")
	pool.Add(link.s)
	up := &recUpstream{}
	core := exchange.NewCore(nil, zerolog.Nop())
	t, err := exchange.BuildTable(cfg, map[string]agentmux.Agent{"a": pool}, []exchange.Upstream{up}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	core.Publish(t)
	l, err := NewListener(cfg.Listeners[0], core, zerolog.Nop(), &Counters{})
	if err != nil {
		tb.Fatal(err)
	}
	return &headHarness{l: l, core: core, up: up, agent: link}
}

// run parses raw as the listener would and serves it; nil when fasthttp
// refuses the head (parseError answers it).
func (h *headHarness) run(raw []byte) *fasthttp.RequestCtx {
	var req fasthttp.Request
	if err := req.Header.Read(bufio.NewReader(bytes.NewReader(raw))); err != nil {
		return nil
	}
	ctx := &fasthttp.RequestCtx{}
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 4321}, nil)
	h.l.handle(ctx)
	return ctx
}

// rejected is the count of refused heads for reason.
func (h *headHarness) rejected(reason int) uint64 {
	var st observe.Stats
	h.core.Stats(&st)
	return st.Rejected[observe.RejectReasons[reason]]
}
