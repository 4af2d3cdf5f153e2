package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// result is one row measured in one round.
type result struct {
	key, name string
	round     int
	err       error // the row could not be run or did not do the job

	requests int64
	elapsed  time.Duration
	rps      float64
	p50, p99 time.Duration
	// CPU per request (µs) of the proxy, its agent (or auth server) and the
	// upstream, over the measured window.
	proxyUS, agentUS, upstreamUS float64
	// The part of proxyUS and agentUS spent in the kernel (stime): system
	// calls and the network stack's work charged to the process.
	proxyKernelUS, agentKernelUS float64
	// sutCores is the proxy's and agent's CPU time over the window divided
	// by its length: 1.0 means they kept one core busy.
	sutCores float64
	// others is the CPU time of everything else on the machine (other
	// processes, interrupts not charged to ours) over the window, in cores:
	// busy time from /proc/stat minus that of the row's processes and wrk.
	others float64
	// steal is the CPU time the hypervisor took from the machine over the
	// window, in cores (0 on bare metal): a row measured under steal is
	// slowed by something no configuration here controls.
	steal float64
	// read/write system calls and context switches per request of the proxy and
	// of its agent over the window (see work); negative when /proc did
	// not tell.
	proxySys, agentSys, proxyCS, agentCS float64
	// failures are wrk's non-2xx/3xx responses and socket errors.
	failures int64
	// What reached the upstream in the window: all requests, those with
	// X-Agent-Processed: true.
	upTotal, upMarked int64
}

func (r *result) totalUS() float64 { return r.proxyUS + r.agentUS }

// kernelUS is the part of totalUS spent in the kernel.
func (r *result) kernelUS() float64 { return r.proxyKernelUS + r.agentKernelUS }

// statsAddr is where the row's upstream answers /__peers/stats.
func (rc *rowCtx) statsAddr() string {
	if rc.stats != "" {
		return rc.stats
	}
	return rc.upstream
}

// upstreamStats are the upstream's counters (cmd/upstream).
type upstreamStats struct{ total, marked, admin int64 }

// sawOne checks what the upstream saw since before, a job check's one
// request (unit: "requests", "calls"): not the admin path, one request,
// and marked by the agent when withAgent.
func (s upstreamStats) sawOne(before upstreamStats, admin, unit string, withAgent bool) error {
	if s.admin != before.admin {
		return errors.New("the upstream saw " + admin)
	}
	if s.total-before.total != 1 {
		return fmt.Errorf("the upstream saw %d %s, want 1", s.total-before.total, unit)
	}
	if withAgent && s.marked-before.marked != 1 {
		return fmt.Errorf("the upstream did not see %s: %s", "X-Agent-Processed", "true")
	}
	return nil
}

var checkClient = &http.Client{
	Timeout:   5 * time.Second,
	Transport: &http.Transport{DisableKeepAlives: true},
	CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	},
}

func getStats(upstream string) (upstreamStats, error) {
	var s upstreamStats
	resp, err := checkClient.Get("http://" + upstream + "/__peers/stats")
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	_, err = fmt.Sscanf(string(b), "total=%d marked=%d admin=%d", &s.total, &s.marked, &s.admin)
	return s, err
}

// h2cClient speaks HTTP/2 over cleartext with prior knowledge only, as
// h2load does: a proxy that does not serve h2c fails the job check.
var h2cClient = func() *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Client{
		Timeout:       5 * time.Second,
		Transport:     &http.Transport{Protocols: &p, DisableKeepAlives: true},
		CheckRedirect: checkClient.CheckRedirect,
	}
}()

// status GETs url over HTTP/1.1, or over h2c when h2 is set (and then
// fails unless the answer came over HTTP/2).
func status(url string, h2 bool) (int, error) {
	c := checkClient
	if h2 {
		c = h2cClient
	}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if h2 && resp.ProtoMajor != 2 {
		return 0, fmt.Errorf("answered over %s, want HTTP/2", resp.Proto)
	}
	return resp.StatusCode, nil
}

// checkJob verifies, through the proxy, that the row does the job:
// /admin gets 403 and never reaches the upstream; another path gets 200 and
// reaches the upstream with X-Agent-Processed: true. A row without an agent
// only has to answer 200.
func checkJob(h *harness, rc *rowCtx, withAgent bool) error {
	if rc.grpc {
		return checkGRPCJob(h, rc, withAgent)
	}
	before, err := getStats(rc.upstream)
	if err != nil {
		return fmt.Errorf("upstream stats: %w", err)
	}
	if withAgent {
		code, err := status(rc.target+"/admin", rc.h2)
		if err != nil {
			return fmt.Errorf("GET /admin: %w", err)
		}
		if code != 403 {
			return fmt.Errorf("GET /admin: status %d, want 403", code)
		}
	}
	code, err := status(rc.target+"/peers-check?q=1", rc.h2)
	if err != nil {
		return fmt.Errorf("GET /peers-check: %w", err)
	}
	if code != 200 {
		return fmt.Errorf("GET /peers-check: status %d, want 200", code)
	}
	after, err := getStats(rc.upstream)
	if err != nil {
		return fmt.Errorf("upstream stats: %w", err)
	}
	return after.sawOne(before, "/admin", "requests", withAgent)
}

