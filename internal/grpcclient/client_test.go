package grpcclient_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/zentinelproxy/sidecar/grpcagent/pb"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/grpcclient"
	"github.com/zentinelproxy/sidecar/internal/grpcwire"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

var testCaps = protocol.Capabilities{
	HandlesRequestHeaders: true, HandlesRequestBody: true, HandlesResponseHeaders: true,
	HandlesResponseBody: true, SupportsCancellation: true,
}

// longWait bounds blocking steps so that a broken build fails instead of
// hanging; never a performance assertion.
const longWait = 10 * time.Second

func waitCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), longWait)
}

// rawAgent is a hand-written AgentProcessorV2 server for the misbehaving
// agents no SDK produces. It uses plain gRPC with a 64 MiB send limit.
type rawAgent struct {
	pb.UnimplementedAgentProcessorV2Server
	caps    *pb.CapabilityResponse
	health  atomic.Int32 // pb.HealthResponse_Status
	stream  func(s grpc.BidiStreamingServer[pb.AgentMessage, pb.AgentMessage]) error
	streams atomic.Int32
}

func (a *rawAgent) GetCapabilities(context.Context, *pb.CapabilityRequest) (*pb.CapabilityResponse, error) {
	if a.caps != nil {
		return a.caps, nil
	}
	return &pb.CapabilityResponse{ProtocolVersion: 2, AgentName: "raw", Capabilities: grpcwire.CapabilitiesToPB(testCaps)}, nil
}

func (a *rawAgent) HealthCheck(context.Context, *pb.HealthRequest) (*pb.HealthResponse, error) {
	st := pb.HealthResponse_Status(a.health.Load())
	if st == pb.HealthResponse_UNKNOWN {
		st = pb.HealthResponse_SERVING
	}
	return &pb.HealthResponse{Status: st}, nil
}

func (a *rawAgent) ProcessStream(s grpc.BidiStreamingServer[pb.AgentMessage, pb.AgentMessage]) error {
	a.streams.Add(1)
	return a.stream(s)
}

// startRaw serves a on 127.0.0.1:0 and returns a ready client for it.
func startRaw(t *testing.T, a *rawAgent, tweak func(*grpcclient.Config)) *grpcclient.Client {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.MaxSendMsgSize(64<<20), grpc.MaxRecvMsgSize(64<<20))
	pb.RegisterAgentProcessorV2Server(srv, a)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	cfg := grpcclient.DefaultConfig("raw", ln.Addr().String())
	cfg.MessageTimeout = time.Minute // a failure must come from the transport, not a timeout
	if tweak != nil {
		tweak(&cfg)
	}
	c, err := grpcclient.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := waitCtx()
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

func headers(uri string) *protocol.RequestHeaders {
	return &protocol.RequestHeaders{Method: []byte("GET"), URI: []byte(uri)}
}

// roundTrip sends one RequestHeaders and returns the decision or error.
func roundTrip(t *testing.T, a agentmux.Agent, uri string) (*protocol.Decision, error) {
	t.Helper()
	ctx, cancel := waitCtx()
	defer cancel()
	ex, err := a.Begin(agentmux.WaitFor(ctx))
	if err != nil {
		return nil, err
	}
	defer ex.Finish()
	r, err := ex.RequestHeaders(agentmux.WaitFor(ctx), headers(uri))
	if err != nil {
		return nil, err
	}
	d := r.Decision
	d.RequestHeaderOps = append([]protocol.HeaderOp(nil), d.RequestHeaderOps...)
	return &d, nil
}

func allow(id uint64) *pb.AgentMessage {
	return &pb.AgentMessage{RequestId: id, Payload: &pb.AgentMessage_Decision{Decision: &pb.AgentDecision{Decision: &pb.AgentDecision_Allow{Allow: &pb.Allow{}}}}}
}

