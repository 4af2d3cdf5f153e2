package bench

import (
	"fmt"
	"slices"
	"sync"

	"github.com/zentinelproxy/sidecar/examples/allowagent"
	"github.com/zentinelproxy/sidecar/internal/config"
)

// Row is one line of the benchmark table: a setup that the same load
// generator then drives with the same concurrency and duration as every
// other row.
type Row struct {
	// Name is shown in the table and names the Go sub-benchmark.
	Name string
	// Order places the row in the table (lower first). The built-in rows
	// use 0 to 30; transports add theirs from 40 on, options (metrics on
	// and off, …) from 100 on.
	Order int
	// Baseline marks the row every other row is compared to: the sidecar
	// without agents. Exactly one registered row sets it.
	Baseline bool
	// BodySize is the request body in bytes: 0 sends GET, more sends POST
	// with a body of that size.
	BodySize int
	// Versus names another row this one is compared with in a note under
	// the table: the same setup without the feature the row prices.
	Versus string
	// Setup starts what the row needs (a sidecar, agents, …) with env's
	// helpers, which also stop it all when the row ends, and returns the
	// host:port the load generator targets.
	Setup func(env *Env) (addr string, err error)
}

var (
	rowsMu sync.Mutex
	rows   []Row
)

// Register adds a row to the table. Call it from an init function of a file
// in this package; it panics on a duplicate name or a second baseline
// (programming errors, found on the first run).
func Register(r Row) {
	rowsMu.Lock()
	defer rowsMu.Unlock()
	for _, o := range rows {
		if o.Name == r.Name {
			panic(fmt.Sprintf("bench: row %q registered twice", r.Name))
		}
		if o.Baseline && r.Baseline {
			panic(fmt.Sprintf("bench: rows %q and %q are both baselines", o.Name, r.Name))
		}
	}
	rows = append(rows, r)
}

// Rows returns the registered rows in table order.
func Rows() []Row {
	rowsMu.Lock()
	defer rowsMu.Unlock()
	out := slices.Clone(rows)
	slices.SortStableFunc(out, func(a, b Row) int { return a.Order - b.Order })
	return out
}

// BufferedBodySize is the request body of the buffered-body row.
const BufferedBodySize = 4 << 10

func init() {
	Register(Row{
		Name:  "upstream direct",
		Order: 0,
		Setup: func(env *Env) (string, error) { return env.UpstreamAddr, nil },
	})
	Register(Row{
		Name:     "sidecar, no agent",
		Order:    10,
		Baseline: true,
		Setup: func(env *Env) (string, error) {
			return env.StartSidecar(env.Config(), nil)
		},
	})
	Register(Row{
		// What a 4 KiB body costs without agents: the reference for the
		// buffered-body row.
		Name:     "sidecar, no agent, 4 KiB POST",
		Order:    15,
		BodySize: BufferedBodySize,
		Setup: func(env *Env) (string, error) {
			return env.StartSidecar(env.Config(), nil)
		},
	})
	Register(Row{
		Name:  "sidecar + UDS agent (headers)",
		Order: 20,
		Setup: func(env *Env) (string, error) {
			a, err := env.StartUDSAgent("allow", allowagent.New(false))
			if err != nil {
				return "", err
			}
			return env.StartSidecar(env.Config(a), nil)
		},
	})
	Register(Row{
		Name:     "sidecar + UDS agent (4 KiB buffered body)",
		Order:    30,
		BodySize: BufferedBodySize,
		Setup: func(env *Env) (string, error) {
			a, err := env.StartUDSAgent("allow", allowagent.New(true))
			if err != nil {
				return "", err
			}
			a.RequestBody.Mode = config.BodyBuffered
			return env.StartSidecar(env.Config(a), nil)
		},
	})
}
