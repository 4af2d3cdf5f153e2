package bench

import (
	"context"
	"time"

	"github.com/zentinelproxy/sidecar/examples/allowagent"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// Rows that price the policy features against the UDS headers row:
//
//   - the decision cache, warm: what a request costs when the agent's
//     answer is in the cache;
//   - a shadow agent that takes 100 ms per event next to the enforcing
//     agent: the enforcing row's latency must not change (the request
//     never waits for the shadow agent; its events past the queue are
//     dropped and counted);
//   - a hung fail-open agent (100 ms message timeout) without and with a
//     circuit breaker: without, every request waits for the timeout; with,
//     the circuit opens after 5 failures and requests pass at once until
//     a probe every cool-down.
func init() {
	Register(Row{
		// The load repeats one request, so after the first the cache
		// answers every request: compare with the headers row (the agent
		// asked every time) and the baseline (no agent).
		Name:   "sidecar + UDS agent (headers), decision cache warm",
		Order:  105,
		Versus: "sidecar + UDS agent (headers)",
		Setup: func(env *Env) (string, error) {
			a, err := env.StartUDSAgent("allow", allowagent.New(false))
			if err != nil {
				return "", err
			}
			a.DecisionCache = config.DecisionCache{Key: []string{config.KeyMethod, config.KeyHost, config.KeyPath}}
			return env.StartSidecar(env.Config(a), nil)
		},
	})
	Register(Row{
		Name:   "sidecar + UDS agent (headers) + shadow agent (100 ms/event)",
		Order:  110,
		Versus: "sidecar + UDS agent (headers)",
		Setup: func(env *Env) (string, error) {
			a, err := env.StartUDSAgent("allow", allowagent.New(false))
			if err != nil {
				return "", err
			}
			s, err := env.StartUDSAgent("shadow", newSleepAgent(100*time.Millisecond))
			if err != nil {
				return "", err
			}
			s.Shadow = true
			return env.StartSidecar(env.Config(s, a), nil)
		},
	})
	Register(Row{
		Name:  "sidecar + hung fail-open agent (100 ms timeout)",
		Order: 111,
		Setup: func(env *Env) (string, error) { return hungRow(env, 0) },
	})
	Register(Row{
		Name:   "sidecar + hung fail-open agent (100 ms timeout), circuit breaker",
		Order:  112,
		Versus: "sidecar + hung fail-open agent (100 ms timeout)",
		Setup:  func(env *Env) (string, error) { return hungRow(env, 5) },
	})
}

func hungRow(env *Env, failures int) (string, error) {
	a, err := env.StartUDSAgent("hung", newSleepAgent(time.Hour))
	if err != nil {
		return "", err
	}
	a.FailureMode = config.FailOpen
	a.Timeouts.Message = 100 * time.Millisecond
	a.CircuitBreaker = config.CircuitBreaker{Failures: failures, Cooldown: time.Second}
	return env.StartSidecar(env.Config(a), nil)
}

// sleepAgent allows every request after d (or when the proxy cancels it).
type sleepAgent struct {
	sdk.Base
	d time.Duration
}

func newSleepAgent(d time.Duration) *sleepAgent {
	return &sleepAgent{Base: sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true, SupportsCancellation: true}}, d: d}
}

// OnRequestHeaders implements sdk.Handler.
func (s *sleepAgent) OnRequestHeaders(ctx context.Context, _ *protocol.RequestHeaders, _ *protocol.Decision) error {
	t := time.NewTimer(s.d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	return nil
}
