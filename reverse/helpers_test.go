package reverse

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/uds"
)

const testToken = "s3cret-token"

// testConfig is a listener on a fresh Unix socket with one agent "waf"
// admitting "waf-*" with testToken, and small timeouts.
func testConfig(t testing.TB) Config {
	cfg := DefaultConfig()
	cfg.UnixPath = filepath.Join(testutil.SocketDir(t), "r.sock")
	cfg.Agents = []AgentConfig{{Name: "waf", IDs: []string{"waf-*"}, Tokens: []string{testToken}}}
	cfg.RegistrationTimeout = 2 * time.Second
	cfg.FailureDelay = time.Millisecond
	cfg.MaxFailureDelay = 4 * time.Millisecond
	cfg.MessageTimeout = 5 * time.Second
	return cfg
}

func testLogger(t testing.TB) zerolog.Logger {
	if testing.Verbose() {
		return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel)
	}
	return zerolog.Nop()
}

// startListener runs a listener until the test ends.
func startListener(t testing.TB, cfg Config) *Listener {
	t.Helper()
	l, err := NewListener(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.Serve(context.Background()) }()
	t.Cleanup(func() {
		_ = l.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return l
}

// testHandler answers RequestHeaders with an x-agent header naming itself;
// with a gate it holds each request until the gate opens or it is canceled.
type testHandler struct {
	sdk.Base
	name     string
	gate     chan struct{}
	entered  chan string
	handled  atomic.Int64
	canceled atomic.Int64
}

func newHandler(name string) *testHandler {
	return &testHandler{
		name: name,
		Base: sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true, SupportsCancellation: true}},
	}
}

func (h *testHandler) OnRequestHeaders(ctx context.Context, _ *protocol.RequestHeaders, d *protocol.Decision) error {
	h.handled.Add(1)
	if h.entered != nil {
		h.entered <- h.name
	}
	if h.gate != nil {
		select {
		case <-h.gate:
		case <-ctx.Done():
			h.canceled.Add(1)
			return ctx.Err()
		}
	}
	d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderSet, Name: []byte("x-agent"), Value: []byte(h.name)})
	return nil
}

// runAgent serves h over a reverse connection as id until the returned
// stop function is called (or the test ends).
func runAgent(t testing.TB, addr, id, token string, h sdk.Handler, mutate func(*sdk.ReverseConfig)) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cfg := sdk.ReverseConfig{
		Address:    addr,
		AgentID:    id,
		Token:      token,
		BackoffMin: 5 * time.Millisecond,
		BackoffMax: 50 * time.Millisecond,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	done := make(chan error, 1)
	go func() { done <- sdk.DialAndServe(ctx, cfg, h) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("DialAndServe(%s): %v", id, err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// call runs one RequestHeaders exchange and returns the x-agent that answered.
func call(ctx context.Context, a agentmux.Agent) (string, error) {
	ex, err := a.Begin(agentmux.WaitFor(ctx))
	if err != nil {
		return "", err
	}
	defer ex.Finish()
	m := protocol.RequestHeaders{Method: []byte("GET"), URI: []byte("/")}
	r, err := ex.RequestHeaders(agentmux.WaitFor(ctx), &m)
	if err != nil {
		return "", err
	}
	for _, op := range r.Decision.RequestHeaderOps {
		if string(op.Name) == "x-agent" {
			return string(op.Value), nil
		}
	}
	return "", errors.New("reply without x-agent")
}

// rawConn is a hand-driven agent connection for the registration tests.
type rawConn struct {
	t  testing.TB
	nc net.Conn
	fr *uds.FrameReader
}

func dialRaw(t testing.TB, network, addr string) *rawConn {
	t.Helper()
	nc, err := net.DialTimeout(network, addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	return &rawConn{t: t, nc: nc, fr: uds.NewFrameReader(nc)}
}

// send writes msg's payload in a frame of type typ, which may differ from
// msg's own (a registration in a handshake frame).
func (c *rawConn) send(typ protocol.MsgType, msg protocol.Message) {
	c.t.Helper()
	payload, err := msg.AppendJSON(nil)
	if err != nil {
		c.t.Fatal(err)
	}
	b, err := uds.AppendRawFrame(nil, typ, payload)
	if err == nil {
		_, err = c.nc.Write(b)
	}
	if err != nil {
		c.t.Fatal(err)
	}
}

func (c *rawConn) sendRaw(b []byte) {
	c.t.Helper()
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatal(err)
	}
}

// answer reads the registration answer.
func (c *rawConn) answer() (protocol.MsgType, protocol.RegistrationResponse) {
	c.t.Helper()
	typ, payload, err := c.fr.Next()
	if err != nil {
		c.t.Fatalf("reading answer: %v", err)
	}
	var resp protocol.RegistrationResponse
	if err := protocol.DecodeRegistrationResponse(payload, &resp); err != nil {
		c.t.Fatalf("decoding answer %q: %v", payload, err)
	}
	return typ, resp
}

// closed asserts the proxy closes the connection (after any answer).
func (c *rawConn) closed() {
	c.t.Helper()
	for {
		_, _, err := c.fr.Next()
		if err == nil {
			continue
		}
		if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, net.ErrClosed) && !isReset(err) {
			c.t.Fatalf("expected the proxy to close the connection, got %v", err)
		}
		return
	}
}

func isReset(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && !oe.Timeout()
}

func regReq(id, token string) *protocol.RegistrationRequest {
	return &protocol.RegistrationRequest{
		ProtocolVersion: protocol.Version,
		AgentID:         id,
		AuthToken:       token,
		Capabilities:    protocol.Capabilities{HandlesRequestHeaders: true},
	}
}
