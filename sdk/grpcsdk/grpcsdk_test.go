package grpcsdk_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/zentinelproxy/sidecar/grpcagent/pb"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/sdk/grpcsdk"
)

// rawProxy dials an agent server with plain generated gRPC code, the way
// a proxy in another language would.
func rawProxy(t *testing.T, addr string) pb.AgentProcessorV2Client {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return pb.NewAgentProcessorV2Client(cc)
}

type sickHandler struct{ sdk.Base }

func (sickHandler) Healthy(context.Context) error { return errors.New("no database") }

func (sickHandler) OnRequestHeaders(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
	if string(m.URI) == "/fail" {
		return errors.New("internal detail")
	}
	d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderSet, Name: []byte("x-uri"), Value: m.URI})
	return nil
}

// TestGRPCServerEmbedded: NewGRPCServer serves the agent next to another
// protobuf service, and speaks to a proxy that uses only generated code:
// capabilities, version refusal, health, a decision, an agent error.
func TestGRPCServerEmbedded(t *testing.T) {
	caps := protocol.Capabilities{HandlesRequestHeaders: true, SupportsCancellation: true, MaxConcurrentRequests: 9}
	srv := grpcsdk.NewServer(sickHandler{sdk.Base{Caps: caps}}, &grpcsdk.Options{Name: "embedded"})
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	cli := rawProxy(t, ln.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	resp, err := cli.GetCapabilities(ctx, &pb.CapabilityRequest{ProtocolVersion: 2, ClientName: "test", SupportedFeatures: []string{"cancellation"}})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetAccepted() || resp.AgentName != "embedded" || resp.ProtocolVersion != 2 || resp.Capabilities.GetMaxConcurrentRequests() != 9 {
		t.Fatalf("capabilities %v", resp)
	}
	resp, err = cli.GetCapabilities(ctx, &pb.CapabilityRequest{ProtocolVersion: 1})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetAccepted() || resp.Error == "" {
		t.Fatalf("version 1 not refused: %v", resp)
	}

	h, err := cli.HealthCheck(ctx, &pb.HealthRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if h.Status != pb.HealthResponse_NOT_SERVING || h.Message != "no database" {
		t.Fatalf("health %v", h)
	}
	// The other service works through the same codec.
	if _, err := healthpb.NewHealthClient(grpcConn(t, ln.Addr().String())).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("embedded health service: %v", err)
	}

	st, err := cli.ProcessStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(id uint64, uri string) {
		t.Helper()
		if err := st.Send(&pb.AgentMessage{RequestId: id, Payload: &pb.AgentMessage_RequestHeaders{
			RequestHeaders: &pb.RequestHeaders{Method: []byte("GET"), Uri: []byte(uri)}}}); err != nil {
			t.Fatal(err)
		}
	}
	send(11, "/ok")
	send(12, "/fail")
	got := map[uint64]*pb.AgentMessage{}
	for len(got) < 2 {
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got[m.RequestId] = m
	}
	d := got[11].GetDecision()
	if d.GetAllow() == nil || len(d.RequestHeaders) != 1 || string(d.RequestHeaders[0].Value) != "/ok" {
		t.Fatalf("decision for 11: %v", got[11])
	}
	e := got[12].GetAgentError()
	if e == nil || e.Message == "" || e.Message == "internal detail" {
		t.Fatalf("agent error for 12: %v (the handler's text must not leak)", got[12])
	}
	_ = st.CloseSend()
}

func grpcConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// TestServeGRPCStops: ServeGRPC returns nil once its context ends, with a
// stream open and a handler running.
func TestServeGRPCStops(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- grpcsdk.Serve(ctx, ln, &sdk.Base{}, nil) }()
	cli := rawProxy(t, ln.Addr().String())
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	st, err := cli.ProcessStream(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&pb.AgentMessage{RequestId: 1, Payload: &pb.AgentMessage_Ping{Ping: &pb.Ping{Sequence: 5}}}); err != nil {
		t.Fatal(err)
	}
	m, err := st.Recv()
	if err != nil || m.GetPong().GetSequence() != 5 {
		t.Fatalf("pong: %v %v", m, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ServeGRPC: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeGRPC did not return")
	}
	if _, err := st.Recv(); err == nil {
		t.Fatal("stream still open after the server stopped")
	}
}

// TestGRPCClientRequestOption: GetCapabilities declares
// supports_client_request to a proxy that offers client_request, unless
// Options.NoClientRequest.
func TestGRPCClientRequestOption(t *testing.T) {
	for _, off := range []bool{false, true} {
		srv := grpcsdk.NewServer(sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true}}, &grpcsdk.Options{NoClientRequest: off})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = srv.Serve(ln) }()
		cli := rawProxy(t, ln.Addr().String())
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := cli.GetCapabilities(ctx, &pb.CapabilityRequest{ProtocolVersion: 2, ClientName: "test", SupportedFeatures: []string{protocol.FeatureClientRequest}})
		cancel()
		srv.Stop()
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.GetCapabilities().GetSupportsClientRequest(); got == off {
			t.Fatalf("NoClientRequest=%v: supports_client_request %v", off, got)
		}
	}
}
