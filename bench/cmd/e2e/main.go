// Command e2e runs the sidecar's end-to-end load benchmark on loopback and
// prints the table (see package bench):
//
//	go run ./bench/cmd/e2e [-duration 3s] [-concurrency 64] [-run REGEXP]
//
// Build it before measuring anything that matters (`go build -o e2e
// ./bench/cmd/e2e`): `go run` compiles while the first row warms up only
// the first time, but the compiler may still be running on a shared machine.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"runtime/pprof"
	"syscall"

	"github.com/zentinelproxy/sidecar/internal/bench"
)

func main() { os.Exit(run()) }

func run() int {
	var opts bench.Options
	flag.DurationVar(&opts.Duration, "duration", 3e9, "measured `time` per row")
	flag.DurationVar(&opts.Warmup, "warmup", 3e8, "unmeasured warm-up `time` per row")
	flag.IntVar(&opts.Concurrency, "concurrency", 64, "keep-alive `connections`, one request in flight each")
	flag.DurationVar(&opts.LatencyDuration, "latency-duration", 1e9, "`time` per row with one connection, for the unloaded latency (negative: skip)")
	flag.IntVar(&opts.Rounds, "rounds", 1, "repeat the table `n` times, rows interleaved, and report each row's median round")
	match := flag.String("run", "", "only rows whose name matches this `regexp`")
	list := flag.Bool("list", false, "list the rows and exit")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to `file`")
	flag.Parse()

	if *list {
		for _, r := range bench.Rows() {
			fmt.Println(r.Name)
		}
		return 0
	}
	if *match != "" {
		re, err := regexp.Compile(*match)
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e: -run:", err)
			return 2
		}
		opts.Match = re
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	results, err := bench.Run(ctx, opts)
	bench.WriteTable(os.Stdout, opts, results)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	for _, r := range results {
		if r.Err != nil {
			return 1
		}
	}
	return 0
}