// wrkOut is what the harness reads from wrk's report.
type wrkOut struct {
	requests int64
	elapsed  time.Duration
	p50, p99 time.Duration
	failures int64
	cpu      time.Duration // wrk's own CPU time
}

// runWrk runs wrk against url for d, pinned to the load CPUs; with -rate,
// cmd/fixedrate instead, which reports in wrk's lines; with h2, h2load
// (h2c with prior knowledge).
func (h *harness) runWrk(dir, name, url string, d time.Duration, h2, grpc bool) (wrkOut, error) {
	if grpc {
		return h.runGRPCLoad(dir, name, url, d)
	}
	if h2 {
		return h.runH2load(dir, name, url, d)
	}
	secs := int((d + time.Second - 1) / time.Second)
	logPath := filepath.Join(dir, name+".log")
	tool, args := "wrk", []string{h.tools["wrk"], "-t" + strconv.Itoa(h.threads), "-c" + strconv.Itoa(h.conns),
		"-d" + strconv.Itoa(secs) + "s", "--latency", url}
	if h.rate > 0 {
		tool, args = "fixedrate", []string{h.bin("fixedrate"), "-c", strconv.Itoa(h.conns),
			"-rate", strconv.FormatFloat(h.rate, 'f', -1, 64), "-d", strconv.Itoa(secs) + "s", url}
	}
	p, err := h.procs.start(tool, h.loadCPUs, logPath, h.goEnv(), args...)
	if err != nil {
		return wrkOut{}, err
	}
	<-p.done
	h.procs.stop(p)
	if p.err != nil {
		return wrkOut{}, fmt.Errorf("%s: %v:\n%s", tool, p.err, p.tail())
	}
	f, err := os.Open(logPath)
	if err != nil {
		return wrkOut{}, err
	}
	defer f.Close()
	o, err := parseWrk(f)
	if st := p.cmd.ProcessState; st != nil {
		o.cpu = st.UserTime() + st.SystemTime()
	}
	return o, err
}

// parseWrk reads wrk's --latency report.
func parseWrk(r io.Reader) (wrkOut, error) {
	var o wrkOut
	var haveReq bool
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && (f[0] == "50%" || f[0] == "99%"):
			d, err := wrkDuration(f[1])
			if err != nil {
				return o, err
			}
			if f[0] == "50%" {
				o.p50 = d
			} else {
				o.p99 = d
			}
		case len(f) >= 4 && f[1] == "requests" && f[2] == "in":
			n, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return o, fmt.Errorf("wrk: %q: %w", sc.Text(), err)
			}
			d, err := wrkDuration(strings.TrimSuffix(f[3], ","))
			if err != nil {
				return o, err
			}
			o.requests, o.elapsed, haveReq = n, d, true
		case len(f) >= 2 && f[0] == "Non-2xx":
			n, _ := strconv.ParseInt(f[len(f)-1], 10, 64)
			o.failures += n
		case len(f) >= 2 && f[0] == "Socket" && f[1] == "errors:":
			// Socket errors: connect 0, read 0, write 0, timeout 0
			for i := 3; i < len(f); i += 2 {
				n, _ := strconv.ParseInt(strings.TrimSuffix(f[i], ","), 10, 64)
				o.failures += n
			}
		}
	}
	if !haveReq || o.elapsed <= 0 {
		return o, errors.New("wrk: no \"requests in\" line in its report")
	}
	return o, nil
}

// wrkDuration parses wrk's times: 812.00us, 3.10ms, 8.00s, 1.00m.
func wrkDuration(s string) (time.Duration, error) {
	units := []struct {
		suffix string
		unit   time.Duration
	}{{"us", time.Microsecond}, {"ms", time.Millisecond}, {"s", time.Second}, {"m", time.Minute}, {"h", time.Hour}}
	for _, u := range units {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				continue
			}
			return time.Duration(math.Round(x * float64(u.unit))), nil
		}
	}
	return 0, fmt.Errorf("wrk: unknown duration %q", s)
}

// runRow measures one row alone.
func (h *harness) runRow(def rowDef, round int) result {
	return h.runRows([]rowDef{def}, round)[0]
}

