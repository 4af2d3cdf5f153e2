// Command peers is the peer benchmark: the sidecar next to HAProxy SPOE,
// nginx auth_request, Caddy forward_auth and a bare fasthttp proxy, all
// doing the same job on the same core budget, loaded by wrk on loopback.
//
// The job: GET /admin is denied with 403 by the agent (or auth service),
// not by proxy configuration; every other request reaches the upstream
// with the agent's X-Agent-Processed: true. Rows without an agent only
// proxy, as the floor each proxy starts from.
//
// Run it from this directory (it builds everything it runs, the sidecar
// from ../../cmd/sidecar included):
//
//	./run                          # or: go run .
//	./run -duration 3s -rounds 1 -rows 'sidecar|haproxy'
//
// It needs wrk, and haproxy, nginx and caddy for their rows (missing ones
// are skipped): apt-get install -y wrk haproxy nginx caddy. See
// docs/performance.md for what the rows are and how to read the table.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

type harness struct {
	duration, warmup time.Duration
	conns, threads   int
	rounds           int
	quietWait        time.Duration
	maxOther         float64 // other load (cores) above which a row is measured again
	maxSteal         float64 // hypervisor steal (cores) above which a row is measured again
	retries          int
	loadCPUs         string  // wrk and the upstream ("" when not pinned)
	proxyCPUs        string  // proxies and agents ("" when not pinned)
	sched            string  // "normal" or "batch": the scheduling policy of proxies and agents
	baseline         string  // another checkout whose sidecar rows run too ("": none)
	rate             float64 // > 0: load with cmd/fixedrate at this many requests/s instead of wrk
	gomaxprocs       int     // GOMAXPROCS of every Go program; 0: the runtime's default
	together         bool    // measure a sidecar row and its baseline at the same time
	h2Streams        int     // h2load -m: concurrent streams on each connection of the HTTP/2 rows

	tmp    string
	binDir string
	tools  map[string]string // program name → path
	procs  *procs
}

func (h *harness) bin(name string) string { return filepath.Join(h.binDir, name) }

// interrupted is set on Ctrl-C (or SIGTERM, SIGHUP): results after it are
// not reported.
var interrupted atomic.Bool

func main() { os.Exit(run()) }

