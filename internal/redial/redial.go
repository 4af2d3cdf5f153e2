// Package redial keeps one connection alive: connect, serve it until it
// ends, wait with exponential backoff and jitter, and again, until the
// context ends. Every transport's reconnect loop (the proxy's UDS and gRPC
// clients, the agent side of reverse connections) is this loop.
package redial

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/rs/zerolog"
)

// Defaults of the proxy's connections to its agents, shared by every
// transport that dials (udsclient, grpcclient, extproc) and the
// configuration file (internal/config: timeouts.connect,
// timeouts.handshake). A transport with one budget for both (gRPC) takes
// their sum, as its configuration does.
const (
	// DefaultConnectTimeout bounds one connection attempt.
	DefaultConnectTimeout = time.Second
	// DefaultHandshakeTimeout bounds the handshake on a new connection.
	DefaultHandshakeTimeout = 2 * time.Second
	// DefaultMin and DefaultMax bound the proxy's reconnect delay.
	DefaultMin = 50 * time.Millisecond
	DefaultMax = 5 * time.Second
)

// Config tunes a Loop.
type Config struct {
	// Min and Max bound the delay between attempts; it doubles per failure.
	Min, Max time.Duration
	// Stable is how long a connection must serve before its loss resets the
	// delay to Min. A connection dropped sooner keeps backing off, so a
	// peer that accepts and drops at once cannot make the loop spin.
	// Zero means one second.
	Stable time.Duration
	// What names the connection in logs ("agent connection").
	What string
	// Logger receives one line per outage (first failure, then every 20th)
	// and one per recovery.
	Logger zerolog.Logger
	// OnError, if set, is told every connect failure and every loss.
	OnError func(error)
}

// ErrPermanent marks a connect error that retrying soon cannot fix (a
// refused registration): the next attempt waits Max and the error is
// logged every time. Wrap it: fmt.Errorf("%w: ...", redial.ErrPermanent).
var ErrPermanent = errors.New("redial: permanent refusal")

// Loop runs connect and then the serve function it returns, over and over,
// until ctx ends. connect dials and handshakes; serve blocks until the
// connection is over and returns why.
func Loop(ctx context.Context, cfg Config, connect func(context.Context) (serve func() error, err error)) {
	if cfg.Stable <= 0 {
		cfg.Stable = time.Second
	}
	if cfg.What == "" {
		cfg.What = "connection"
	}
	backoff := cfg.Min
	failures := 0
	for ctx.Err() == nil {
		serve, err := connect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if cfg.OnError != nil {
				cfg.OnError(err)
			}
			failures++
			wait := backoff
			switch {
			case errors.Is(err, ErrPermanent):
				wait = cfg.Max
				cfg.Logger.Error().Err(err).Dur("retry_in", wait).Msg(cfg.What + " refused")
			case failures == 1 || failures%20 == 0:
				// Not every attempt: a peer that is down must not flood the log.
				cfg.Logger.Warn().Err(err).Int("attempt", failures).Dur("retry_in", wait).Msg(cfg.What + " failed")
			}
			if !Sleep(ctx, Jitter(wait)) {
				return
			}
			backoff = min(backoff*2, cfg.Max)
			continue
		}
		if failures > 0 {
			cfg.Logger.Info().Int("after_attempts", failures).Msg(cfg.What + " established")
		}
		failures = 0
		start := time.Now()
		err = serve()
		if ctx.Err() != nil {
			return
		}
		if cfg.OnError != nil && err != nil {
			cfg.OnError(err)
		}
		wait := cfg.Min
		if time.Since(start) < cfg.Stable {
			wait = backoff
			backoff = min(backoff*2, cfg.Max)
		} else {
			backoff = cfg.Min
		}
		cfg.Logger.Warn().Err(err).Dur("retry_in", wait).Msg(cfg.What + " lost; reconnecting")
		if !Sleep(ctx, Jitter(wait)) {
			return
		}
	}
}

// Jitter spreads d by ±25% so that many peers do not retry in lockstep.
func Jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d*3/4 + time.Duration(rand.Int64N(int64(d)/2+1))
}

// Sleep waits d or until ctx ends; it reports whether the full d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