// rowRun is one row of runRows: its processes and, as it goes, its result.
type rowRun struct {
	def rowDef
	rc  *rowCtx
	res result

	proxyPIDs, agentPIDs, upPIDs []int
	s0                           upstreamStats
	p0, a0                       cpuTime
	u0                           time.Duration
	pw0, aw0                     work
	errPW0, errAW0               error
	w                            wrkOut
	used                         time.Duration // the row's processes' CPU time over the window
}

// runRows starts every row's processes (each row with its own upstream),
// checks each one's job, and measures the rows that started in one window,
// each loaded by its own wrk (or cmd/fixedrate) at the same time. One row
// is the usual measurement; a build and its baseline together (-together)
// share the CPUs and the machine's state of the moment, so that the ratio
// of the two is free of the drift between rounds.
func (h *harness) runRows(defs []rowDef, round int) []result {
	runs := make([]*rowRun, len(defs))
	for i, def := range defs {
		runs[i] = &rowRun{def: def, res: result{key: def.key, name: def.name, round: round}}
	}
	defer func() {
		// Proxy first, then its agent, then the upstream.
		for _, r := range runs {
			if r.rc != nil {
				h.procs.stop(r.rc.proxy)
				h.procs.stop(r.rc.agent)
				h.procs.stop(r.rc.up)
			}
		}
	}()
	var live []*rowRun
	var names []string
	for _, r := range runs {
		if r.res.err = h.startRow(r, round); r.res.err == nil {
			live = append(live, r)
			names = append(names, r.def.name)
		}
	}
	if len(live) == 0 {
		return results(runs)
	}

	h.waitQuiet(strings.Join(names, " and "))
	if h.warmup > 0 {
		h.eachRow(live, func(r *rowRun) error {
			if _, err := h.runWrk(r.rc.dir, "wrk-warmup", r.rc.target+"/", h.warmup, r.def.h2, r.def.grpc); err != nil {
				return fmt.Errorf("warm-up: %w", err)
			}
			return nil
		})
		live = still(live)
		if len(live) == 0 {
			return results(runs)
		}
	}

	for _, r := range live {
		var err1, err2, err3, err4 error
		r.s0, err1 = getStats(r.rc.statsAddr())
		r.p0, err2 = cpuSplitOf(r.proxyPIDs)
		r.a0, err3 = cpuSplitOf(r.agentPIDs)
		r.u0, err4 = cpuOf(r.upPIDs)
		r.pw0, r.errPW0 = workOf(r.proxyPIDs)
		r.aw0, r.errAW0 = workOf(r.agentPIDs)
		r.res.err = errors.Join(err1, err2, err3, err4)
	}
	live = still(live)
	m0, st0 := machineBusy(), machineSteal()
	h.eachRow(live, func(r *rowRun) (err error) {
		r.w, err = h.runWrk(r.rc.dir, "wrk", r.rc.target+"/", h.duration, r.def.h2, r.def.grpc)
		return err
	})
	m1, st1 := machineBusy(), machineSteal()

	// What every row's processes and loads used, to tell other load apart.
	var ours, window time.Duration
	for _, r := range still(live) {
		h.finishRow(r)
		if r.res.err == nil {
			ours += r.used + r.w.cpu
			window = max(window, r.w.elapsed)
		}
	}
	if window > 0 {
		others := max(0, (m1-m0-ours).Seconds()/window.Seconds())
		steal := (st1 - st0).Seconds() / window.Seconds()
		for _, r := range live {
			r.res.others, r.res.steal = others, steal
		}
	}
	return results(runs)
}

// startRow starts a row's upstream and processes and checks its job.
func (h *harness) startRow(r *rowRun, round int) error {
	rc := &rowCtx{dir: filepath.Join(h.tmp, fmt.Sprintf("round%d-%s", round, r.def.key)), h2: r.def.h2}
	r.rc = rc
	if err := os.MkdirAll(rc.dir, 0o755); err != nil {
		return err
	}
	addrs, err := freeAddrs(1)
	if err != nil {
		return err
	}
	rc.upstream = addrs[0]
	if r.def.grpc {
		rc.grpc = true
		var stats []string
		if stats, err = freeAddrs(1); err != nil {
			return err
		}
		rc.stats = stats[0]
		rc.up, err = h.procs.start("grpcupstream", h.loadCPUs, filepath.Join(rc.dir, "grpcupstream.log"), h.goEnv(),
			h.bin("grpcupstream"), "-addr", rc.upstream, "-stats", rc.stats)
		if err == nil {
			err = waitDial(rc.up, "tcp", rc.stats, startTimeout)
		}
	} else {
		rc.up, err = h.procs.start("upstream", h.loadCPUs, filepath.Join(rc.dir, "upstream.log"), h.goEnv(),
			h.bin("upstream"), "-addr", rc.upstream)
	}
	if err == nil {
		err = waitDial(rc.up, "tcp", rc.upstream, startTimeout)
	}
	if err == nil {
		err = r.def.setup(h, rc)
	}
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	if err := checkJob(h, rc, r.def.agent); err != nil {
		return fmt.Errorf("job check: %w", err)
	}
	if rc.proxy != nil && rc.proxyPIDs == nil {
		rc.proxyPIDs = []int{rc.proxy.Pid()}
	}
	r.proxyPIDs = rc.proxyPIDs
	if rc.agent != nil {
		r.agentPIDs = []int{rc.agent.Pid()}
	}
	r.upPIDs = []int{rc.up.Pid()}
	return nil
}