func run() int {
	h := &harness{procs: newProcs(), tools: map[string]string{}}
	flag.DurationVar(&h.duration, "duration", 8*time.Second, "measured wrk `time` per row and round (whole seconds)")
	flag.DurationVar(&h.warmup, "warmup", 2*time.Second, "unmeasured wrk `time` before each measurement (0: none)")
	flag.IntVar(&h.conns, "connections", 64, "wrk keep-alive `connections`")
	flag.IntVar(&h.threads, "threads", 1, "wrk (and h2load) `threads`")
	flag.IntVar(&h.h2Streams, "h2-streams", 10, "h2load -m of the HTTP/2 rows (*-h2): concurrent `streams` on each of the -connections")
	flag.IntVar(&h.rounds, "rounds", 3, "`rounds`: every row once per round, the order rotated between rounds")
	flag.DurationVar(&h.quietWait, "quiet-wait", 20*time.Second, "before each measurement, wait up to this `long` for the rest of the machine to be idle (0: do not wait)")
	flag.Float64Var(&h.maxOther, "max-other-load", 0.25, "measure a row again when the rest of the machine used more than this many `cores` during its window")
	flag.Float64Var(&h.maxSteal, "max-steal", 0.1, "measure a row again when the hypervisor stole more than this many `cores` during its window (shared VMs)")
	flag.IntVar(&h.retries, "retries", 2, "how many `times` a row is measured again for -max-other-load")
	pin := flag.Bool("pin", true, "pin with taskset: wrk and the upstream on -load-cpus, proxies and agents on -proxy-cpus")
	flag.StringVar(&h.loadCPUs, "load-cpus", "0", "taskset `list` for wrk and the upstream")
	flag.StringVar(&h.proxyCPUs, "proxy-cpus", "1", "taskset `list` for the proxy and its agent")
	flag.StringVar(&h.sched, "sched", "normal", "scheduling `policy` of every proxy and agent: normal, or batch (SCHED_BATCH with chrt -b 0: no wake-up preemption)")
	flag.Float64Var(&h.rate, "rate", 0, "load below saturation: this many `requests/s` in all, sent at fixed intervals over the -connections by cmd/fixedrate, instead of wrk (0: wrk, as fast as the proxy answers)")
	flag.IntVar(&h.gomaxprocs, "gomaxprocs", 1, "GOMAXPROCS of every Go program (Caddy, sidecar, agents, auth server, upstream); 0: none in their environment, so the Go runtime's default (the CPUs it may use), which the sidecar and the SDK agent adapt to their load")
	match := flag.String("rows", "", "run only rows whose key matches this `regexp` (keys: "+rowKeys()+")")
	flag.BoolVar(&h.together, "together", false, "with -baseline: measure each sidecar row and its baseline at the same time (each with its own upstream and wrk, on the same CPUs), so that their ratio is free of the machine's drift between measurements")
	keep := flag.Bool("keep", false, "keep the temporary directory (configurations and logs)")
	flag.StringVar(&h.baseline, "baseline", "", "another checkout's root `directory` (a git worktree of another commit): its sidecar and SDK agent are measured too, as the rows sidecar-base, sidecar-uds-base, sidecar-httpauth-base, sidecar-httpauth-tcp-base, grpc-sidecar-base and grpc-sidecar-uds-base, in the same rounds")
	flag.Parse()

	var rowRE *regexp.Regexp
	if *match != "" {
		var err error
		if rowRE, err = regexp.Compile(*match); err != nil {
			fmt.Fprintln(os.Stderr, "peers: -rows:", err)
			return 2
		}
	}
	if h.rounds < 1 || h.conns < 1 || h.threads < 1 || h.h2Streams < 1 || h.duration < time.Second {
		fmt.Fprintln(os.Stderr, "peers: -rounds, -connections, -threads and -h2-streams must be at least 1, -duration at least 1s")
		return 2
	}
	if h.together && h.baseline == "" {
		fmt.Fprintln(os.Stderr, "peers: -together needs -baseline")
		return 2
	}
	if h.rate < 0 || h.gomaxprocs < 0 {
		fmt.Fprintln(os.Stderr, "peers: -rate and -gomaxprocs must not be negative")
		return 2
	}
	if h.sched != "normal" && h.sched != "batch" {
		fmt.Fprintln(os.Stderr, "peers: -sched must be normal or batch")
		return 2
	}
	if !*pin {
		h.loadCPUs, h.proxyCPUs = "", ""
	} else if runtime.NumCPU() < 2 && h.loadCPUs == "0" && h.proxyCPUs == "1" {
		fmt.Fprintln(os.Stderr, "peers: one CPU: not pinning")
		h.loadCPUs, h.proxyCPUs = "", ""
	}
	src, err := findSource()
	if err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		return 2
	}

	// Every child is stopped on the way out: normal end, failure, Ctrl-C.
	h.tmp, err = os.MkdirTemp("", "peers-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		return 1
	}
	cleanup := func() {
		h.procs.stopAll(true)
		if *keep {
			fmt.Fprintln(os.Stderr, "peers: kept", h.tmp)
		} else {
			os.RemoveAll(h.tmp)
		}
	}
	defer cleanup()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE) // SIGPIPE: output piped to head
	go func() {
		s := <-sigs
		interrupted.Store(true)
		fmt.Fprintf(os.Stderr, "\npeers: %v: stopping every process\n", s)
		cleanup()
		os.Exit(130)
	}()

	// Programs: wrk is required; a missing proxy skips its rows.
	path := os.Getenv("PATH") + ":/usr/local/sbin:/usr/sbin:/sbin"
	for _, t := range []string{"wrk", "h2load", "taskset", "chrt", "haproxy", "nginx", "caddy"} {
		if p := lookPath(t, path); p != "" {
			h.tools[t] = p
		}
	}
	if h.tools["wrk"] == "" && h.rate == 0 {
		fmt.Fprintln(os.Stderr, "peers: wrk is not installed: sudo apt-get update && sudo apt-get install -y wrk haproxy nginx caddy")
		return 1
	}
	if h.sched == "batch" && h.tools["chrt"] == "" {
		fmt.Fprintln(os.Stderr, "peers: chrt (util-linux) is not installed: install it or use -sched normal")
		return 1
	}
	if h.proxyCPUs != "" && h.tools["taskset"] == "" {
		fmt.Fprintln(os.Stderr, "peers: taskset (util-linux) is not installed: install it or use -pin=false")
		return 1
	}

	// Build what the rows run.
	h.binDir = filepath.Join(h.tmp, "bin")
	if err := os.MkdirAll(h.binDir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		return 1
	}
	built := map[string]error{}
	fmt.Fprintln(os.Stderr, "peers: building the sidecar, the agents, the auth server and the upstream …")
	progs := []string{"upstream", "authserver", "spoeagent", "sdkagent", "fhproxy", "loopproxy", "fixedrate", "grpcupstream", "grpcload"}
	for _, b := range progs {
		built[b] = h.goBuild(src, b, "./cmd/"+b)
	}
	built["sidecar"] = h.goBuild(filepath.Join(src, "..", ".."), "sidecar", "./cmd/sidecar")
	progs = append(progs, "sidecar")
	candidates := rows
	if h.baseline != "" {
		base, err := filepath.Abs(h.baseline)
		if err == nil {
			_, err = os.Stat(filepath.Join(base, "cmd", "sidecar"))
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "peers: -baseline: not a checkout of the sidecar:", err)
			return 2
		}
		h.baseline = base
		built["sidecar-base"] = h.goBuild(base, "sidecar-base", "./cmd/sidecar")
		built["sdkagent-base"] = h.goBuild(filepath.Join(base, "bench", "peers"), "sdkagent-base", "./cmd/sdkagent")
		built["authserver-base"] = h.goBuild(filepath.Join(base, "bench", "peers"), "authserver-base", "./cmd/authserver")
		progs = append(progs, "sidecar-base", "sdkagent-base", "authserver-base")
		candidates = append(slices.Clone(rows), baselineRows...)
	}
	for _, b := range progs {
		if built[b] != nil {
			fmt.Fprintln(os.Stderr, "peers:", built[b])
		}
	}
	if built["upstream"] != nil {
		fmt.Fprintln(os.Stderr, "peers: building the upstream:", built["upstream"])
		return 1
	}
	if built["fixedrate"] != nil && h.rate > 0 {
		fmt.Fprintln(os.Stderr, "peers: building the fixed-rate client:", built["fixedrate"])
		return 1
	}

	// Which rows run.
	var defs []rowDef
	var skipped []string
	for _, d := range candidates {
		if rowRE != nil && !rowRE.MatchString(d.key) {
			continue
		}
		var why []string
		for _, t := range d.tools {
			if h.tools[t] == "" {
				pkg := t
				if t == "h2load" {
					pkg = "nghttp2-client"
				}
				why = append(why, t+" is not installed (sudo apt-get install -y "+pkg+")")
			}
		}
		if d.h2 && h.rate > 0 {
			why = append(why, "-rate loads over HTTP/1 only")
		}
		for _, b := range d.bins {
			if err := built[b]; err != nil {
				why = append(why, "building "+b+" failed: "+firstLine(err.Error()))
			}
		}
		if len(why) > 0 {
			skipped = append(skipped, fmt.Sprintf("%s: skipped: %s", d.name, strings.Join(why, "; ")))
			continue
		}
		defs = append(defs, d)
	}
	for _, s := range skipped {
		fmt.Fprintln(os.Stderr, "peers:", s)
	}
	if len(defs) == 0 {
		fmt.Fprintln(os.Stderr, "peers: no row to run")
		return 1
	}

	out := os.Stdout
	printHeader(out, h, defs)
	for _, s := range skipped {
		fmt.Fprintf(out, "- %s\n", s)
	}
	if len(skipped) > 0 {
		fmt.Fprintln(out)
	}
	var all [][]result
	for round := 1; round <= h.rounds; round++ {
		order := roundOrder(defs, round, h.rounds)
		var res []result
		for _, group := range h.groups(order, defs) {
			var names []string
			for _, d := range group {
				names = append(names, d.name)
			}
			fmt.Fprintf(os.Stderr, "peers: round %d/%d: %s …\n", round, h.rounds, strings.Join(names, " with "))
			var rs []result
			for try := 0; ; try++ {
				rs = h.runRows(group, round)
				if interrupted.Load() {
					select {} // the signal handler stops everything and exits
				}
				again := false
				for _, r := range rs {
					if r.err == nil && (r.others > h.maxOther || r.steal > h.maxSteal) {
						again = true
					}
				}
				if !again || try >= h.retries {
					break
				}
				fmt.Fprintf(os.Stderr, "peers:   %.2f cores of other load, %.2f cores stolen by the hypervisor during the window: measuring again\n", rs[0].others, rs[0].steal)
			}
			for _, r := range rs {
				if r.err != nil {
					fmt.Fprintf(os.Stderr, "peers: round %d: %s: FAILED: %v\n", round, r.name, r.err)
				} else {
					fmt.Fprintf(os.Stderr, "peers:   %s: %.0f req/s, p50 %s, p99 %s, CPU µs/req proxy %.1f agent %.1f upstream %.1f, proxy+agent cores %.2f, read/write syscalls/req proxy %.2f agent %.2f, ctx switches/req proxy %.2f agent %.2f, other load %.2f cores, steal %.2f cores, upstream saw %d (%d marked), wrk failures %d\n",
						r.key, r.rps, fmtLat(r.p50), fmtLat(r.p99), r.proxyUS, r.agentUS, r.upstreamUS, r.sutCores, r.proxySys, r.agentSys, r.proxyCS, r.agentCS, r.others, r.steal, r.upTotal, r.upMarked, r.failures)
				}
			}
			res = append(res, rs...)
		}
		all = append(all, res)
		printRound(out, defs, orderOf(res, defs), res, round)
	}
	printMedians(out, defs, all, h.together)
	return 0
}