// TestOneStreamManyRequests: requests share one long-lived stream per
// connection (not a stream per HTTP request).
func TestOneStreamManyRequests(t *testing.T) {
	var streams atomic.Int32
	count := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		streams.Add(1)
		return h(srv, ss)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveAgent(t, ln, &sdk.Base{Caps: testCaps}, count)
	cfg := grpcclient.DefaultConfig("one", ln.Addr().String())
	c, err := grpcclient.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := waitCtx()
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 10; j++ {
				if _, err := roundTrip(t, c, "/x"); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if n := streams.Load(); n != 1 {
		t.Fatalf("%d streams for 200 requests on one connection, want 1", n)
	}
	if st := c.Snapshot(); st.Completed != 200 || st.Transport != "grpc" {
		t.Fatalf("snapshot %+v", st)
	}
}

// TestOversizedFromAgent: a reply above 10 MiB is refused with a clear
// error; the waiting request fails at once and the client reconnects.
func TestOversizedFromAgent(t *testing.T) {
	var big atomic.Bool
	big.Store(true)
	a := &rawAgent{}
	a.stream = func(s grpc.BidiStreamingServer[pb.AgentMessage, pb.AgentMessage]) error {
		for {
			m, err := s.Recv()
			if err != nil {
				return nil
			}
			reply := allow(m.RequestId)
			if big.Load() {
				reply.GetDecision().Decision = &pb.AgentDecision_Block{Block: &pb.Block{Status: 403, Body: bytes.Repeat([]byte("x"), 11<<20)}}
			}
			if err := s.Send(reply); err != nil {
				return err
			}
		}
	}
	c := startRaw(t, a, nil)
	_, err := roundTrip(t, c, "/big")
	if !errors.Is(err, agentmux.ErrAgentConnLost) {
		t.Fatalf("oversized reply: %v, want ErrAgentConnLost", err)
	}
	if !strings.Contains(err.Error(), "message too large") {
		t.Fatalf("error does not say why: %v", err)
	}
	if le := c.Snapshot().LastError; !strings.Contains(le, "message too large") {
		t.Fatalf("last error %q", le)
	}
	big.Store(false)
	ctx, cancel := waitCtx()
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(t, c, "/small"); err != nil {
		t.Fatalf("after reconnect: %v", err)
	}
}

// bigHandler replaces a body chunk with more than 10 MiB.
type bigHandler struct{ sdk.Base }

func (bigHandler) OnRequestBody(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
	r.Replace(bytes.Repeat([]byte("y"), 11<<20))
	return nil
}

// TestOversizedFromProxyAndSDK: an event above 10 MiB is refused before it
// reaches the stream, and so is a handler's oversized reply (an agent
// error); the stream carries on either way.
func TestOversizedFromProxyAndSDK(t *testing.T) {
	p := startPair(t, &bigHandler{sdk.Base{Caps: testCaps}}, nil)
	c := p.client
	ctx, cancel := waitCtx()
	defer cancel()
	ex, err := c.Begin(agentmux.WaitFor(ctx))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ex.RequestHeaders(agentmux.WaitFor(ctx), headers("/upload")); err != nil {
		t.Fatal(err)
	}
	huge := &protocol.BodyChunk{Data: make([]byte, 11<<20), TotalSize: -1, Progress: -1}
	_, err = ex.BodyChunk(agentmux.WaitFor(ctx), protocol.PhaseRequest, huge)
	ex.Finish()
	if err == nil || !strings.Contains(err.Error(), "message too large") || !strings.Contains(err.Error(), "10485760") {
		t.Fatalf("oversized event: %v", err)
	}

	ex, err = c.Begin(agentmux.WaitFor(ctx))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ex.RequestHeaders(agentmux.WaitFor(ctx), headers("/upload")); err != nil {
		t.Fatalf("stream did not survive the refused event: %v", err)
	}
	_, err = ex.BodyChunk(agentmux.WaitFor(ctx), protocol.PhaseRequest, &protocol.BodyChunk{Data: []byte("small"), TotalSize: -1, Progress: -1})
	ex.Finish()
	if !errors.Is(err, agentmux.ErrAgentProtocol) {
		t.Fatalf("handler's oversized reply: %v, want ErrAgentProtocol", err)
	}
	if _, err := roundTrip(t, c, "/after"); err != nil {
		t.Fatalf("stream did not survive the refused reply: %v", err)
	}
	if n := c.Snapshot().Connections; n != 1 {
		t.Fatalf("%d connections", n)
	}
}

// TestUnknownRequestIDs: replies for ids nobody waits for are discarded
// and counted; pings are answered; unknown payloads are skipped; the real
// reply still reaches its request.
func TestUnknownRequestIDs(t *testing.T) {
	pongs := make(chan uint64, 1)
	a := &rawAgent{}
	a.stream = func(s grpc.BidiStreamingServer[pb.AgentMessage, pb.AgentMessage]) error {
		for {
			m, err := s.Recv()
			if err != nil {
				return nil
			}
			switch m.Payload.(type) {
			case *pb.AgentMessage_Pong:
				pongs <- m.GetPong().Sequence
				continue
			case *pb.AgentMessage_RequestHeaders:
			default:
				continue
			}
			unknown := &pb.AgentMessage{RequestId: m.RequestId}
			// Field 30, an empty message: a payload from a newer agent.
			unknown.ProtoReflect().SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 30, protowire.BytesType), nil))
			bogus := []*pb.AgentMessage{
				allow(m.RequestId + 1_000_000),
				allow(0),
				{RequestId: m.RequestId + 2_000_000, Payload: &pb.AgentMessage_BodyMutation{BodyMutation: &pb.BodyMutation{}}},
				{Payload: &pb.AgentMessage_Ping{Ping: &pb.Ping{Sequence: 99}}},
				unknown,
				{RequestId: m.RequestId, Payload: &pb.AgentMessage_RequestHeaders{RequestHeaders: &pb.RequestHeaders{}}}, // proxy-only payload
				{RequestId: m.RequestId, Payload: &pb.AgentMessage_Decision{Decision: &pb.AgentDecision{
					Decision:       &pb.AgentDecision_Allow{Allow: &pb.Allow{}},
					RequestHeaders: []*pb.HeaderOp{{Operation: pb.HeaderOp_SET, Name: []byte("x-real"), Value: []byte("yes")}},
				}}},
			}
			for _, r := range bogus {
				if err := s.Send(r); err != nil {
					return err
				}
			}
		}
	}
	c := startRaw(t, a, nil)
	late0 := c.Snapshot().Late
	d, err := roundTrip(t, c, "/real")
	if err != nil {
		t.Fatal(err)
	}
	if len(d.RequestHeaderOps) != 1 || string(d.RequestHeaderOps[0].Name) != "x-real" {
		t.Fatalf("request got the wrong reply: %+v", d)
	}
	select {
	case seq := <-pongs:
		if seq != 99 {
			t.Fatalf("pong echoes %d, want 99", seq)
		}
	case <-time.After(longWait):
		t.Fatal("agent's ping never answered")
	}
	if late := c.Snapshot().Late - late0; late != 3 {
		t.Fatalf("late replies counted %d, want 3", late)
	}
	if n := c.UnknownMessages(); n != 2 {
		t.Fatalf("unknown messages %d, want 2", n)
	}
}

