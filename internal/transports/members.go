package transports

import (
	"errors"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
)

// withMembers builds the agent a with build: one instance for its address,
// or, with addresses, one per member combined in an agentmux.Multi. A
// member that cannot be built closes the ones built before it.
func withMembers(a *config.Agent, log zerolog.Logger, build func(m *config.Agent, log zerolog.Logger) (agentmux.Agent, error)) (agentmux.Agent, error) {
	if len(a.Addresses) == 0 {
		return build(a, log)
	}
	var members []agentmux.Agent
	for _, addr := range a.Members() {
		m := *a
		m.Address, m.Addresses = addr, nil
		inst, err := build(&m, log.With().Str("member", addr).Logger())
		if err != nil {
			for _, x := range members {
				err = errors.Join(err, x.Close())
			}
			return nil, err
		}
		members = append(members, inst)
	}
	return agentmux.NewMulti(a.Name, a.Transport, members, a.FailoverOn()), nil
}