// groups splits a round's rows into what is measured at once: each row
// alone or, with -together, a sidecar row with its baseline, in the order
// the round has them (the order rotates between rounds, so each build
// starts first in some rounds and second in others).
func (h *harness) groups(order, defs []rowDef) [][]rowDef {
	in := map[string]bool{}
	for _, d := range defs {
		in[d.key] = true
	}
	var out [][]rowDef
	done := map[string]bool{}
	for _, d := range order {
		if done[d.key] {
			continue
		}
		done[d.key] = true
		g := []rowDef{d}
		if h.together {
			other, isBase := strings.CutSuffix(d.key, "-base")
			if !isBase {
				other = d.key + "-base"
			}
			if in[other] && !done[other] {
				g = append(g, defOf(defs, other))
				done[other] = true
			}
		}
		out = append(out, g)
	}
	return out
}

// orderOf is the rows of res in the order they ran.
func orderOf(res []result, defs []rowDef) []rowDef {
	out := make([]rowDef, len(res))
	for i, r := range res {
		out[i] = defOf(defs, r.key)
	}
	return out
}

func rowKeys() string {
	var k []string
	for _, r := range rows {
		k = append(k, r.key)
	}
	for _, r := range baselineRows {
		k = append(k, r.key+" (with -baseline)")
	}
	return strings.Join(k, ", ")
}

