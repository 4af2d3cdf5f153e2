package bench

import (
	"context"
	"fmt"
	"net"
	"net/http"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// The rows of the one-call authorization transports: an Envoy ext_authz
// server and a forward-auth endpoint that allow every request, so that
// they compare with the headers-only rows of the other transports.
func init() {
	Register(Row{
		Name:  "sidecar + ext_authz agent",
		Order: 46,
		Setup: func(env *Env) (string, error) {
			a, err := env.StartExtAuthzAgent("allow")
			if err != nil {
				return "", err
			}
			return env.StartSidecar(env.Config(a), nil)
		},
	})
	Register(Row{
		Name:  "sidecar + http_auth agent",
		Order: 47,
		Setup: func(env *Env) (string, error) {
			a, err := env.StartHTTPAuthAgent("allow")
			if err != nil {
				return "", err
			}
			return env.StartSidecar(env.Config(a), nil)
		},
	})
}

// allowAuthz answers every Check OK.
type allowAuthz struct {
	authv3.UnimplementedAuthorizationServer
}

// Check implements authv3.AuthorizationServer.
func (allowAuthz) Check(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	return &authv3.CheckResponse{Status: &rpcstatus.Status{}}, nil
}

// StartExtAuthzAgent serves an ext_authz server that allows every request
// on a loopback port until the row ends, and returns its configuration
// entry (transport ext_authz).
func (e *Env) StartExtAuthzAgent(name string) (config.Agent, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return config.Agent{}, fmt.Errorf("%w: agent %s: %v", ErrBenchSetup, name, err)
	}
	srv := grpc.NewServer()
	authv3.RegisterAuthorizationServer(srv, allowAuthz{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	stop := context.AfterFunc(e.ctx, srv.Stop)
	e.Defer(func() { stop(); srv.Stop(); <-done })
	return config.Agent{Name: name, Transport: config.TransportExtAuthz, Address: ln.Addr().String()}, nil
}

// StartHTTPAuthAgent serves a forward-auth endpoint that answers 200 to
// every subrequest on a loopback port until the row ends, and returns
// its configuration entry (transport http_auth).
func (e *Env) StartHTTPAuthAgent(name string) (config.Agent, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return config.Agent{}, fmt.Errorf("%w: agent %s: %v", ErrBenchSetup, name, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Auth-User", "bench")
	})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	stop := context.AfterFunc(e.ctx, func() { _ = srv.Close() })
	e.Defer(func() { stop(); _ = srv.Close(); <-done })
	return config.Agent{Name: name, Transport: config.TransportHTTPAuth, Address: "http://" + ln.Addr().String() + "/auth"}, nil
}
