package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

func printHeader(w io.Writer, h *harness, defs []rowDef) {
	fmt.Fprintf(w, "# Peer benchmark, %s\n\n", time.Now().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(w, "- machine: %d CPUs (nproc), %s, %s\n", runtime.NumCPU(), cpuModel(), kernel())
	if h.rate > 0 {
		fmt.Fprintf(w, "- load: fixedrate -c %d -rate %g -d %s (below saturation: each connection sends at fixed intervals), after a %s warm-up; %d round(s), row order rotated between rounds\n",
			h.conns, h.rate, h.duration, h.warmup, h.rounds)
	} else {
		fmt.Fprintf(w, "- load: wrk -t%d -c%d -d%s --latency, after a %s warm-up; %d round(s), row order rotated between rounds\n",
			h.threads, h.conns, h.duration, h.warmup, h.rounds)
	}
	if slices.ContainsFunc(defs, func(d rowDef) bool { return d.h2 }) {
		fmt.Fprintf(w, "- HTTP/2 rows (-h2): h2load -t%d -c%d -m%d -D %s (h2c with prior knowledge; %d concurrent streams on each connection), after a %s warm-up; HTTP/1.1 to the upstream\n",
			min(h.threads, h.conns), h.conns, h.h2Streams, h.duration, h.h2Streams, h.warmup)
	}
	if slices.ContainsFunc(defs, func(d rowDef) bool { return d.grpc }) {
		fmt.Fprintf(w, "- gRPC rows (grpc-*): cmd/grpcload -c %d -m %d -d %s (unary Echo of 64 bytes; %d grpc-go ClientConns, %d calls in flight on each; GOMAXPROCS=%d), after a %s warm-up; h2c to the proxy and from it to a grpc-go upstream (cmd/grpcupstream)\n",
			h.conns, h.h2Streams, h.duration, h.conns, h.h2Streams, h.threads, h.warmup)
	}
	if h.proxyCPUs != "" {
		fmt.Fprintf(w, "- placement: proxy + agent pinned to CPU %s; wrk + upstream pinned to CPU %s (taskset)\n", h.proxyCPUs, h.loadCPUs)
	} else {
		fmt.Fprintln(w, "- placement: not pinned")
	}
	if h.sched == "batch" {
		fmt.Fprintln(w, "- scheduling: every proxy and agent SCHED_BATCH (chrt -b 0: a wake-up does not preempt the running task); wrk and the upstream SCHED_OTHER")
	} else {
		fmt.Fprintln(w, "- scheduling: SCHED_OTHER (the default) for every process")
	}
	gmp := "GOMAXPROCS=" + strconv.Itoa(h.gomaxprocs)
	if h.gomaxprocs == 0 {
		gmp = "the Go runtime's default GOMAXPROCS (the sidecar and the SDK agent adapt it to their load)"
	}
	fmt.Fprintf(w, "- core budget: nginx worker_processes 1, HAProxy nbthread 1, every Go program (Caddy, sidecar, agents, auth server, upstream) %s\n", gmp)
	var v []string
	for _, t := range []string{"wrk", "h2load", "haproxy", "nginx", "caddy"} {
		if h.tools[t] != "" && (t != "h2load" || slices.ContainsFunc(defs, func(d rowDef) bool { return d.h2 })) {
			v = append(v, toolVersion(t, h.tools[t]))
		}
	}
	v = append(v, runtime.Version(), "sidecar "+sidecarRev())
	if h.baseline != "" {
		v = append(v, "baseline sidecar "+checkoutRev(h.baseline)+" ("+h.baseline+")")
	}
	fmt.Fprintf(w, "- versions: %s\n\n", strings.Join(v, ", "))
}

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func kernel() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return runtime.GOOS
	}
	return "Linux " + strings.TrimSpace(string(b))
}