// roundOrder rotates the rows by round and reverses every other round, so
// that no row always runs first, last, or after the same neighbour.
func roundOrder(defs []rowDef, round, rounds int) []rowDef {
	n := len(defs)
	shift := (round - 1) * n / rounds
	order := append(slices.Clone(defs[shift:]), defs[:shift]...)
	if round%2 == 0 {
		slices.Reverse(order)
	}
	return order
}

// findSource returns this module's directory: the working directory, as
// with ./run and go run .
func findSource() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(wd, "go.mod"))
	if err != nil || !bytes.Contains(b, []byte("module github.com/zentinelproxy/sidecar/bench/peers")) {
		return "", fmt.Errorf("run it from bench/peers (./run or go run .), not from %s", wd)
	}
	return wd, nil
}

// goBuild builds pkg (in dir) into the harness's bin directory as name.
// It runs as a child like the servers, so that Ctrl-C stops it too.
func (h *harness) goBuild(dir, name, pkg string) error {
	p, err := h.procs.start("go build", "", filepath.Join(h.tmp, "build-"+name+".log"), nil,
		"sh", "-c", `cd "$0" && exec go build -o "$1" "$2"`, dir, h.bin(name), pkg)
	if err != nil {
		return err
	}
	<-p.done
	h.procs.stop(p)
	if p.err != nil {
		return fmt.Errorf("go build %s (in %s): %v\n%s", pkg, dir, p.err, p.tail())
	}
	return nil
}

func lookPath(name, path string) string {
	for _, d := range filepath.SplitList(path) {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
