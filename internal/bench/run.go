// Package bench is the sidecar's end-to-end load benchmark on loopback:
// one load generator, one concurrency and one duration for every row of a
// table (upstream direct, sidecar without agents, sidecar with agents over
// each transport, …), so that the rows compare.
//
// Run it as a command:
//
//	go run ./bench/cmd/e2e -duration 3s -concurrency 64
//
// or as Go benchmarks (b.N requests per row):
//
//	go test -run='^$' -bench=E2E ./bench/
//
// Rows are a registry: a file of this package adds one with Register from
// its init function.
//
// The load generator, the sidecar, the agents and the upstream run in one
// process (agents over real sockets all the same) and share the machine's
// CPUs, so absolute numbers say little about a production deployment; the
// ratios between rows are what the table is for. Besides throughput and
// latency, the table shows the process's CPU time per request, which
// depends far less than throughput on what else runs on the machine; use
// -rounds on a shared machine.
package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"slices"
	"time"

	"github.com/rs/zerolog"
)

// Options of a benchmark run.
type Options struct {
	// Duration of each row's measurement (default 3s).
	Duration time.Duration
	// Warmup before each row's measurement (default 300ms).
	Warmup time.Duration
	// Concurrency is the number of keep-alive connections, each with one
	// request in flight (default 64).
	Concurrency int
	// LatencyDuration is the length of a second measurement of each row
	// with a single connection: the latency a request sees when nothing
	// queues in front of it (default 1s; negative: skipped). Under load
	// the median is mostly queueing (Little's law: concurrency/throughput).
	LatencyDuration time.Duration
	// Rounds repeats the whole table this many times, rows interleaved
	// (every other round in reverse order), and reports for each row the
	// round with its median throughput: on a shared machine, other load
	// then hits every row alike (default 1).
	Rounds int
	// Match selects rows by name (nil: all).
	Match *regexp.Regexp
	// Logger for the sidecars and agents (default: errors to stderr).
	Logger *zerolog.Logger
}

func (o *Options) defaults() {
	if o.Duration <= 0 {
		o.Duration = 3 * time.Second
	}
	if o.Warmup < 0 {
		o.Warmup = 0
	} else if o.Warmup == 0 {
		o.Warmup = 300 * time.Millisecond
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 64
	}
	if o.Rounds <= 0 {
		o.Rounds = 1
	}
	if o.LatencyDuration == 0 {
		o.LatencyDuration = time.Second
	}
	if o.Logger == nil {
		l := zerolog.New(os.Stderr).Level(zerolog.ErrorLevel).With().Timestamp().Logger()
		o.Logger = &l
	}
}

// RowResult is one row's measurement.
type RowResult struct {
	Row Row
	// Result is the measurement at Options.Concurrency.
	Result Result
	// Latency is the measurement with one connection (zero when skipped).
	Latency Result
	Err     error
}

// Run measures every selected row in table order. A row that fails to
// set up is reported in its RowResult and the run goes on.
func Run(ctx context.Context, opts Options) ([]RowResult, error) {
	opts.defaults()
	up, stopUp, err := StartUpstream()
	if err != nil {
		return nil, err
	}
	defer stopUp()
	dir, err := os.MkdirTemp("", "scbench")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)

	var selected []Row
	for _, r := range Rows() {
		if opts.Match == nil || opts.Match.MatchString(r.Name) {
			selected = append(selected, r)
		}
	}
	rounds := make([][]RowResult, len(selected))
	for round := range opts.Rounds {
		for _, i := range roundOrder(len(selected), round) {
			if ctx.Err() != nil {
				break
			}
			r := selected[i]
			loads := []LoadConfig{{Concurrency: opts.Concurrency, Duration: opts.Duration, Warmup: opts.Warmup}}
			if opts.LatencyDuration > 0 {
				loads = append(loads, LoadConfig{Concurrency: 1, Duration: opts.LatencyDuration, Warmup: opts.Warmup / 3})
			}
			res, err := RunRow(ctx, r, up, dir, *opts.Logger, loads...)
			rr := RowResult{Row: r, Err: err}
			if err == nil {
				rr.Result = res[0]
				if len(res) > 1 {
					rr.Latency = res[1]
				}
			}
			rounds[i] = append(rounds[i], rr)
		}
	}
	var out []RowResult
	for _, rs := range rounds {
		if len(rs) > 0 {
			out = append(out, median(rs))
		}
	}
	return out, ctx.Err()
}

// roundOrder is the order rows run in round: every other round runs them
// backwards, so that a row's position in the round (what ran just before
// it, how warm the machine is) weighs on every row alike.
func roundOrder(n, round int) []int {
	order := make([]int, n)
	for k := range order {
		order[k] = k
		if round%2 == 1 {
			order[k] = n - 1 - k
		}
	}
	return order
}

// median returns the round with the median throughput; a failed round
// makes the row failed.
func median(rs []RowResult) RowResult {
	for _, r := range rs {
		if r.Err != nil {
			return r
		}
	}
	sorted := slices.Clone(rs)
	slices.SortFunc(sorted, func(a, b RowResult) int { return cmp.Compare(a.Result.RPS(), b.Result.RPS()) })
	return sorted[len(sorted)/2]
}

