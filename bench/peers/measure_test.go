package main

import (
	"errors"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

const wrkReport = `Running 8s test @ http://127.0.0.1:41833/
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     2.31ms    1.02ms  31.67ms   90.12%
    Req/Sec    28.52k     2.01k   31.20k    77.50%
  Latency Distribution
     50%    2.09ms
     75%    2.50ms
     90%    3.10ms
     99%   31.67ms
  227204 requests in 8.00s, 30.33MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 4
Requests/sec:  28391.04
Transfer/sec:      3.79MB
`

func TestParseWrk(t *testing.T) {
	o, err := parseWrk(strings.NewReader(wrkReport))
	if err != nil {
		t.Fatal(err)
	}
	if o.requests != 227204 || o.elapsed != 8*time.Second {
		t.Errorf("requests %d in %v, want 227204 in 8s", o.requests, o.elapsed)
	}
	if o.p50 != 2090*time.Microsecond || o.p99 != 31670*time.Microsecond {
		t.Errorf("p50 %v p99 %v", o.p50, o.p99)
	}
	if o.failures != 7 {
		t.Errorf("failures %d, want 7", o.failures)
	}
	if _, err := parseWrk(strings.NewReader("unable to connect to 127.0.0.1:1 Connection refused\n")); err == nil {
		t.Error("no error for a report without requests")
	}
}

func TestWrkDuration(t *testing.T) {
	for s, want := range map[string]time.Duration{
		"812.00us": 812 * time.Microsecond, "3.10ms": 3100 * time.Microsecond,
		"8.00s": 8 * time.Second, "1.00m": time.Minute,
	} {
		if got, err := wrkDuration(s); err != nil || got != want {
			t.Errorf("wrkDuration(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
}

func TestRoundOrder(t *testing.T) {
	defs := []rowDef{{key: "a"}, {key: "b"}, {key: "c"}, {key: "d"}, {key: "e"}, {key: "f"}}
	keys := func(d []rowDef) string {
		var b strings.Builder
		for _, r := range d {
			b.WriteString(r.key)
		}
		return b.String()
	}
	for round, want := range map[int]string{1: "abcdef", 2: "bafedc", 3: "efabcd"} {
		if got := keys(roundOrder(defs, round, 3)); got != want {
			t.Errorf("round %d: %s, want %s", round, got, want)
		}
	}
}

func TestCPUTicks(t *testing.T) {
	if _, _, err := cpuTicksSplit(os.Getpid()); err != nil {
		t.Skip("no /proc:", err)
	}
	if _, err := cpuOf([]int{os.Getpid()}); err != nil {
		t.Fatal(err)
	}
	// A command name may hold spaces and parentheses; utime and stime are
	// the 14th and 15th fields.
	line := "4242 (a) (b c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 731 269 0 0 20 0 7 0 55 0 0\n"
	u, k, err := statTimes([]byte(line))
	if err != nil || u != 731 || k != 269 {
		t.Errorf("statTimes = %d, %d, %v; want 731, 269", u, k, err)
	}
	for _, bad := range []string{"", "4242 (x S 1", "4242 (x) S 1 2 3", "4242 (x) S 1 4242 4242 0 -1 4194560 100 0 0 0 7x1 269 0"} {
		if _, _, err := statTimes([]byte(bad)); err == nil {
			t.Errorf("statTimes(%q) took a malformed line", bad)
		}
	}
}

func TestWorkOf(t *testing.T) {
	before, err := workOf([]int{os.Getpid()})
	if err != nil {
		t.Skip("no /proc io accounting:", err)
	}
	f, err := os.Open("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	for range 20 {
		if _, err := f.ReadAt(buf, 0); err != nil && err != io.EOF {
			t.Fatal(err)
		}
	}
	f.Close()
	time.Sleep(20 * time.Millisecond) // a voluntary switch at least
	after, err := workOf([]int{os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	if got := after.syscalls - before.syscalls; got < 20 {
		t.Errorf("%d read/write system calls counted, want at least the 20 reads", got)
	}
	if after.switches <= before.switches {
		t.Errorf("context switches went from %d to %d across a sleep", before.switches, after.switches)
	}
	if _, err := procField([]byte("syscr: 12\nsyscw: 3\n"), "syscw"); err != nil {
		t.Error(err)
	}
	if n, _ := procField([]byte("a: 1\nsyscw:\t7\n"), "syscw"); n != 7 {
		t.Errorf("procField = %d, want 7", n)
	}
	if _, err := procField([]byte("syscr: 1\n"), "syscw"); err == nil {
		t.Error("a missing field was not reported")
	}
}

func TestKernelMedian(t *testing.T) {
	round := func(proxyK, agentK float64) []result {
		return []result{{key: reference, name: "HAProxy + SPOE agent", rps: 1000, proxyUS: 30, agentUS: 10,
			proxyKernelUS: proxyK, agentKernelUS: agentK}}
	}
	all := [][]result{round(20, 6), round(18, 5), round(25, 9)}
	if m := medians(reference, all); m.kernel != 26 || m.total != 40 {
		t.Errorf("kernel median %.1f, total %.1f; want 26 (of 26, 23, 34) and 40", m.kernel, m.total)
	}
	var b strings.Builder
	printMedians(&b, []rowDef{{key: reference, name: "HAProxy + SPOE agent", agent: true}}, all, false)
	out := b.String()
	if !strings.Contains(out, "of it kernel") || !strings.Contains(out, "26.0") {
		t.Errorf("the medians table lacks the kernel column or its value:\n%s", out)
	}
}

func TestRowKeys(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range append(slices.Clone(rows), baselineRows...) {
		if seen[r.key] {
			t.Errorf("row key %q twice", r.key)
		}
		seen[r.key] = true
	}
	for _, r := range baselineRows {
		for _, b := range r.bins {
			// The gRPC rows' load and upstream are the harness's, the same
			// for both builds (as wrk is).
			if !strings.HasSuffix(b, "-base") && !slices.Contains(grpcBins, b) {
				t.Errorf("baseline row %s runs %s, a binary of this checkout", r.key, b)
			}
		}
	}
}

func TestFailedRowsSpanTheTable(t *testing.T) {
	var b strings.Builder
	printMedians(&b, []rowDef{{key: "sidecar", name: "sidecar, no agent"}}, [][]result{{}}, false)
	var head, row string
	for _, l := range strings.Split(b.String(), "\n") {
		switch {
		case strings.HasPrefix(l, "| row "):
			head = l
		case strings.Contains(l, "FAILED"):
			row = l
		}
	}
	if !strings.Contains(row, "FAILED in every round") || strings.Count(row, "|") != strings.Count(head, "|") {
		t.Errorf("failed row does not span the table:\n%s\n%s", head, row)
	}
}

// TestPairedRatios: a row's ratio to HAProxy + SPOE is taken within each
// round, skipping rounds where either side failed, so that a slow round
// that slows both leaves the ratio alone.
func TestPairedRatios(t *testing.T) {
	failed := errors.New("failed")
	all := [][]result{
		{{key: reference, rps: 20000}, {key: "sidecar-uds", rps: 25000}},
		{{key: "sidecar-uds", rps: 12000}, {key: reference, rps: 10000}}, // a slow round
		{{key: reference, rps: 20000}, {key: "sidecar-uds", err: failed}},
		{{key: reference, err: failed}, {key: "sidecar-uds", rps: 30000}},
		{{key: reference, rps: 20000}, {key: "sidecar-uds", rps: 26000}},
	}
	got := pairedRatios("sidecar-uds", all, func(r result) float64 { return r.rps })
	want := []float64{1.25, 1.2, 1.3}
	if len(got) != len(want) {
		t.Fatalf("ratios %v, want %v", got, want)
	}
	for i := range want {
		if math.Abs(got[i]-want[i]) > 1e-9 {
			t.Fatalf("ratios %v, want %v", got, want)
		}
	}
	if s := fmtRatios(got); s != "1.25× (1.20–1.30)" {
		t.Fatalf("fmtRatios = %q", s)
	}
	if s := fmtRatios(nil); s != "-" {
		t.Fatalf("fmtRatios(nil) = %q", s)
	}
}

// TestTogetherGroups: with -together each sidecar row is measured with
// its baseline, in the round's order, and every other row alone; without
// it every row is alone.
func TestTogetherGroups(t *testing.T) {
	defs := []rowDef{defOf(rows, reference), defOf(rows, "sidecar-uds"), defOf(baselineRows, "sidecar-uds-base"), defOf(rows, "sidecar")}
	order := []rowDef{defs[2], defs[0], defs[3], defs[1]}
	keys := func(gs [][]rowDef) string {
		var parts []string
		for _, g := range gs {
			var k []string
			for _, d := range g {
				k = append(k, d.key)
			}
			parts = append(parts, strings.Join(k, "+"))
		}
		return strings.Join(parts, " ")
	}
	h := &harness{together: true}
	if got, want := keys(h.groups(order, defs)), "sidecar-uds-base+sidecar-uds haproxy-spoe sidecar"; got != want {
		t.Errorf("together: %s, want %s", got, want)
	}
	h.together = false
	if got, want := keys(h.groups(order, defs)), "sidecar-uds-base haproxy-spoe sidecar sidecar-uds"; got != want {
		t.Errorf("alone: %s, want %s", got, want)
	}
}

// TestBaselineRatios: the build's row over its baseline's, round by round.
func TestBaselineRatios(t *testing.T) {
	defs := []rowDef{defOf(rows, "sidecar-uds"), defOf(baselineRows, "sidecar-uds-base")}
	all := [][]result{
		{{key: "sidecar-uds", proxyUS: 29, agentUS: 3, rps: 30000}, {key: "sidecar-uds-base", proxyUS: 31, agentUS: 2, rps: 29000}},
		{{key: "sidecar-uds", proxyUS: 40, agentUS: 4, rps: 20000}, {key: "sidecar-uds-base", proxyUS: 40, agentUS: 4, rps: 20000}},
	}
	var b strings.Builder
	printBaselineRatios(&b, defs, all, true)
	out := b.String()
	if !strings.Contains(out, "at the same time") || !strings.Contains(out, "| sidecar + UDS agent (Go SDK) |") ||
		!strings.Contains(out, "0.98× (0.97–1.00)") || !strings.Contains(out, "1.02× (1.00–1.03)") {
		t.Errorf("baseline ratios:\n%s", out)
	}
	b.Reset()
	printBaselineRatios(&b, defs[:1], all, false)
	if b.Len() != 0 {
		t.Errorf("a table without a baseline row:\n%s", b.String())
	}
}