func toolVersion(name, path string) string {
	var args []string
	switch name {
	case "wrk":
		args = []string{"-v"}
	case "haproxy":
		args = []string{"-v"}
	case "nginx":
		args = []string{"-v"}
	case "caddy":
		args = []string{"version"}
	case "h2load":
		args = []string{"--version"}
	}
	b, _ := exec.Command(path, args...).CombinedOutput() // wrk -v exits 1
	l := strings.TrimSpace(firstLine(string(b)))
	switch name {
	case "wrk":
		if f := strings.Fields(l); len(f) >= 2 {
			return "wrk " + f[1]
		}
	case "haproxy":
		if f := strings.Fields(l); len(f) >= 3 {
			return "HAProxy " + f[2]
		}
	case "nginx":
		if _, v, ok := strings.Cut(l, "nginx/"); ok {
			return "nginx " + v
		}
	case "caddy":
		if f := strings.Fields(l); len(f) >= 1 {
			return "Caddy " + f[0]
		}
	case "h2load":
		// h2load nghttp2/1.52.0
		if _, v, ok := strings.Cut(l, "nghttp2/"); ok {
			return "h2load " + v
		}
	}
	return name + " " + l
}

// sidecarRev is the checkout's commit, marked when it has local changes.
func sidecarRev() string {
	src, _ := os.Getwd()
	return checkoutRev(filepath.Join(src, "..", ".."))
}

// checkoutRev is the commit of the checkout at root, marked when it has
// local changes.
func checkoutRev(root string) string {
	b, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "(unknown commit)"
	}
	rev := strings.TrimSpace(string(b))
	if st, err := exec.Command("git", "-C", root, "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
		rev += " with local changes"
	}
	return rev
}

func fmtLat(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	default:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	}
}

func fmtUS(v float64, present bool) string {
	if !present {
		return "-"
	}
	return fmt.Sprintf("%.1f", v)
}