// TestMalformedReplies: replies that break the protocol fail their own
// request with ErrAgentProtocol; the stream carries on.
func TestMalformedReplies(t *testing.T) {
	bad := map[string]*pb.AgentDecision{
		"/no-verdict":   {},
		"/bad-op":       {Decision: &pb.AgentDecision_Allow{Allow: &pb.Allow{}}, RequestHeaders: []*pb.HeaderOp{{Name: []byte("x")}}},
		"/no-url":       {Decision: &pb.AgentDecision_Redirect{Redirect: &pb.Redirect{Status: 302}}},
		"/bad-mutation": {Decision: &pb.AgentDecision_Allow{Allow: &pb.Allow{}}, RequestBodyMutation: &pb.BodyMutation{Phase: 7}},
	}
	a := &rawAgent{}
	a.stream = func(s grpc.BidiStreamingServer[pb.AgentMessage, pb.AgentMessage]) error {
		for {
			m, err := s.Recv()
			if err != nil {
				return nil
			}
			reply := allow(m.RequestId)
			if d, ok := bad[string(m.GetRequestHeaders().GetUri())]; ok {
				reply.Payload = &pb.AgentMessage_Decision{Decision: d}
			}
			if string(m.GetRequestHeaders().GetUri()) == "/agent-error" {
				reply.Payload = &pb.AgentMessage_AgentError{AgentError: &pb.AgentError{Message: "boom"}}
			}
			if err := s.Send(reply); err != nil {
				return err
			}
		}
	}
	c := startRaw(t, a, nil)
	for _, uri := range []string{"/no-verdict", "/bad-op", "/no-url", "/bad-mutation", "/agent-error"} {
		t.Run(uri, func(t *testing.T) {
			if _, err := roundTrip(t, c, uri); !errors.Is(err, agentmux.ErrAgentProtocol) {
				t.Fatalf("%s: %v, want ErrAgentProtocol", uri, err)
			}
			if _, err := roundTrip(t, c, "/fine"); err != nil {
				t.Fatalf("after %s: %v", uri, err)
			}
		})
	}
	if n := c.Snapshot().Protocol; n != 5 {
		t.Fatalf("protocol errors %d, want 5", n)
	}
}

// blockingHandler holds requests until their context ends.
type blockingHandler struct {
	sdk.Base
	started chan struct{}
}

func (h *blockingHandler) OnRequestHeaders(ctx context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
	if string(m.URI) == "/block" {
		h.started <- struct{}{}
		<-ctx.Done()
	}
	return nil
}

