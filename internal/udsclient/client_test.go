package udsclient_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/uds"
)

// hangGuard is how long a test waits for something that must happen
// "promptly" before declaring a hang. It is a liveness bound, not a speed
// assertion.
const hangGuard = 10 * time.Second

// testHandler answers with a request header op echoing x-id, blocks on
// x-block until released or canceled, and blocks with "x-status".
type testHandler struct {
	sdk.Base
	release   chan struct{}
	canceled  chan uint64
	active    atomic.Int64
	maxActive atomic.Int64
	seen      atomic.Int64
}

func newTestHandler(caps protocol.Capabilities) *testHandler {
	return &testHandler{Base: sdk.Base{Caps: caps}, release: make(chan struct{}), canceled: make(chan uint64, 1024)}
}

func (h *testHandler) OnRequestHeaders(ctx context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
	h.seen.Add(1)
	n := h.active.Add(1)
	defer h.active.Add(-1)
	for {
		old := h.maxActive.Load()
		if n <= old || h.maxActive.CompareAndSwap(old, n) {
			break
		}
	}
	if m.Headers.Get("x-block") != nil {
		select {
		case <-h.release:
		case <-ctx.Done():
			h.canceled <- m.RequestID
			return ctx.Err()
		}
	}
	if s := m.Headers.Get("x-status"); s != nil {
		st, _ := strconv.Atoi(string(s))
		d.Kind = protocol.DecisionBlock
		d.Status = st
		d.Body = []byte("blocked")
		return nil
	}
	if m.Headers.Get("x-fail") != nil {
		return errors.New("handler failure")
	}
	// Copy: m is only valid during the call, d is encoded after it.
	id := append([]byte(nil), m.Headers.Get("x-id")...)
	d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderSet, Name: []byte("x-echo"), Value: id})
	return nil
}

var allCaps = protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true, SupportsCancellation: true, SupportsStreaming: true}

func newClient(t testing.TB, path string, mod func(*udsclient.Config)) *udsclient.Client {
	t.Helper()
	cfg := udsclient.DefaultConfig("test-agent", path)
	cfg.BackoffMin = 5 * time.Millisecond
	cfg.BackoffMax = 50 * time.Millisecond
	if mod != nil {
		mod(&cfg)
	}
	c, err := udsclient.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

func headers(kv ...string) *protocol.RequestHeaders {
	m := &protocol.RequestHeaders{Method: []byte("GET"), URI: []byte("/")}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = m.Headers.Add([]byte(kv[i]), []byte(kv[i+1]))
	}
	return m
}

func roundTrip(ctx context.Context, a agentmux.Agent, m *protocol.RequestHeaders) (protocol.Decision, error) {
	ex, err := a.Begin(agentmux.WaitFor(ctx))
	if err != nil {
		return protocol.Decision{}, err
	}
	defer ex.Finish()
	r, err := ex.RequestHeaders(agentmux.WaitFor(ctx), m)
	if err != nil {
		return protocol.Decision{}, err
	}
	d := r.Decision
	// Detach from the exchange's buffers before Finish recycles them.
	d.RequestHeaderOps = append([]protocol.HeaderOp(nil), d.RequestHeaderOps...)
	for i := range d.RequestHeaderOps {
		d.RequestHeaderOps[i].Value = append([]byte(nil), d.RequestHeaderOps[i].Value...)
	}
	return d, nil
}

func TestThousandConcurrentNoCrossTalk(t *testing.T) {
	path := testutil.SocketPath(t)
	testagent.Serve(t, path, newTestHandler(allCaps))
	c := newClient(t, path, nil)
	const n = 1000
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			id := strconv.Itoa(i)
			d, err := roundTrip(context.Background(), c, headers("x-id", id))
			if err != nil {
				errs <- err
				return
			}
			if len(d.RequestHeaderOps) != 1 || string(d.RequestHeaderOps[0].Value) != id {
				errs <- fmt.Errorf("request %s got ops %+v", id, d.RequestHeaderOps)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if st := c.Snapshot(); st.Completed != n || st.Late != 0 || st.InFlight != 0 {
		t.Fatalf("status after run: %+v", st)
	}
}

func TestSlowRequestDoesNotDelayFast(t *testing.T) {
	path := testutil.SocketPath(t)
	h := newTestHandler(allCaps)
	testagent.Serve(t, path, h)
	c := newClient(t, path, nil)
	slowDone := make(chan error, 1)
	go func() {
		_, err := roundTrip(context.Background(), c, headers("x-block", "1"))
		slowDone <- err
	}()
	for h.active.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	// The slow request is parked in the agent; fast ones must still finish.
	for i := 0; i < 20; i++ {
		if _, err := roundTrip(context.Background(), c, headers("x-id", "f")); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-slowDone:
		t.Fatalf("slow request finished before release: %v", err)
	default:
	}
	close(h.release)
	if err := <-slowDone; err != nil {
		t.Fatal(err)
	}
}

func TestCancelReachesAgent(t *testing.T) {
	path := testutil.SocketPath(t)
	h := newTestHandler(allCaps)
	testagent.Serve(t, path, h)
	c := newClient(t, path, nil)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := roundTrip(ctx, c, headers("x-block", "1"))
		errc <- err
	}()
	for h.active.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-errc; !errors.Is(err, agentmux.ErrAgentCanceled) {
		t.Fatalf("err = %v, want ErrAgentCanceled", err)
	}
	select {
	case <-h.canceled:
	case <-time.After(hangGuard):
		t.Fatal("agent handler never saw the cancellation")
	}
}

