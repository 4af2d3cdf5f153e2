package agentcheck

import (
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/examples/corazawaf"
	"github.com/zentinelproxy/sidecar/sdk"
)

// TestCorazaWAFAgent runs every check against examples/corazawaf (the
// OWASP Core Rule Set on Coraza) over every transport: all PASS.
func TestCorazaWAFAgent(t *testing.T) {
	if testing.Short() {
		t.Skip("loading the Core Rule Set takes seconds")
	}
	newWAF := func(t *testing.T) sdk.Handler {
		h, err := corazawaf.New(corazawaf.DefaultConfig(), nil)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	transports := []string{TransportUDS, TransportGRPC, TransportReverse}
	cfg := Config{Token: "s3cret", Requests: 200}
	if raceEnabled {
		// The rule set runs ten times slower or worse: one transport, a
		// bound per answer that fits 64 requests in flight.
		transports = transports[:1]
		cfg.Timeout, cfg.Requests = 30*time.Second, 50
	}
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			addr := serve(t, tr, newWAF(t))
			c := cfg
			c.Transport, c.Address = tr, addr
			rep := run(t, c)
			wantAllPass(t, rep)
		})
	}
}
