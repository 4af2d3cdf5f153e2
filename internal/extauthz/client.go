// Package extauthz runs Envoy external authorization servers
// (envoy.service.auth.v3.Authorization, such as OPA's Envoy plugin) as
// agents: the proxy is the ext_authz client, one unary Check call per
// HTTP request, over a pool of HTTP/2 connections.
//
// The transport is an authcall.Link: the dataplane drives the same
// exchanges as for every agent, the request headers event becomes a
// CheckRequest and the CheckResponse a protocol.Decision (allow with
// header operations, or a block), so that Decision.Normalize and the
// dataplane's rules and limits apply to the server's mutations exactly as
// to any agent's. Where a server can tell, the mapping is Envoy's
// ext_authz filter's, each rule citing the Envoy behaviour it follows;
// see docs/transports.md for the field-by-field mapping and what is
// refused. A connection carries requests only once its server has
// answered a probe Check as an authorization server (Client.probe).
package extauthz

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/authcall"
	"github.com/zentinelproxy/sidecar/internal/grpcclient"
	"github.com/zentinelproxy/sidecar/internal/grpckeep"
	"github.com/zentinelproxy/sidecar/protocol"
)

// event indexes the transport's own counters.
type event int

const (
	evChecks event = iota
	evOK
	evDenied
	evErrorResponse
	evUnsupported
	evIgnored
	evProbeRefused
	evQueryRewrites
	evBadQuery
	evNotServing
	numEvents
)

// EventNames are the labels of the transport's counters, by event
// (exported as sidecar_authz_events_total).
var EventNames = [numEvents]string{
	"checks", "ok", "denied", "error_responses", "unsupported_responses",
	"fields_ignored", "probes_refused", "query_rewrites", "invalid_query_parameters",
	"not_serving",
}

// ErrNotAuthz: the server at the agent's address does not implement
// envoy.service.auth.v3.Authorization.
var ErrNotAuthz = errors.New("extauthz: the server does not implement envoy.service.auth.v3.Authorization")

var _ agentmux.Reporter = (*Client)(nil)

// Client keeps Conns HTTP/2 connections to one authorization server and
// implements agentmux.Agent: each connection is an agentmux.Session over
// an authcall.Link that makes one Check call per request.
type Client struct {
	*agentmux.Pool
	cfg    Config
	caps   protocol.Capabilities
	conns  []*grpc.ClientConn
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	log    zerolog.Logger

	counts [numEvents]atomic.Uint64
}

func (c *Client) count(e event) { c.counts[e].Add(1) }

// Counts returns the transport's counters by EventNames.
func (c *Client) Counts() map[string]uint64 {
	out := make(map[string]uint64, numEvents)
	for i := range c.counts {
		out[EventNames[i]] = c.counts[i].Load()
	}
	return out
}

// Snapshot implements agentmux.Reporter: the pool's connections and
// counters, and the transport's events (Counts).
func (c *Client) Snapshot() agentmux.AgentStatus {
	st := c.Pool.Snapshot()
	st.Events = c.Counts()
	return st
}

// Capabilities are an ext_authz server's: the request headers (a Check
// decides the request before it goes upstream), and with
// WithRequestBody the request body, buffered (the whole body of a
// single chunk inline, saving a round trip).
func (c *Config) Capabilities() protocol.Capabilities {
	return protocol.Capabilities{HandlesRequestHeaders: true, SupportsCancellation: true,
		HandlesRequestBody: c.WithRequestBody, SupportsInlineBody: c.WithRequestBody}
}

// NewClient validates cfg, reads its TLS files and starts connecting;
// Begin fails with agentmux.ErrAgentUnavailable until a connection is up.
func NewClient(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opts, err := grpcclient.DialOptions(&cfg.TLS, cfg.MaxMessageSize, cfg.DialTimeout,
		backoff.DefaultConfig.BaseDelay, backoff.DefaultConfig.MaxDelay, "zentinel-sidecar/0.1 ext_authz")
	if err != nil {
		return nil, fmt.Errorf("%w: agent %q: %v", ErrExtAuthzConfig, cfg.Name, err)
	}
	opts = append(opts, grpc.WithDefaultCallOptions(grpc.ForceCodecV2(newCodec(&cfg))))
	ctx, cancel := context.WithCancel(context.Background())
	c := &Client{
		Pool:   agentmux.NewPool(cfg.Name, "ext_authz"),
		cfg:    cfg,
		caps:   cfg.Capabilities(),
		ctx:    ctx,
		cancel: cancel,
		log:    cfg.Logger.With().Str("address", cfg.Address).Logger(),
	}
	if c.conns, err = grpcclient.NewClientConns(cfg.Address, cfg.Conns, opts); err != nil {
		cancel()
		return nil, fmt.Errorf("%w: agent %q: address %q: %v", ErrExtAuthzConfig, cfg.Name, cfg.Address, err)
	}
	for i := range c.conns {
		c.wg.Add(1)
		go c.maintain(i)
	}
	return c, nil
}

// checker is one connection's authcall.Checker.
type checker struct {
	c  *Client
	cc *grpc.ClientConn
}

// checkMethod is Authorization/Check's full name.
const checkMethod = "/envoy.service.auth.v3.Authorization/Check"

