package bench

import (
	"os"
	"time"

	"github.com/zentinelproxy/sidecar/dataplane"
	"github.com/zentinelproxy/sidecar/examples/allowagent"
	"github.com/zentinelproxy/sidecar/internal/accesslog"
	"github.com/zentinelproxy/sidecar/internal/metrics"
)

// Rows that price the operability features on the UDS headers row: the
// same setup without and with Prometheus metrics (scraped every second,
// as a busy Prometheus would), and with the access log writing every
// request on top. Compare "metrics on" with "metrics off".
func init() {
	Register(Row{
		Name:  "sidecar + UDS agent (headers), metrics off",
		Order: 100,
		Setup: func(env *Env) (string, error) { return opsRow(env, false, false) },
	})
	Register(Row{
		Name:   "sidecar + UDS agent (headers), metrics on",
		Order:  101,
		Versus: "sidecar + UDS agent (headers), metrics off",
		Setup:  func(env *Env) (string, error) { return opsRow(env, true, false) },
	})
	Register(Row{
		Name:   "sidecar + UDS agent (headers), metrics + access log",
		Order:  102,
		Versus: "sidecar + UDS agent (headers), metrics off",
		Setup:  func(env *Env) (string, error) { return opsRow(env, true, true) },
	})
}

// scrapeEvery is how often the metrics rows gather the registry.
const scrapeEvery = time.Second

func opsRow(env *Env, withMetrics, withAccessLog bool) (string, error) {
	a, err := env.StartUDSAgent("allow", allowagent.New(false))
	if err != nil {
		return "", err
	}
	var obs []dataplane.Observer
	if withMetrics {
		m, err := metrics.New(metrics.Config{Version: "bench"})
		if err != nil {
			return "", err
		}
		obs = append(obs, m)
		t := time.NewTicker(scrapeEvery)
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					_, _ = m.Registry().Gather()
				}
			}
		}()
		env.Defer(func() { t.Stop(); close(stop); <-done })
	}
	if withAccessLog {
		// Real write calls, nothing kept.
		f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
		if err != nil {
			return "", err
		}
		w := accesslog.NewWriter(f, 0, 0, 0)
		env.Defer(func() { _ = w.Close(); _ = f.Close() })
		l, err := accesslog.New(w, accesslog.DefaultConfig())
		if err != nil {
			return "", err
		}
		obs = append(obs, l)
	}
	env.Dataplane = func(c *dataplane.Config) { c.Observer = dataplane.Observers(obs...) }
	return env.StartSidecar(env.Config(a), nil)
}