func TestMessageTimeoutCancelsAndCountsLate(t *testing.T) {
	path := testutil.SocketPath(t)
	// A raw agent that answers every RequestHeaders twice, the first time
	// only after the proxy gave up.
	release := make(chan struct{})
	testagent.Raw(t, path, allCaps, func(nc net.Conn, fr *uds.FrameReader) {
		var cancels atomic.Int64
		for {
			typ, p, err := fr.Next()
			if err != nil {
				return
			}
			switch typ {
			case protocol.TypeRequestHeaders:
				id, _ := protocol.PeekRequestID(p)
				go func() {
					<-release
					_ = uds.WriteFrame(nc, &protocol.Decision{RequestID: id})
				}()
			case protocol.TypeCancelRequest:
				cancels.Add(1)
			}
		}
	})
	c := newClient(t, path, func(cfg *udsclient.Config) { cfg.MessageTimeout = 30 * time.Millisecond })
	if _, err := roundTrip(context.Background(), c, headers()); !errors.Is(err, agentmux.ErrAgentTimeout) {
		t.Fatalf("err = %v, want ErrAgentTimeout", err)
	}
	close(release)
	deadline := time.Now().Add(hangGuard)
	for c.Snapshot().Late != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("late reply not counted: %+v", c.Snapshot())
		}
		time.Sleep(time.Millisecond)
	}
	if st := c.Snapshot(); st.Timeouts != 1 {
		t.Fatalf("timeouts = %d", st.Timeouts)
	}
}

func TestAgentDisappearsMidFlight(t *testing.T) {
	path := testutil.SocketPath(t)
	h := newTestHandler(allCaps)
	stop := testagent.Serve(t, path, h)
	c := newClient(t, path, func(cfg *udsclient.Config) { cfg.MessageTimeout = time.Minute })
	const n = 50
	errc := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			_, err := roundTrip(context.Background(), c, headers("x-block", "1"))
			errc <- err
		}()
	}
	for h.active.Load() != n {
		time.Sleep(time.Millisecond)
	}
	stop() // the agent process goes away with 50 requests in its hands
	timeout := time.After(hangGuard)
	for i := 0; i < n; i++ {
		select {
		case err := <-errc:
			if !errors.Is(err, agentmux.ErrAgentConnLost) {
				t.Fatalf("err = %v, want ErrAgentConnLost", err)
			}
		case <-timeout:
			t.Fatalf("%d requests still hanging after the agent died", n-i)
		}
	}
	// While it is gone: a clear, immediate error.
	for c.Len() != 0 {
		time.Sleep(time.Millisecond)
	}
	if _, err := roundTrip(context.Background(), c, headers()); !errors.Is(err, agentmux.ErrAgentUnavailable) {
		t.Fatalf("err = %v, want ErrAgentUnavailable", err)
	}
	// The agent comes back at the same path: the client reconnects.
	testagent.Serve(t, path, newTestHandler(allCaps))
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if d, err := roundTrip(ctx, c, headers("x-id", "back")); err != nil || string(d.RequestHeaderOps[0].Value) != "back" {
		t.Fatalf("after reconnect: %v %+v", err, d)
	}
}