// Check implements authcall.Checker: one Check call, its request encoded
// by the connection's codec straight from m (checkWire).
func (k checker) Check(ctx context.Context, m *protocol.RequestHeaders, body []byte, d *protocol.Decision) error {
	return k.CheckBody(ctx, m, body, false, d)
}

var _ authcall.BodyChecker = checker{}

// CheckBody implements authcall.BodyChecker: Check, telling the server
// whether body was cut at the limit (x-envoy-auth-partial-body).
func (k checker) CheckBody(ctx context.Context, m *protocol.RequestHeaders, body []byte, partial bool, d *protocol.Decision) error {
	c := k.c
	c.count(evChecks)
	w := checkWire{cfg: &c.cfg, m: m, body: body, partial: partial, now: time.Now()}
	r := new(authv3.CheckResponse)
	if err := k.cc.Invoke(ctx, checkMethod, &w, r); err != nil {
		return rpcError(err)
	}
	return c.mapResponse(m, r, d)
}

// ErrNotServing: the server's gRPC health service says it does not serve
// (NOT_SERVING, UNKNOWN, or the service name unknown to it).
var ErrNotServing = errors.New("extauthz: the server's health service says it is not serving")

// health asks the server's grpc.health.v1.Health service about
// HealthService. noHealth reports that the server does not implement it
// (Unimplemented): the Authorization probe decides instead, as before
// health checks.
func (c *Client) health(cli healthpb.HealthClient) (noHealth bool, err error) {
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.DialTimeout)
	defer cancel()
	r, err := cli.Check(ctx, &healthpb.HealthCheckRequest{Service: c.cfg.HealthService})
	switch status.Code(err) {
	case codes.OK:
	case codes.Unimplemented:
		return true, nil
	case codes.NotFound:
		c.count(evNotServing)
		return false, fmt.Errorf("%w: health service: service %q unknown to the server", ErrNotServing, c.cfg.HealthService)
	default:
		return false, fmt.Errorf("health check: %v", rpcError(err))
	}
	if st := r.GetStatus(); st != healthpb.HealthCheckResponse_SERVING {
		c.count(evNotServing)
		return false, fmt.Errorf("%w: health service: %s (service %q)", ErrNotServing, st, c.cfg.HealthService)
	}
	return false, nil
}

// probe asks the server whether it implements Authorization: a Check of
// an empty CheckRequest. Any answer, whatever its verdict, and any error
// status but Unimplemented, is a server of the service (a policy may
// deny or reject a request without attributes); Unimplemented is not.
func (c *Client) probe(cli authv3.AuthorizationClient) error {
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.DialTimeout)
	defer cancel()
	_, err := cli.Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{}})
	switch status.Code(err) {
	case codes.OK:
		return nil
	case codes.Unimplemented:
		return fmt.Errorf("%w: %v", ErrNotAuthz, rpcError(err))
	case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded:
		if c.ctx.Err() == nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("probe: %v", rpcError(err))
		}
	}
	return nil
}

// maintain keeps connection slot's session in the pool while the
// connection is usable (grpckeep).
func (c *Client) maintain(slot int) {
	defer c.wg.Done()
	cc := c.conns[slot]
	cli := authv3.NewAuthorizationClient(cc)
	hcli := healthpb.NewHealthClient(cc)
	// noHealth: the server on this connection has no health service, as
	// its last probe found (kept by the maintaining goroutine only).
	noHealth := false
	grpckeep.Keep(c.ctx, cc, grpckeep.Conn{
		Pool: c.Pool, What: "authorization server", Address: c.cfg.Address,
		Log: c.log.With().Int("conn", slot).Logger(),
		// The health service first, where the server has one; else (and
		// for a server without one) the probe Check.
		Probe: func() error {
			var err error
			if noHealth, err = c.health(hcli); err != nil || !noHealth {
				return err
			}
			return c.probe(cli)
		},
		Health: func() error {
			if noHealth {
				return nil
			}
			var err error
			noHealth, err = c.health(hcli)
			return err
		},
		HealthInterval: c.cfg.HealthInterval,
		Drain:          c.cfg.MessageTimeout + time.Second,
		Refused:        ErrNotAuthz,
		OnRefused:      func() { c.count(evProbeRefused) },
		NewSession: func() *agentmux.Session {
			l := authcall.NewLink(c.cfg.Name, checker{c: c, cc: cc}, c.cfg.WithRequestBody)
			sess := agentmux.NewSession(l, c.caps, agentmux.SessionConfig{
				Name:           c.cfg.Name,
				MaxInFlight:    c.cfg.MaxInFlight,
				MaxQueue:       c.cfg.MaxQueue,
				MessageTimeout: c.cfg.MessageTimeout,
			})
			l.SetSession(sess)
			return sess
		},
	})
}

// Close ends every call and closes the connections.
func (c *Client) Close() error {
	err := c.Pool.Close()
	c.cancel()
	c.wg.Wait()
	for _, cc := range c.conns {
		_ = cc.Close()
	}
	return err
}

// rpcError shortens a gRPC status error for logs and replies, keeping
// context.DeadlineExceeded recognisable.
func rpcError(err error) error {
	s, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := clip(s.Message())
	if s.Code() == codes.DeadlineExceeded {
		return fmt.Errorf("%w: %s", context.DeadlineExceeded, msg)
	}
	return fmt.Errorf("%s: %s", s.Code(), msg)
}
