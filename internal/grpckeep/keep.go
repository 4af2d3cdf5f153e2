// Package grpckeep keeps the sessions of a transport whose every request
// is its own RPC on a pooled gRPC connection (ext_proc's streams,
// ext_authz's Check calls): a connection's session joins the pool when
// the connection is READY and its server answers a probe as the protocol's
// server, and fails (its waiting requests fail at once) when the
// connection breaks; the other connections' sessions are not affected.
//
// A server that answers the probe as another service (Unimplemented) is
// probed again after a delay that doubles from RetryMin to RetryMax, and
// logged once until it is accepted; /readyz and /status give the reason
// through the pool's last error.
//
// With Health, a live session is checked every HealthInterval: a failed
// check takes it out of the pool at once (no new requests), lets the
// requests in flight on it finish within Drain, and probes again from
// RetryMin, as after a refusal.
package grpckeep

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
)

// The delays between probes of a server that refused them.
const (
	RetryMin = time.Second
	RetryMax = 30 * time.Second
)

// Conn is one pooled connection and what its transport does on it.
type Conn struct {
	// Pool is the transport's pool of sessions.
	Pool *agentmux.Pool
	// What names the server in errors and logs ("processor",
	// "authorization server"); Address is its address.
	What, Address string
	// Log is the connection's logger.
	Log zerolog.Logger
	// Probe asks the server whether it speaks the protocol; an error
	// wrapping Refused means it does not.
	Probe   func() error
	Refused error
	// OnRefused counts a refused probe.
	OnRefused func()
	// NewSession makes the connection's session once a probe passed.
	NewSession func() *agentmux.Session
	// Health, when set, is asked every HealthInterval whether a live
	// session's server still serves; an error takes the session out of
	// the pool (its requests in flight get Drain to finish).
	Health         func() error
	HealthInterval time.Duration
	Drain          time.Duration
}

// Keep runs c's connection cc until ctx is done.
func Keep(ctx context.Context, cc *grpc.ClientConn, c Conn) {
	var sess *agentmux.Session
	drop := func(why string) {
		if sess == nil {
			return
		}
		c.Pool.Remove(sess)
		sess.Fail(fmt.Errorf("%s connection %s", c.What, why))
		_ = sess.Close()
		sess = nil
		if ctx.Err() == nil {
			c.Log.Warn().Str("state", why).Msg(c.What + " connection lost")
		}
	}
	defer drop("closed")
	cc.Connect()
	retry := RetryMin // the next probe's delay after a refusal
	refused := false  // the last probe on this connection was refused
	for {
		st := cc.GetState()
		var recheck time.Duration
		switch st {
		case connectivity.Ready:
			if sess != nil {
				if c.Health == nil {
					break
				}
				if err := c.Health(); err != nil {
					c.Pool.SetLastError(fmt.Errorf("%s %s: %v", c.What, c.Address, err))
					c.Log.Warn().Err(err).Msg(c.What + " not serving; draining its connection")
					c.Pool.Remove(sess)
					go drain(sess, c.Drain, fmt.Errorf("%s not serving: %v", c.What, err))
					sess = nil
					recheck = retry
					retry = min(2*retry, RetryMax)
					break
				}
				recheck = c.HealthInterval
				break
			}
			if err := c.Probe(); err != nil {
				c.Pool.SetLastError(fmt.Errorf("%s %s: %v", c.What, c.Address, err))
				if errors.Is(err, c.Refused) {
					c.OnRefused()
					if !refused {
						c.Log.Error().Err(err).Msg(c.What + " refused")
					}
					refused = true
				}
				recheck = retry
				retry = min(2*retry, RetryMax)
				break
			}
			refused, retry = false, RetryMin
			sess = c.NewSession()
			c.Pool.SetLastError(nil)
			c.Pool.Add(sess)
			if c.Health != nil {
				recheck = c.HealthInterval
			}
		case connectivity.Idle:
			// Idle after a quiet period or a GOAWAY: reconnect now, and
			// keep the session (new requests wait for the connection).
			cc.Connect()
		case connectivity.TransientFailure, connectivity.Shutdown:
			c.Pool.SetLastError(fmt.Errorf("connection to %s %s: %s", c.What, c.Address, st))
			drop(st.String())
			refused, retry = false, RetryMin
		}
		if !waitState(ctx, cc, st, recheck) {
			return
		}
	}
}

// waitState waits for cc to leave state st, or d (0: no limit) to pass;
// false when ctx is done.
func waitState(ctx context.Context, cc *grpc.ClientConn, st connectivity.State, d time.Duration) bool {
	if d == 0 {
		return cc.WaitForStateChange(ctx, st)
	}
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	cc.WaitForStateChange(wctx, st)
	return ctx.Err() == nil
}

// drain ends sess, out of the pool, once its requests in flight are done
// or within d; what is left then fails with err.
func drain(sess *agentmux.Session, d time.Duration, err error) {
	deadline := time.Now().Add(d)
	for sess.InFlight() > 0 && time.Now().Before(deadline) {
		select {
		case <-sess.Done():
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
	sess.Fail(err)
	_ = sess.Close()
}
