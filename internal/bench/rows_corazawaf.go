package bench

import (
	"time"

	"github.com/zentinelproxy/sidecar/examples/corazawaf"
	"github.com/zentinelproxy/sidecar/internal/config"
)

// The WAF rows: the Coraza agent with the OWASP Core Rule Set (paranoia
// level 1, blocking, the recommended settings) on the GET, and on the
// 4 KiB POST with its body buffered and inlined with the headers; both
// with the response headers. Compare them with the allow-everything agent
// on the same requests.
func init() {
	Register(Row{
		Name:   "sidecar + Coraza CRS agent (headers)",
		Order:  34,
		Versus: "sidecar + UDS agent (headers)",
		Setup:  func(env *Env) (string, error) { return corazaRow(env, false) },
	})
	Register(Row{
		Name:     "sidecar + Coraza CRS agent (headers+body)",
		Order:    35,
		BodySize: BufferedBodySize,
		Versus:   "sidecar + UDS agent (4 KiB buffered body)",
		Setup:    func(env *Env) (string, error) { return corazaRow(env, true) },
	})
}

func corazaRow(env *Env, body bool) (string, error) {
	cfg := corazawaf.DefaultConfig()
	// The load generator posts application/octet-stream, which CRS
	// refuses by default (rule 920420).
	cfg.AllowedContentTypes = []string{"application/x-www-form-urlencoded", "multipart/form-data",
		"application/json", "application/octet-stream"}
	h, err := corazawaf.New(cfg, nil)
	if err != nil {
		return "", err
	}
	// Runs after the agent stopped serving (stops run in reverse).
	env.Defer(func() { _ = h.Close() })
	a, err := env.StartUDSAgent("coraza", h)
	if err != nil {
		return "", err
	}
	if body {
		a.RequestBody.Mode = config.BodyBuffered
	}
	// The rules take tens of milliseconds on a 4 KiB body of one argument,
	// and 64 connections queue on 2 CPUs: the default 1s would time
	// requests out.
	a.Timeouts.Message, a.Timeouts.Request = 30*time.Second, 30*time.Second
	return env.StartSidecar(env.Config(a), nil)
}