// TestStreamResetMidFlight: when the stream dies, every waiting request
// fails at once with ErrAgentConnLost (not after its timeout), and the
// client reconnects when the agent is back.
func TestStreamResetMidFlight(t *testing.T) {
	cases := []struct {
		name  string
		reset func(t *testing.T, stop func(), gate chan error)
	}{
		{"agent process stops", func(t *testing.T, stop func(), gate chan error) { stop() }},
		{"stream ends with an error status", func(t *testing.T, stop func(), gate chan error) {
			gate <- status.Error(codes.Internal, "agent bug")
		}},
		{"stream ends cleanly", func(t *testing.T, stop func(), gate chan error) { gate <- nil }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			h := &blockingHandler{Base: sdk.Base{Caps: testCaps}, started: make(chan struct{}, 16)}
			gate := make(chan error, 1)
			// The interceptor lets a test end the stream from the server side.
			ending := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
				done := make(chan error, 1)
				go func() { done <- handler(srv, ss) }()
				select {
				case err := <-gate:
					return err
				case err := <-done:
					return err
				}
			})
			stop := serveAgent(t, ln, h, ending)
			cfg := grpcclient.DefaultConfig("reset", addr)
			cfg.MessageTimeout = time.Minute
			cl, err := grpcclient.NewClient(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := waitCtx()
			defer cancel()
			if err := cl.WaitReady(ctx); err != nil {
				t.Fatal(err)
			}
			const n = 8
			errs := make(chan error, n)
			for i := 0; i < n; i++ {
				go func() {
					_, err := roundTrip(t, cl, "/block")
					errs <- err
				}()
			}
			for i := 0; i < n; i++ {
				<-h.started
			}
			c.reset(t, stop, gate)
			for i := 0; i < n; i++ {
				if err := <-errs; !errors.Is(err, agentmux.ErrAgentConnLost) {
					t.Fatalf("waiting request: %v, want ErrAgentConnLost", err)
				}
			}
			if c.name == "agent process stops" {
				ln, err := net.Listen("tcp", addr)
				if err != nil {
					t.Skipf("cannot listen on %s again: %v", addr, err)
				}
				serveAgent(t, ln, h)
			}
			// The client reconnects and serves requests again.
			deadline := time.Now().Add(longWait)
			for {
				_, err := roundTrip(t, cl, "/ok")
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no reconnect: %v", err)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// TestCapabilityNegotiation: a refusal or a wrong version keeps the
// connection out of use with a clear last error.
func TestCapabilityNegotiation(t *testing.T) {
	no := false
	cases := []struct {
		name string
		resp *pb.CapabilityResponse
		want string
	}{
		{"wrong version", &pb.CapabilityResponse{ProtocolVersion: 3}, "unsupported protocol version"},
		{"refused", &pb.CapabilityResponse{ProtocolVersion: 2, Accepted: &no, Error: "not today"}, "not today"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			a := &rawAgent{caps: c.resp, stream: func(grpc.BidiStreamingServer[pb.AgentMessage, pb.AgentMessage]) error { return nil }}
			srv := grpc.NewServer()
			pb.RegisterAgentProcessorV2Server(srv, a)
			go func() { _ = srv.Serve(ln) }()
			defer srv.Stop()
			cl, err := grpcclient.NewClient(grpcclient.DefaultConfig("neg", ln.Addr().String()))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			waitLastError(t, cl, c.want)
			if a.streams.Load() != 0 {
				t.Fatal("a stream was opened without accepted capabilities")
			}
			if _, err := cl.Begin(agentmux.Wait{}); !errors.Is(err, agentmux.ErrAgentUnavailable) {
				t.Fatalf("Begin: %v", err)
			}
		})
	}
}

// waitLastError waits until the client's last error contains want.
// waitLastError waits until the client's last error mentions want (or
// one of its "|"-separated alternatives).
func waitLastError(t *testing.T, c *grpcclient.Client, want string) {
	t.Helper()
	deadline := time.Now().Add(longWait)
	for {
		le := c.Snapshot().LastError
		for _, w := range strings.Split(want, "|") {
			if strings.Contains(le, w) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("last error %q, want it to mention %q", le, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// healthHandler reports its health from a flag.
type healthHandler struct {
	sdk.Base
	sick atomic.Bool
}

func (h *healthHandler) Healthy(context.Context) error {
	if h.sick.Load() {
		return errors.New("warming up")
	}
	return nil
}

// TestHealth: an agent that is not serving gets no requests; one that
// stops serving is drained and taken out of rotation until it serves again.
func TestHealth(t *testing.T) {
	h := &healthHandler{Base: sdk.Base{Caps: testCaps}}
	h.sick.Store(true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveAgent(t, ln, h)
	cfg := grpcclient.DefaultConfig("health", ln.Addr().String())
	cfg.HealthInterval = 20 * time.Millisecond
	cfg.BackoffMax = 50 * time.Millisecond
	c, err := grpcclient.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitLastError(t, c, "warming up")
	if c.Len() != 0 {
		t.Fatal("a not-serving agent is in rotation")
	}
	h.sick.Store(false)
	ctx, cancel := waitCtx()
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(t, c, "/x"); err != nil {
		t.Fatal(err)
	}
	h.sick.Store(true)
	deadline := time.Now().Add(longWait)
	for c.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("a connection that stopped serving stayed in rotation")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := c.Begin(agentmux.Wait{}); !errors.Is(err, agentmux.ErrAgentUnavailable) {
		t.Fatalf("Begin while not serving: %v", err)
	}
	h.sick.Store(false)
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestCloseCancelsHandlers: closing the client sends CancelAll and ends
// the stream; the agent's handlers see their contexts canceled.
func TestCloseCancelsHandlers(t *testing.T) {
	h := &blockingHandler{Base: sdk.Base{Caps: testCaps}, started: make(chan struct{}, 1)}
	p := startPair(t, h, nil)
	errc := make(chan error, 1)
	go func() {
		_, err := roundTrip(t, p.client, "/block")
		errc <- err
	}()
	<-h.started
	if err := p.client.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, agentmux.ErrAgentConnLost) {
		t.Fatalf("request during Close: %v", err)
	}
	// The handler returned: stopping the agent does not hang.
	p.stop()
}

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		mod  func(*grpcclient.Config)
		ok   bool
	}{
		{"default", func(*grpcclient.Config) {}, true},
		{"no name", func(c *grpcclient.Config) { c.Name = "" }, false},
		{"no address", func(c *grpcclient.Config) { c.Address = "" }, false},
		{"conns 0", func(c *grpcclient.Config) { c.Conns = 0 }, false},
		{"conns 65", func(c *grpcclient.Config) { c.Conns = 65 }, false},
		{"in flight 0", func(c *grpcclient.Config) { c.MaxInFlight = 0 }, false},
		{"negative queue", func(c *grpcclient.Config) { c.MaxQueue = -1 }, false},
		{"no dial timeout", func(c *grpcclient.Config) { c.DialTimeout = 0 }, false},
		{"backoff inverted", func(c *grpcclient.Config) { c.BackoffMax = c.BackoffMin / 2 }, false},
		{"keepalive 1s", func(c *grpcclient.Config) { c.KeepaliveTime = time.Second }, false},
		{"keepalive off", func(c *grpcclient.Config) { c.KeepaliveTime = 0 }, true},
		{"message 11 MiB", func(c *grpcclient.Config) { c.MaxMessageSize = 11 << 20 }, false},
		{"message 1 MiB", func(c *grpcclient.Config) { c.MaxMessageSize = 1 << 20 }, true},
		{"cert without key", func(c *grpcclient.Config) { c.TLS.CertFile = "c.pem" }, false},
		{"server name without tls", func(c *grpcclient.Config) { c.TLS.ServerName = "agent" }, false},
		{"tls with server name", func(c *grpcclient.Config) { c.TLS.Enabled, c.TLS.ServerName = true, "agent" }, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := grpcclient.DefaultConfig("a", "127.0.0.1:1")
			c.mod(&cfg)
			err := cfg.Validate()
			if (err == nil) != c.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, c.ok)
			}
			if err != nil && !errors.Is(err, grpcclient.ErrGRPCConfig) {
				t.Fatalf("error %v is not ErrGRPCConfig", err)
			}
		})
	}
	if _, err := grpcclient.NewClient(grpcclient.Config{}); !errors.Is(err, grpcclient.ErrGRPCConfig) {
		t.Fatalf("NewClient with an empty config: %v", err)
	}
}

// TestCloseSendsCancelAll: Close tells the agent to stop all work before
// the stream goes away.
func TestCloseSendsCancelAll(t *testing.T) {
	got := make(chan string, 1)
	a := &rawAgent{}
	a.stream = func(s grpc.BidiStreamingServer[pb.AgentMessage, pb.AgentMessage]) error {
		for {
			m, err := s.Recv()
			if err != nil {
				return nil
			}
			if ca := m.GetCancelAll(); ca != nil {
				got <- ca.Reason
			}
		}
	}
	c := startRaw(t, a, nil)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case reason := <-got:
		if reason != "shutdown" {
			t.Fatalf("CancelAll reason %q", reason)
		}
	case <-time.After(longWait):
		t.Fatal("no CancelAll before the stream closed")
	}
}
