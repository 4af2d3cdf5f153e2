package extauthz_test

import (
	"context"
	"net"
	"strings"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// serveAuthHealth serves an authorization server that allows every
// request, with grpc-go's health service beside it, whose statuses the
// test sets.
func serveAuthHealth(t *testing.T) (*authServer, *health.Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	s := &authServer{h: func(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
		return okResponse(nil), nil
	}}
	authv3.RegisterAuthorizationServer(gs, s)
	hs := health.NewServer() // "" is SERVING from the start
	healthpb.RegisterHealthServer(gs, hs)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	return s, hs, ln.Addr().String()
}

func probes(s *authServer) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.probes
}

// TestHealth checks readiness through the server's gRPC health service:
// SERVING is ready (no probe Check made), NOT_SERVING takes the agent out
// of rotation with the reason on /status, SERVING again brings it back;
// health_service names the service asked; a server without the health
// service is probed with a Check as before.
func TestHealth(t *testing.T) {
	s, hs, addr := serveAuthHealth(t)
	url, up, a := proxy(t, addr, `
    options:
      health_interval: 100ms`, false)
	if resp, _ := get(t, url+"/"); resp.StatusCode != 200 {
		t.Fatalf("serving: status %d", resp.StatusCode)
	}
	if n := probes(s); n != 0 {
		t.Errorf("%d probe Checks made to a server whose health service answers", n)
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	testutil.WaitFor(t, "not ready on NOT_SERVING", func() bool {
		st := a.Snapshot()
		return !st.Ready && strings.Contains(st.LastError, "NOT_SERVING") && st.Events["not_serving"] > 0
	})
	if resp, _ := get(t, url+"/"); resp.StatusCode != 403 {
		t.Errorf("not serving: status %d, want 403", resp.StatusCode)
	}
	if _, n := up.get(); n != 1 {
		t.Errorf("upstream got %d requests, want 1", n)
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	testutil.WaitFor(t, "ready again on SERVING", func() bool {
		st := a.Snapshot()
		return st.Ready && st.LastError == ""
	})
	if resp, _ := get(t, url+"/"); resp.StatusCode != 200 {
		t.Errorf("serving again: status %d", resp.StatusCode)
	}

	t.Run("health_service", func(t *testing.T) {
		_, hs, addr := serveAuthHealth(t)
		hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
		hs.SetServingStatus("authz", healthpb.HealthCheckResponse_NOT_SERVING)
		_, _, a := proxy(t, addr, `
    options:
      health_service: authz
      health_interval: 100ms`, true)
		testutil.WaitFor(t, "not ready while authz is NOT_SERVING", func() bool {
			st := a.Snapshot()
			return !st.Ready && strings.Contains(st.LastError, `NOT_SERVING (service "authz")`)
		})
		hs.SetServingStatus("authz", healthpb.HealthCheckResponse_SERVING)
		testutil.WaitFor(t, "ready once authz serves (the server as a whole still does not)", func() bool {
			return a.Snapshot().Ready
		})
		_, _, b := proxy(t, addr, `
    options:
      health_service: other`, true)
		testutil.WaitFor(t, "a service unknown to the server is not ready", func() bool {
			st := b.Snapshot()
			return !st.Ready && strings.Contains(st.LastError, `service "other" unknown`)
		})
	})

	t.Run("no health service", func(t *testing.T) {
		s, addr := startAuth(t, func(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
			return okResponse(nil), nil
		}, nil)
		url, _, a := proxy(t, addr, "", false)
		if resp, _ := get(t, url+"/"); resp.StatusCode != 200 {
			t.Errorf("status %d", resp.StatusCode)
		}
		if probes(s) == 0 || !a.Snapshot().Ready {
			t.Errorf("a server without the health service: %d probe Checks, ready %v", probes(s), a.Snapshot().Ready)
		}
	})
}
