package dataplane_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// testService is grpc's interop TestService, the calls the tests use.
type testService struct {
	testpb.UnimplementedTestServiceServer
}

func (testService) UnaryCall(ctx context.Context, r *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("fail")) > 0 {
		return nil, status.Error(codes.FailedPrecondition, "asked to fail: "+md.Get("fail")[0])
	}
	_ = grpc.SetTrailer(ctx, metadata.Pairs("x-trailer", "t1"))
	return &testpb.SimpleResponse{Payload: &testpb.Payload{Body: append([]byte("echo:"), r.GetPayload().GetBody()...)}}, nil
}

func (testService) StreamingOutputCall(r *testpb.StreamingOutputCallRequest, s grpc.ServerStreamingServer[testpb.StreamingOutputCallResponse]) error {
	for i, p := range r.GetResponseParameters() {
		if err := s.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: []byte(fmt.Sprintf("%d:%d", i, p.GetSize()))}}); err != nil {
			return err
		}
	}
	return nil
}

func (testService) FullDuplexCall(s grpc.BidiStreamingServer[testpb.StreamingOutputCallRequest, testpb.StreamingOutputCallResponse]) error {
	for {
		r, err := s.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := s.Send(&testpb.StreamingOutputCallResponse{Payload: r.GetPayload()}); err != nil {
			return err
		}
	}
}

// grpcUpstream serves the TestService and the health service on a
// loopback port: h2c, or h2 over TLS with cert.
func grpcUpstream(t *testing.T, cert *testutil.Cert) string {
	t.Helper()
	var opts []grpc.ServerOption
	if cert != nil {
		kp, err := tls.LoadX509KeyPair(cert.CertFile, cert.KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{kp}})))
	}
	s := grpc.NewServer(opts...)
	testpb.RegisterTestServiceServer(s, testService{})
	healthpb.RegisterHealthServer(s, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return ln.Addr().String()
}

// grpcGuard blocks calls of /grpc.testing.TestService/UnaryCall that
// carry "x-block: yes", with status 403 and a message to be
// percent-encoded.
func grpcGuard() *agentFuncs {
	return &agentFuncs{Base: sdk.Base{Caps: headersOnly()},
		reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
			if string(m.URI) != "/grpc.testing.TestService/UnaryCall" {
				return nil
			}
			for _, h := range m.Headers {
				if string(h.Name) == "x-block" && string(h.Value) == "fail" {
					return errors.New("the agent broke")
				}
				if string(h.Name) == "x-block" {
					st, _ := map[string]int{"403": 403, "401": 401, "429": 429, "503": 503}[string(h.Value)]
					d.Kind, d.Status, d.Body = protocol.DecisionBlock, st, []byte("denied by policy: 100% sure\n")
				}
			}
			return nil
		},
	}
}