func table(w io.Writer, head []string, body [][]string) {
	width := make([]int, len(head))
	for i, c := range head {
		width[i] = len([]rune(c))
	}
	for _, r := range body {
		for i, c := range r {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	line := func(cells []string) {
		var b strings.Builder
		b.WriteString("|")
		for i, c := range cells {
			pad := strings.Repeat(" ", width[i]-len([]rune(c)))
			if i == 0 {
				b.WriteString(" " + c + pad + " |")
			} else {
				b.WriteString(" " + pad + c + " |")
			}
		}
		fmt.Fprintln(w, b.String())
	}
	line(head)
	sep := make([]string, len(head))
	for i := range head {
		if i == 0 {
			sep[i] = strings.Repeat("-", width[i])
		} else {
			sep[i] = strings.Repeat("-", width[i]-1) + ":"
		}
	}
	line(sep)
	for _, r := range body {
		line(r)
	}
	fmt.Fprintln(w)
}

func defOf(defs []rowDef, key string) rowDef {
	for _, d := range defs {
		if d.key == key {
			return d
		}
	}
	return rowDef{}
}

func hasProxy(key string) bool { return key != "direct" }

func printRound(w io.Writer, defs []rowDef, order []rowDef, res []result, round int) {
	fmt.Fprintf(w, "## Round %d (rows in the order they ran)\n\n", round)
	head := []string{"row", "req/s", "p50", "p99", "proxy µs/req", "agent µs/req", "proxy+agent µs/req", "of it kernel", "upstream µs/req", "proxy+agent cores", "proxy read/write syscalls/req", "agent read/write syscalls/req", "proxy+agent ctx switches/req", "other load (cores)", "steal (cores)", "wrk failures"}
	var body [][]string
	for _, r := range res {
		d := defOf(defs, r.key)
		if r.err != nil {
			body = append(body, failedRow(len(head), r.name, "FAILED: "+firstLine(r.err.Error())))
			continue
		}
		body = append(body, []string{
			r.name, fmt.Sprintf("%.0f", r.rps), fmtLat(r.p50), fmtLat(r.p99),
			fmtUS(r.proxyUS, hasProxy(r.key)), fmtUS(r.agentUS, d.agent), fmtUS(r.totalUS(), hasProxy(r.key)),
			fmtUS(r.kernelUS(), hasProxy(r.key)), fmtUS(r.upstreamUS, true), fmt.Sprintf("%.2f", r.sutCores),
			fmtCount(r.proxySys, hasProxy(r.key)), fmtCount(r.agentSys, d.agent), fmtCount(sumKnown(r.proxyCS, r.agentCS), hasProxy(r.key)),
			fmt.Sprintf("%.2f", r.others), fmt.Sprintf("%.2f", r.steal), fmt.Sprint(r.failures),
		})
	}
	table(w, head, body)
}

// failedRow is a table row of n columns that says only why it is empty.
func failedRow(n int, name, why string) []string {
	row := make([]string, n)
	row[0], row[1] = name, why
	return row
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// med is a row's medians over the rounds it completed.
type med struct {
	ok                                 int
	rps, p50, p99, proxy, agent, total float64
	kernel                             float64 // of total, proxy + agent
	upstream, cores                    float64
	syscalls, switches                 float64 // proxy + agent, per request; < 0: unknown
}

func medians(key string, all [][]result) med {
	var m med
	var rps, p50, p99, px, ag, tot, kern, up, cores, sys, cs []float64
	for _, round := range all {
		for _, r := range round {
			if r.key != key || r.err != nil {
				continue
			}
			m.ok++
			rps = append(rps, r.rps)
			p50 = append(p50, float64(r.p50))
			p99 = append(p99, float64(r.p99))
			px = append(px, r.proxyUS)
			ag = append(ag, r.agentUS)
			tot = append(tot, r.totalUS())
			kern = append(kern, r.kernelUS())
			up = append(up, r.upstreamUS)
			cores = append(cores, r.sutCores)
			sys = append(sys, sumKnown(r.proxySys, r.agentSys))
			cs = append(cs, sumKnown(r.proxyCS, r.agentCS))
		}
	}
	m.rps, m.p50, m.p99 = median(rps), median(p50), median(p99)
	m.proxy, m.agent, m.total, m.upstream, m.cores = median(px), median(ag), median(tot), median(up), median(cores)
	m.kernel = median(kern)
	m.syscalls, m.switches = median(sys), median(cs)
	return m
}

func printMedians(w io.Writer, defs []rowDef, all [][]result, together bool) {
	fmt.Fprintf(w, "## Medians over %d round(s), ratios to HAProxy + SPOE (of the HTTP/2 rows: to HAProxy + SPOE over HTTP/2)\n\n", len(all))
	refs := map[string]med{}
	for _, d := range defs {
		if _, ok := refs[referenceOf(d)]; !ok {
			refs[referenceOf(d)] = medians(referenceOf(d), all)
		}
	}
	head := []string{"row", "req/s", "p50", "p99", "proxy µs/req", "agent µs/req", "proxy+agent µs/req", "of it kernel", "proxy+agent cores", "proxy+agent read/write syscalls/req", "proxy+agent ctx switches/req", "req/s vs HAProxy+SPOE", "CPU/req vs HAProxy+SPOE", "req/s vs HAProxy+SPOE in its round: median (range)", "CPU/req: median (range)"}
	var body [][]string
	for _, d := range defs {
		m := medians(d.key, all)
		name := d.name
		if m.ok == 0 {
			body = append(body, failedRow(len(head), name, "FAILED in every round"))
			continue
		}
		if m.ok < len(all) {
			name += fmt.Sprintf(" (%d of %d rounds)", m.ok, len(all))
		}
		rr, cr, prr, pcr := "-", "-", "-", "-"
		if ref := refs[referenceOf(d)]; ref.ok > 0 {
			rr = fmt.Sprintf("%.2f×", m.rps/ref.rps)
			prr = fmtRatios(ratiosTo(d.key, referenceOf(d), all, func(r result) float64 { return r.rps }))
			if hasProxy(d.key) {
				cr = fmt.Sprintf("%.2f×", m.total/ref.total)
				pcr = fmtRatios(ratiosTo(d.key, referenceOf(d), all, func(r result) float64 { return r.totalUS() }))
			}
		}
		body = append(body, []string{
			name, fmt.Sprintf("%.0f", m.rps), fmtLat(time.Duration(m.p50)), fmtLat(time.Duration(m.p99)),
			fmtUS(m.proxy, hasProxy(d.key)), fmtUS(m.agent, d.agent), fmtUS(m.total, hasProxy(d.key)),
			fmtUS(m.kernel, hasProxy(d.key)), fmt.Sprintf("%.2f", m.cores), fmtCount(m.syscalls, hasProxy(d.key)), fmtCount(m.switches, hasProxy(d.key)), rr, cr, prr, pcr,
		})
	}
	table(w, head, body)
	for key, ref := range refs {
		if ref.ok == 0 {
			fmt.Fprintf(w, "(%s did not run: no ratios to it.)\n", key)
		}
	}
	printBaselineRatios(w, defs, all, together)
}

// printBaselineRatios compares each sidecar row with its baseline, round
// by round: measured at the same time with -together, one after the other
// without.
func printBaselineRatios(w io.Writer, defs []rowDef, all [][]result, together bool) {
	var body [][]string
	for _, d := range defs {
		base := d.key + "-base"
		if defOf(defs, base).key == "" {
			continue
		}
		cpu := ratiosTo(d.key, base, all, func(r result) float64 { return r.totalUS() })
		rps := ratiosTo(d.key, base, all, func(r result) float64 { return r.rps })
		body = append(body, []string{d.name, fmt.Sprint(len(cpu)), fmtRatios(cpu), fmtRatios(rps)})
	}
	if len(body) == 0 {
		return
	}
	how := "measured one after the other in each round"
	if together {
		how = "measured at the same time (-together)"
	}
	fmt.Fprintf(w, "\n## This build against the baseline, %s\n\n", how)
	table(w, []string{"row", "rounds", "proxy+agent CPU/req: median (range)", "req/s: median (range)"}, body)
}

// pairedRatios returns, for each round in which both row key and
// HAProxy + SPOE completed, f of the row over f of HAProxy + SPOE in that
// round. The rows of one round run within a minute of each other, so a
// slow spell of the machine (a shared host's, lasting minutes) moves
// both sides of a round's ratio, where it moves one row's median and not
// another's.
func pairedRatios(key string, all [][]result, f func(result) float64) []float64 {
	return ratiosTo(key, reference, all, f)
}

// ratiosTo returns, for each round in which rows key and ref both
// completed, f of key over f of ref in that round.
func ratiosTo(key, ref string, all [][]result, f func(result) float64) []float64 {
	var out []float64
	for _, round := range all {
		var a, b *result
		for i := range round {
			r := &round[i]
			if r.err != nil {
				continue
			}
			switch r.key {
			case key:
				a = r
			case ref:
				b = r
			}
		}
		if a != nil && b != nil && f(*b) > 0 {
			out = append(out, f(*a)/f(*b))
		}
	}
	return out
}

// fmtRatios shows the median of per-round ratios and their range.
func fmtRatios(v []float64) string {
	if len(v) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f× (%.2f–%.2f)", median(v), slices.Min(v), slices.Max(v))
}

// fmtCount shows a per-request count, or "-" when it does not apply or is
// unknown (negative).
func fmtCount(v float64, show bool) string {
	if !show || v < 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

// sumKnown adds per-request counts, unknown (negative) when one is.
func sumKnown(a, b float64) float64 {
	if a < 0 || b < 0 {
		return -1
	}
	return a + b
}
