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

// upstreamStats are the upstream's counters (cmd/upstream).
type upstreamStats struct{ total, marked, admin int64 }

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

func status(url string) (int, error) {
	resp, err := checkClient.Get(url)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// checkJob verifies, through the proxy, that the row does the job:
// /admin gets 403 and never reaches the upstream; another path gets 200 and
// reaches the upstream with X-Agent-Processed: true. A row without an agent
// only has to answer 200.
func checkJob(rc *rowCtx, withAgent bool) error {
	before, err := getStats(rc.upstream)
	if err != nil {
		return fmt.Errorf("upstream stats: %w", err)
	}
	if withAgent {
		code, err := status(rc.target + "/admin")
		if err != nil {
			return fmt.Errorf("GET /admin: %w", err)
		}
		if code != 403 {
			return fmt.Errorf("GET /admin: status %d, want 403", code)
		}
	}
	code, err := status(rc.target + "/peers-check?q=1")
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
	if after.admin != before.admin {
		return errors.New("the upstream saw /admin")
	}
	if after.total-before.total != 1 {
		return fmt.Errorf("the upstream saw %d requests, want 1", after.total-before.total)
	}
	if withAgent && after.marked-before.marked != 1 {
		return fmt.Errorf("the upstream did not see %s: %s", "X-Agent-Processed", "true")
	}
	return nil
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
// cmd/fixedrate instead, which reports in wrk's lines.
func (h *harness) runWrk(dir, name, url string, d time.Duration) (wrkOut, error) {
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

// runRow starts a row, checks it, warms it up, measures it and stops it.
func (h *harness) runRow(def rowDef, round int) (res result) {
	res = result{key: def.key, name: def.name, round: round}
	rc := &rowCtx{dir: filepath.Join(h.tmp, fmt.Sprintf("round%d-%s", round, def.key))}
	defer func() {
		// Proxy first, then its agent, then the upstream.
		h.procs.stop(rc.proxy)
		h.procs.stop(rc.agent)
		h.procs.stop(rc.up)
	}()
	if err := os.MkdirAll(rc.dir, 0o755); err != nil {
		res.err = err
		return res
	}
	addrs, err := freeAddrs(1)
	if err != nil {
		res.err = err
		return res
	}
	rc.upstream = addrs[0]
	rc.up, err = h.procs.start("upstream", h.loadCPUs, filepath.Join(rc.dir, "upstream.log"), h.goEnv(),
		h.bin("upstream"), "-addr", rc.upstream)
	if err == nil {
		err = waitDial(rc.up, "tcp", rc.upstream, startTimeout)
	}
	if err == nil {
		err = def.setup(h, rc)
	}
	if err != nil {
		res.err = fmt.Errorf("start: %w", err)
		return res
	}
	if err := checkJob(rc, def.agent); err != nil {
		res.err = fmt.Errorf("job check: %w", err)
		return res
	}
	if rc.proxy != nil && rc.proxyPIDs == nil {
		rc.proxyPIDs = []int{rc.proxy.Pid()}
	}
	var agentPIDs []int
	if rc.agent != nil {
		agentPIDs = []int{rc.agent.Pid()}
	}
	upPIDs := []int{rc.up.Pid()}

	h.waitQuiet(def.name)
	if h.warmup > 0 {
		if _, err := h.runWrk(rc.dir, "wrk-warmup", rc.target+"/", h.warmup); err != nil {
			res.err = fmt.Errorf("warm-up: %w", err)
			return res
		}
	}

	s0, err1 := getStats(rc.upstream)
	p0, err2 := cpuSplitOf(rc.proxyPIDs)
	a0, err3 := cpuSplitOf(agentPIDs)
	u0, err4 := cpuOf(upPIDs)
	m0, st0 := machineBusy(), machineSteal()
	pw0, errPW0 := workOf(rc.proxyPIDs)
	aw0, errAW0 := workOf(agentPIDs)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		res.err = err
		return res
	}
	w, err := h.runWrk(rc.dir, "wrk", rc.target+"/", h.duration)
	if err != nil {
		res.err = err
		return res
	}
	m1, st1 := machineBusy(), machineSteal()
	pw1, errPW1 := workOf(rc.proxyPIDs)
	aw1, errAW1 := workOf(agentPIDs)
	p1, err2 := cpuSplitOf(rc.proxyPIDs)
	a1, err3 := cpuSplitOf(agentPIDs)
	u1, err4 := cpuOf(upPIDs)
	s1, err1 := getStats(rc.upstream)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		res.err = err
		return res
	}
	for _, p := range []*proc{rc.proxy, rc.agent, rc.up} {
		if p != nil && p.exited() {
			res.err = fmt.Errorf("%s exited during the load (%v):\n%s", p.name, p.err, p.tail())
			return res
		}
	}

	res.requests, res.elapsed, res.p50, res.p99, res.failures = w.requests, w.elapsed, w.p50, w.p99, w.failures
	if w.requests == 0 {
		res.err = errors.New("wrk completed no request")
		return res
	}
	n := float64(w.requests)
	res.rps = n / w.elapsed.Seconds()
	us := func(d time.Duration) float64 { return float64(d.Microseconds()) / n }
	res.proxyUS, res.agentUS, res.upstreamUS = us(p1.total()-p0.total()), us(a1.total()-a0.total()), us(u1-u0)
	res.proxyKernelUS, res.agentKernelUS = us(p1.kernel-p0.kernel), us(a1.kernel-a0.kernel)
	res.sutCores = (p1.total() - p0.total() + a1.total() - a0.total()).Seconds() / w.elapsed.Seconds()
	ours := (p1.total() - p0.total()) + (a1.total() - a0.total()) + (u1 - u0) + w.cpu
	res.others = max(0, (m1-m0-ours).Seconds()/w.elapsed.Seconds())
	res.steal = (st1 - st0).Seconds() / w.elapsed.Seconds()
	res.proxySys, res.proxyCS = perRequest(pw0, pw1, errors.Join(errPW0, errPW1), n)
	res.agentSys, res.agentCS = perRequest(aw0, aw1, errors.Join(errAW0, errAW1), n)
	res.upTotal, res.upMarked = s1.total-s0.total, s1.marked-s0.marked
	if s1.admin != s0.admin {
		res.err = errors.New("the upstream saw /admin during the load")
	}
	if def.agent && res.upMarked != res.upTotal {
		res.err = fmt.Errorf("only %d of %d upstream requests carried X-Agent-Processed", res.upMarked, res.upTotal)
	}
	return res
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
