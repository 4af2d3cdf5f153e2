//go:build !nowaf

package main

import (
	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/examples/corazawaf"
	"github.com/zentinelproxy/sidecar/internal/config"
)

// newDemoWAF is the agent of `sidecar demo -agent waf`: Coraza with the
// OWASP Core Rule Set at paranoia level 1, blocking. It sets the demo
// agent's body policies for it: request bodies buffered (and inlined in
// the request headers), response bodies not sent.
func newDemoWAF(a *config.Agent, log *zerolog.Logger) (demoWAF, error) {
	a.RequestBody.Mode = config.BodyBuffered
	a.ResponseBody.Mode = config.BodyNone
	cfg := corazawaf.DefaultConfig()
	// The demo is reached by IP address (curl 127.0.0.1:8080), which
	// CRS rule 920350 flags on every request.
	cfg.Exclusions = []corazawaf.RuleRange{{From: 920350, To: 920350}}
	h, err := corazawaf.New(cfg, log)
	if err != nil {
		return nil, err
	}
	return h, nil
}