func TestMaxConcurrentRequestsAndQueue(t *testing.T) {
	path := testutil.SocketPath(t)
	caps := allCaps
	caps.MaxConcurrentRequests = 2
	h := newTestHandler(caps)
	testagent.Serve(t, path, h)
	c := newClient(t, path, func(cfg *udsclient.Config) { cfg.MaxQueue = 1; cfg.MessageTimeout = time.Minute })
	errc := make(chan error, 3)
	for i := 0; i < 3; i++ {
		go func() {
			_, err := roundTrip(context.Background(), c, headers("x-block", "1"))
			errc <- err
		}()
	}
	// Two reach the agent, the third waits in the queue.
	for h.active.Load() != 2 || c.Sessions()[0].Stats().Waiting != 1 {
		time.Sleep(time.Millisecond)
	}
	if _, err := c.Begin(agentmux.Wait{}); !errors.Is(err, agentmux.ErrAgentOverloaded) {
		t.Fatalf("fourth request: err = %v, want ErrAgentOverloaded", err)
	}
	close(h.release)
	for i := 0; i < 3; i++ {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	if m := h.maxActive.Load(); m > 2 {
		t.Fatalf("agent saw %d concurrent requests, limit 2", m)
	}
	if h.seen.Load() != 3 {
		t.Fatalf("agent saw %d requests", h.seen.Load())
	}
}

func TestHandlerErrorIsProtocolError(t *testing.T) {
	path := testutil.SocketPath(t)
	testagent.Serve(t, path, newTestHandler(allCaps))
	c := newClient(t, path, nil)
	if _, err := roundTrip(context.Background(), c, headers("x-fail", "1")); !errors.Is(err, agentmux.ErrAgentProtocol) {
		t.Fatalf("err = %v, want ErrAgentProtocol", err)
	}
	// The connection survives a per-request error.
	if _, err := roundTrip(context.Background(), c, headers("x-id", "1")); err != nil {
		t.Fatal(err)
	}
}

func TestBadFramesFromAgentDropConnection(t *testing.T) {
	cases := []struct {
		name  string
		reply []byte
	}{
		{"oversized", []byte{0x7f, 0xff, 0xff, 0xff, 0x20}},
		{"zero length", []byte{0, 0, 0, 0, 0x20}},
		{"garbage without request id", append([]byte{0, 0, 0, 10, 0x20}, "not json!"...)},
		{"truncated then close", []byte{0, 0, 0, 50, 0x20, '{'}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := testutil.SocketPath(t)
			// First connection misbehaves; later ones answer properly.
			var n atomic.Int64
			testagent.Raw(t, path, allCaps, func(nc net.Conn, fr *uds.FrameReader) {
				bad := n.Add(1) == 1
				for {
					p, ok := testagent.NextHeaders(fr)
					if !ok {
						return
					}
					id, _ := protocol.PeekRequestID(p)
					if bad {
						nc.Write(tc.reply)
						if tc.name == "truncated then close" {
							return
						}
						continue
					}
					uds.WriteFrame(nc, &protocol.Decision{RequestID: id})
				}
			})
			c := newClient(t, path, func(cfg *udsclient.Config) { cfg.MessageTimeout = time.Minute })
			_, err := roundTrip(context.Background(), c, headers())
			if !errors.Is(err, agentmux.ErrAgentConnLost) {
				t.Fatalf("err = %v, want ErrAgentConnLost", err)
			}
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
			defer cancel()
			for {
				if _, err := roundTrip(ctx, c, headers()); err == nil {
					break
				} else if ctx.Err() != nil {
					t.Fatalf("proxy side never recovered: %v", err)
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}

func TestUndecodableReplyWithIDFailsOnlyThatRequest(t *testing.T) {
	path := testutil.SocketPath(t)
	testagent.Raw(t, path, allCaps, func(nc net.Conn, fr *uds.FrameReader) {
		for {
			p, ok := testagent.NextHeaders(fr)
			if !ok {
				return
			}
			id, _ := protocol.PeekRequestID(p)
			var m protocol.RequestHeaders
			_ = m.Decode(p)
			if m.Headers.Get("x-bad") != nil {
				payload := fmt.Sprintf(`{"request_id":%d,"decision":"explode"}`, id)
				b, _ := uds.AppendRawFrame(nil, protocol.TypeDecision, []byte(payload))
				nc.Write(b)
				continue
			}
			uds.WriteFrame(nc, &protocol.Decision{RequestID: id})
		}
	})
	c := newClient(t, path, nil)
	if _, err := roundTrip(context.Background(), c, headers("x-bad", "1")); !errors.Is(err, agentmux.ErrAgentProtocol) {
		t.Fatalf("err = %v, want ErrAgentProtocol", err)
	}
	if _, err := roundTrip(context.Background(), c, headers()); err != nil {
		t.Fatalf("connection did not survive: %v", err)
	}
	if c.Len() != 1 {
		t.Fatalf("connections = %d", c.Len())
	}
}

func TestUnknownFrameTypesSkipped(t *testing.T) {
	path := testutil.SocketPath(t)
	testagent.Raw(t, path, allCaps, func(nc net.Conn, fr *uds.FrameReader) {
		for {
			p, ok := testagent.NextHeaders(fr)
			if !ok {
				return
			}
			id, _ := protocol.PeekRequestID(p)
			b, _ := uds.AppendRawFrame(nil, 0x77, []byte(`{"future":true}`))
			b, _ = uds.AppendFrame(b, &protocol.Decision{RequestID: id + 1000})
			b, _ = uds.AppendFrame(b, &protocol.Decision{RequestID: id})
			nc.Write(b)
		}
	})
	c := newClient(t, path, nil)
	if _, err := roundTrip(context.Background(), c, headers()); err != nil {
		t.Fatal(err)
	}
	if st := c.Snapshot(); st.Late != 1 {
		t.Fatalf("reply for unknown id not counted as late: %+v", st)
	}
}

func TestSilentAgentClosedByPingTimeout(t *testing.T) {
	path := testutil.SocketPath(t)
	conns := testagent.Raw(t, path, allCaps, func(nc net.Conn, fr *uds.FrameReader) {
		for {
			if _, _, err := fr.Next(); err != nil {
				return // reads pings, never answers
			}
		}
	})
	c := newClient(t, path, func(cfg *udsclient.Config) {
		cfg.PingInterval = 10 * time.Millisecond
		cfg.PingTimeout = 40 * time.Millisecond
	})
	deadline := time.Now().Add(hangGuard)
	for conns.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("silent agent connection was never replaced")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !strings.Contains(c.Snapshot().LastError, "ping timeout") {
		t.Fatalf("last error %q does not name the ping timeout", c.Snapshot().LastError)
	}
}

func TestPingAnsweredKeepsConnection(t *testing.T) {
	path := testutil.SocketPath(t)
	testagent.Serve(t, path, newTestHandler(allCaps))
	// Three ping timeouts pass while the agent answers every 10ms ping; a
	// 500ms timeout is far above any scheduling delay of a live agent.
	c := newClient(t, path, func(cfg *udsclient.Config) {
		cfg.PingInterval = 10 * time.Millisecond
		cfg.PingTimeout = 500 * time.Millisecond
	})
	sess := c.Sessions()[0]
	for i := 0; i < 150; i++ {
		time.Sleep(10 * time.Millisecond)
		if sess.Err() != nil {
			t.Fatalf("live agent's connection closed: %v", sess.Err())
		}
	}
	if _, err := roundTrip(context.Background(), c, headers()); err != nil {
		t.Fatal(err)
	}
}

func TestHandshakeRefusals(t *testing.T) {
	cases := []struct {
		name string
		resp protocol.HandshakeResponse
	}{
		{"wrong version", protocol.HandshakeResponse{ProtocolVersion: 3, Accepted: true}},
		{"refused", protocol.HandshakeResponse{ProtocolVersion: 2, Accepted: false, Error: "busy"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := testutil.SocketPath(t)
			ln, err := net.Listen("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				nc, err := ln.Accept()
				if err != nil {
					return
				}
				defer nc.Close()
				fr := uds.NewFrameReader(nc)
				fr.Next()
				uds.WriteFrame(nc, &tc.resp)
			}()
			cfg := udsclient.DefaultConfig("x", path)
			_, _, err = udsclient.Dial(context.Background(), cfg)
			if !errors.Is(err, udsclient.ErrUDSHandshake) {
				t.Fatalf("err = %v", err)
			}
		})
	}
}

func TestListenUDSSocketFileSafety(t *testing.T) {
	path := testutil.SocketPath(t)
	// A stale socket (no listener) is replaced.
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	ln2, err := sdk.ListenUDS(path, nil)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o660 {
		t.Fatalf("socket mode %o, want 660", perm)
	}
	// A live one is not touched.
	if _, err := sdk.ListenUDS(path, nil); !errors.Is(err, sdk.ErrSDKSocketInUse) {
		t.Fatalf("err = %v, want ErrSDKSocketInUse", err)
	}
	ln2.Close()
	// A regular file is never removed.
	file := filepath.Join(filepath.Dir(path), "file")
	os.WriteFile(file, []byte("data"), 0o600)
	if _, err := sdk.ListenUDS(file, nil); !errors.Is(err, sdk.ErrSDKNotSocket) {
		t.Fatalf("err = %v, want ErrSDKNotSocket", err)
	}
	if b, _ := os.ReadFile(file); string(b) != "data" {
		t.Fatal("regular file was modified")
	}
}