// eachRow runs f for every row at the same time and keeps its error.
func (h *harness) eachRow(rs []*rowRun, f func(*rowRun) error) {
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.res.err = f(r)
		}()
	}
	wg.Wait()
}

// finishRow reads a row's counters after its load and fills its result.
func (h *harness) finishRow(r *rowRun) {
	rc, res, w := r.rc, &r.res, r.w
	pw1, errPW1 := workOf(r.proxyPIDs)
	aw1, errAW1 := workOf(r.agentPIDs)
	p1, err2 := cpuSplitOf(r.proxyPIDs)
	a1, err3 := cpuSplitOf(r.agentPIDs)
	u1, err4 := cpuOf(r.upPIDs)
	s1, err1 := getStats(rc.statsAddr())
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		res.err = err
		return
	}
	for _, p := range []*proc{rc.proxy, rc.agent, rc.up} {
		if p != nil && p.exited() {
			res.err = fmt.Errorf("%s exited during the load (%v):\n%s", p.name, p.err, p.tail())
			return
		}
	}

	res.requests, res.elapsed, res.p50, res.p99, res.failures = w.requests, w.elapsed, w.p50, w.p99, w.failures
	if w.requests == 0 {
		res.err = errors.New("wrk completed no request")
		return
	}
	n := float64(w.requests)
	res.rps = n / w.elapsed.Seconds()
	us := func(d time.Duration) float64 { return float64(d.Microseconds()) / n }
	proxy, agent, up := p1.total()-r.p0.total(), a1.total()-r.a0.total(), u1-r.u0
	res.proxyUS, res.agentUS, res.upstreamUS = us(proxy), us(agent), us(up)
	res.proxyKernelUS, res.agentKernelUS = us(p1.kernel-r.p0.kernel), us(a1.kernel-r.a0.kernel)
	r.used = proxy + agent + up
	res.sutCores = (proxy + agent).Seconds() / w.elapsed.Seconds()
	res.proxySys, res.proxyCS = perRequest(r.pw0, pw1, errors.Join(r.errPW0, errPW1), n)
	res.agentSys, res.agentCS = perRequest(r.aw0, aw1, errors.Join(r.errAW0, errAW1), n)
	res.upTotal, res.upMarked = s1.total-r.s0.total, s1.marked-r.s0.marked
	if s1.admin != r.s0.admin {
		res.err = errors.New("the upstream saw /admin during the load")
	}
	if r.def.agent && res.upMarked != res.upTotal {
		res.err = fmt.Errorf("only %d of %d upstream requests carried X-Agent-Processed", res.upMarked, res.upTotal)
	}
}

// still returns the rows without an error so far.
func still(rs []*rowRun) []*rowRun {
	var out []*rowRun
	for _, r := range rs {
		if r.res.err == nil {
			out = append(out, r)
		}
	}
	return out
}

func results(rs []*rowRun) []result {
	out := make([]result, len(rs))
	for i, r := range rs {
		out[i] = r.res
	}
	return out
}

// quietLoad is the load (cores) under which the machine counts as quiet.
const quietLoad = 0.15

// waitQuiet waits, at most h.quietWait, until the rest of the machine has
// been quiet for a second (the row's servers are idle then), so that a
// build or test run of someone else does not land in a measurement.
func (h *harness) waitQuiet(row string) {
	if h.quietWait <= 0 {
		return
	}
	deadline := time.Now().Add(h.quietWait)
	said := false
	for {
		m0 := machineBusy()
		time.Sleep(time.Second)
		load := (machineBusy() - m0).Seconds()
		if load < quietLoad {
			return
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "peers:   still %.2f cores busy elsewhere after %v: measuring %s anyway\n", load, h.quietWait, row)
			return
		}
		if !said {
			fmt.Fprintf(os.Stderr, "peers:   %.2f cores busy elsewhere: waiting up to %v for quiet\n", load, h.quietWait)
			said = true
		}
	}
}

// perRequest is the work done between a and b per request, or -1 when
// either could not be read.
func perRequest(a, b work, err error, n float64) (syscalls, switches float64) {
	if err != nil {
		return -1, -1
	}
	return float64(b.syscalls-a.syscalls) / n, float64(b.switches-a.switches) / n
}