// grpcProxy starts a proxy with listener listenerYAML in front of an
// upstream upYAML (flow-style mapping fields after name and address),
// the guard on its one route.
func grpcProxy(t *testing.T, listenerYAML, upAddr, upYAML string) *proxy {
	t.Helper()
	path := serveAgent(t, grpcGuard())
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
listeners: [%s]
upstreams: [{name: app, address: %q %s}]
agents: [{name: guard, transport: uds, address: %q}]
routes: [{name: main, upstream: app, agents: [guard]}]
`, listenerYAML, upAddr, upYAML, path)))
	if err != nil {
		t.Fatal(err)
	}
	return startProxy(t, cfg, map[string]agentmux.Agent{"guard": udsAgent(t, "guard", path, nil)}, nil)
}

// grpcCalls runs the calls every combination must pass through the
// proxy at cc: unary with trailers, a server stream, a bidirectional
// stream of 1,000 messages each way, an upstream's error status, the
// health service, and the guard's block as PermissionDenied.
func grpcCalls(t *testing.T, cc *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	c := testpb.NewTestServiceClient(cc)

	var trailer metadata.MD
	r, err := c.UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("hi")}}, grpc.Trailer(&trailer))
	if err != nil || string(r.GetPayload().GetBody()) != "echo:hi" {
		t.Fatalf("unary: %v %q", err, r.GetPayload().GetBody())
	}
	if got := trailer.Get("x-trailer"); len(got) != 1 || got[0] != "t1" {
		t.Errorf("unary trailer x-trailer %q (trailers %v)", got, trailer)
	}
	_, err = c.UnaryCall(metadata.AppendToOutgoingContext(ctx, "fail", "now"), &testpb.SimpleRequest{})
	if st, _ := status.FromError(err); st.Code() != codes.FailedPrecondition || st.Message() != "asked to fail: now" {
		t.Errorf("upstream error status: %v", err)
	}

	params := make([]*testpb.ResponseParameters, 50)
	for i := range params {
		params[i] = &testpb.ResponseParameters{Size: int32(i)}
	}
	ss, err := c.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{ResponseParameters: params})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		m, err := ss.Recv()
		if err == io.EOF {
			if i != len(params) {
				t.Errorf("server stream: %d messages, want %d", i, len(params))
			}
			break
		}
		if err != nil {
			t.Fatalf("server stream message %d: %v", i, err)
		}
		if want := fmt.Sprintf("%d:%d", i, i); string(m.GetPayload().GetBody()) != want {
			t.Fatalf("server stream message %d: %q", i, m.GetPayload().GetBody())
		}
	}

	// Ping-pong: each message waits for the echo of the one before, so
	// nothing is held back in either direction.
	bs, err := c.FullDuplexCall(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1000; i++ {
		body := []byte(fmt.Sprintf("message %d", i))
		if err := bs.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: body}}); err != nil {
			t.Fatalf("bidi send %d: %v", i, err)
		}
		m, err := bs.Recv()
		if err != nil || string(m.GetPayload().GetBody()) != string(body) {
			t.Fatalf("bidi recv %d: %v %q", i, err, m.GetPayload().GetBody())
		}
	}
	if err := bs.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := bs.Recv(); err != io.EOF {
		t.Errorf("bidi end: %v", err)
	}

	hr, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health: %v %v", err, hr)
	}
	for _, tc := range []struct {
		status string
		code   codes.Code
	}{{"403", codes.PermissionDenied}, {"401", codes.Unauthenticated}, {"429", codes.ResourceExhausted}, {"503", codes.Unavailable}} {
		_, err = c.UnaryCall(metadata.AppendToOutgoingContext(ctx, "x-block", tc.status), &testpb.SimpleRequest{})
		if st, _ := status.FromError(err); st.Code() != tc.code || st.Message() != "denied by policy: 100% sure\n" {
			t.Errorf("blocked %s: %v, want %v with the block's body", tc.status, err, tc.code)
		}
	}
	// The agent failing, closed: 503, as a gRPC status.
	_, err = c.UnaryCall(metadata.AppendToOutgoingContext(ctx, "x-block", "fail"), &testpb.SimpleRequest{})
	if st, _ := status.FromError(err); st.Code() != codes.Unavailable {
		t.Errorf("agent failure, closed: %v, want Unavailable", err)
	}
}

// TestGRPCThroughH2C: grpc-go client → h2c listener → h2c upstream.
func TestGRPCThroughH2C(t *testing.T) {
	up := grpcUpstream(t, nil)
	p := grpcProxy(t, `{address: "127.0.0.1:0", protocols: [http1, h2c]}`, up, ", protocol: h2c")
	cc, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	grpcCalls(t, cc)
	st := p.srv.Stats()
	if st.HTTP2.GRPCAnswers != 5 || st.Blocked != 4 || st.FailClosed != 1 {
		t.Errorf("gRPC answers %d, blocked %d, failed closed %d: want 5, 4, 1", st.HTTP2.GRPCAnswers, st.Blocked, st.FailClosed)
	}
}

// TestGRPCOverTLS: grpc-go client → h2 over TLS → h2 (TLS) upstream, and
// the same listener in front of an h2c upstream.
func TestGRPCOverTLS(t *testing.T) {
	pki := testutil.NewPKI(t, "edge")
	edge := pki.Server(t, "edge", "edge.example")
	upCert := pki.Server(t, "up", "up.example")
	lst := fmt.Sprintf(`{address: "127.0.0.1:0", tls: {certificates: [{cert_file: %q, key_file: %q}]}}`, edge.CertFile, edge.KeyFile)
	creds := credentials.NewTLS(&tls.Config{RootCAs: pki.Pool, ServerName: "edge.example"})
	for _, tc := range []struct {
		name, upYAML string
		cert         *testutil.Cert
	}{
		{"h2 upstream", fmt.Sprintf(", protocol: h2, tls: {ca_file: %q, server_name: up.example}", pki.CAFile), &upCert},
		{"h2c upstream", ", protocol: h2c", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := grpcProxy(t, lst, grpcUpstream(t, tc.cert), tc.upYAML)
			cc, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(creds))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			grpcCalls(t, cc)
		})
	}
}

// TestHTTP1ClientToH2Upstream: an HTTP/1.1 client through the sidecar to
// an HTTP/2 (h2c) upstream: bodies both ways, the status and headers.
func TestHTTP1ClientToH2Upstream(t *testing.T) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Proto", r.Proto)
		w.WriteHeader(201)
		fmt.Fprintf(w, "%s %s %s %s", r.Method, r.RequestURI, r.Host, body)
	}), ReadHeaderTimeout: hangGuard}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetUnencryptedHTTP2(true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	p := grpcProxy(t, `{address: "127.0.0.1:0"}`, ln.Addr().String(), ", protocol: h2c")
	resp, body := p.do(t, "POST", "/a/b?c=d", strings.NewReader(strings.Repeat("x", 100<<10)), "Host", "svc.example")
	if resp.StatusCode != 201 || resp.Header.Get("X-Proto") != "HTTP/2.0" || body != "POST /a/b?c=d svc.example "+strings.Repeat("x", 100<<10) {
		t.Errorf("HTTP/1.1 → h2c: %d %q %.60q", resp.StatusCode, resp.Header.Get("X-Proto"), body)
	}
	resp, body = p.do(t, "GET", "/get", nil)
	if resp.StatusCode != 201 || !strings.HasPrefix(body, "GET /get ") {
		t.Errorf("GET: %d %q", resp.StatusCode, body)
	}
}