// RunRow sets row up against the upstream at upstreamAddr, runs the loads
// one after the other (their Addr and Request are filled in) and tears the
// row down.
func RunRow(ctx context.Context, row Row, upstreamAddr, dir string, log zerolog.Logger, loads ...LoadConfig) ([]Result, error) {
	rctx, cancel := context.WithCancel(ctx)
	env := &Env{UpstreamAddr: upstreamAddr, Dir: dir, Logger: log, ctx: rctx}
	defer func() {
		cancel()
		env.stop()
	}()
	addr, err := row.Setup(env)
	if err != nil {
		return nil, err
	}
	req := GetRequest("bench.local", "/bench")
	if row.BodySize > 0 {
		req = PostRequest("bench.local", "/bench", row.BodySize)
	}
	out := make([]Result, 0, len(loads))
	for _, lc := range loads {
		lc.Addr, lc.Request = addr, req
		if env.ClientTLS != nil {
			lc.TLS = env.ClientTLS
		}
		res, err := RunLoad(rctx, lc)
		if err != nil {
			return out, err
		}
		out = append(out, res)
	}
	return out, nil
}

// WriteTable prints results as a table, each row compared to the baseline
// row (the sidecar without agents).
func WriteTable(w io.Writer, opts Options, results []RowResult) {
	opts.defaults()
	fmt.Fprintf(w, "End-to-end on loopback: %d keep-alive connections (closed loop), %v per row after %v warm-up;\n",
		opts.Concurrency, opts.Duration, opts.Warmup)
	if opts.LatencyDuration > 0 {
		fmt.Fprintf(w, "then %v with 1 connection for the unloaded latency (columns @1).\n", opts.LatencyDuration)
	}
	if opts.Rounds > 1 {
		fmt.Fprintf(w, "%d rounds, rows interleaved; each row shows its round of median throughput.\n", opts.Rounds)
	}
	fmt.Fprintf(w, "%s/%s, %d CPUs (GOMAXPROCS %d), %s. Load generator, sidecar, agents and upstream\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version())
	fmt.Fprintf(w, "share these CPUs: compare the ratios between rows, not the absolute numbers.\n\n")

	var base *RowResult
	for i := range results {
		if results[i].Row.Baseline && results[i].Err == nil {
			base = &results[i]
		}
	}
	nameW := len("row")
	for _, r := range results {
		nameW = max(nameW, len(r.Row.Name))
	}
	withLat := opts.LatencyDuration > 0
	fmt.Fprintf(w, "%-*s  %9s  %8s  %8s  %8s  %8s  %8s  %8s", nameW, "row", "req/s", "vs base", "CPU/req", "+CPU", "p50", "p99", "+p50")
	if withLat {
		fmt.Fprintf(w, "  %8s  %8s  %8s", "p50@1", "p99@1", "+p50@1")
	}
	fmt.Fprintf(w, "  %6s\n", "errors")
	for _, r := range results {
		if r.Err != nil {
			fmt.Fprintf(w, "%-*s  failed: %v\n", nameW, r.Row.Name, r.Err)
			continue
		}
		res := r.Result
		ratio, added, addedLat, addedCPU := "-", "-", "-", "-"
		if base != nil {
			ratio = fmt.Sprintf("%.1f%%", 100*res.RPS()/base.Result.RPS())
			addedCPU = signedMicros(res.CPUPerRequest() - base.Result.CPUPerRequest())
			added = signedMicros(res.Quantile(0.5) - base.Result.Quantile(0.5))
			if withLat {
				addedLat = signedMicros(r.Latency.Quantile(0.5) - base.Latency.Quantile(0.5))
			}
		}
		fmt.Fprintf(w, "%-*s  %9.0f  %8s  %8s  %8s  %8s  %8s  %8s", nameW, r.Row.Name, res.RPS(), ratio,
			microsFrac(res.CPUPerRequest()), addedCPU, micros(res.Quantile(0.5)), micros(res.Quantile(0.99)), added)
		if withLat {
			fmt.Fprintf(w, "  %8s  %8s  %8s", micros(r.Latency.Quantile(0.5)), micros(r.Latency.Quantile(0.99)), addedLat)
		}
		fmt.Fprintf(w, "  %6d\n", res.Errors+r.Latency.Errors)
	}
	writeVersus(w, results)
	if base == nil {
		fmt.Fprintln(w, "\n(no baseline row measured: ratios omitted)")
		return
	}
	fmt.Fprintf(w, "\nvs base: throughput relative to %q. CPU/req: CPU time of the whole process\n", base.Row.Name)
	fmt.Fprintf(w, "(load generator, sidecar, agents, upstream) per request; +CPU: added to the base row.\n")
	fmt.Fprintf(w, "+p50: median latency added, under load (mostly queueing at %d connections)\n", opts.Concurrency)
	fmt.Fprintf(w, "and, @1, for a lone request.\n")
}

func micros(d time.Duration) string {
	return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
}

func microsFrac(d time.Duration) string {
	return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond))
}

func signedMicros(d time.Duration) string {
	return fmt.Sprintf("%+.0fµs", float64(d)/float64(time.Microsecond))
}

// writeVersus prints, for each row that names a Versus row measured in the
// same run, its throughput and CPU per request relative to that row.
func writeVersus(w io.Writer, results []RowResult) {
	first := true
	for _, r := range results {
		if r.Row.Versus == "" || r.Err != nil {
			continue
		}
		i := slices.IndexFunc(results, func(o RowResult) bool { return o.Row.Name == r.Row.Versus && o.Err == nil })
		if i < 0 {
			continue
		}
		o := results[i].Result
		if first {
			fmt.Fprintln(w)
			first = false
		}
		fmt.Fprintf(w, "%s vs %s: %.1f%% throughput, %+.1fµs CPU/req\n", r.Row.Name, r.Row.Versus,
			100*r.Result.RPS()/o.RPS(), float64(r.Result.CPUPerRequest()-o.CPUPerRequest())/float64(time.Microsecond))
	}
}
