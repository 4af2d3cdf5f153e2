package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one child process: a server of a row, or wrk.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string        // file holding its stdout and stderr
	done chan struct{} // closed when it has exited
	err  error         // its exit status, once done
}

// Pid is the process id (taskset execs the program, so it is the server's).
func (p *proc) Pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// tail is the end of the process's log, for error messages.
func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 1500 {
		b = b[len(b)-1500:]
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "(no output)"
	}
	return s
}

// procs starts and stops every child process. Each child runs in its own
// process group, so that Ctrl-C on the terminal reaches only the harness,
// which then stops them all (and nginx's worker with its master); each is
// also killed by the kernel if the harness dies first (Pdeathsig).
type procs struct {
	mu      sync.Mutex
	live    map[*proc]bool
	closing bool
}

func newProcs() *procs { return &procs{live: map[*proc]bool{}} }

// start runs argv with extra environment variables, pinned to cpus with
// taskset when cpus is not empty; its output goes to logPath.
func (ps *procs) start(name, cpus, logPath string, env []string, argv ...string) (*proc, error) {
	if cpus != "" {
		argv = append([]string{"taskset", "-c", cpus}, argv...)
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}

	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.closing {
		return nil, errors.New("stopping")
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	ps.live[p] = true
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// stop ends p's process group: SIGTERM, then SIGKILL after a grace period.
func (ps *procs) stop(p *proc) {
	if p == nil {
		return
	}
	pgid := p.Pid()
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(3 * time.Second):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
	// Whatever is left in the group (an nginx worker whose master died).
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	ps.mu.Lock()
	delete(ps.live, p)
	ps.mu.Unlock()
}

// stopAll stops every live process; with final set, no process starts
// afterwards.
func (ps *procs) stopAll(final bool) {
	ps.mu.Lock()
	if final {
		ps.closing = true
	}
	var all []*proc
	for p := range ps.live {
		all = append(all, p)
	}
	ps.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range all {
		wg.Add(1)
		go func() { defer wg.Done(); ps.stop(p) }()
	}
	wg.Wait()
}

// freeAddrs returns n distinct free TCP addresses on 127.0.0.1.
func freeAddrs(n int) ([]string, error) {
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, l)
		out = append(out, l.Addr().String())
	}
	return out, nil
}

// waitDial waits until network/addr accepts connections, or p exits, or
// the timeout passes.
func waitDial(p *proc, network, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if p != nil && p.exited() {
			return fmt.Errorf("%s exited (%v):\n%s", p.name, p.err, p.tail())
		}
		c, err := net.DialTimeout(network, addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			name := "server"
			if p != nil {
				name = p.name
			}
			return fmt.Errorf("%s not listening on %s after %v: %v", name, addr, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitHTTP200 waits until GET url answers 200.
func waitHTTP200(p *proc, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var last string
	for {
		if p.exited() {
			return fmt.Errorf("%s exited (%v):\n%s", p.name, p.err, p.tail())
		}
		resp, err := c.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %s not ready after %v: %s", p.name, url, timeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cpuTicksSplit is a process's user and kernel CPU time so far (utime and
// stime of /proc/<pid>/stat: all its threads, living and ended), in clock
// ticks.
func cpuTicksSplit(pid int) (user, kernel int64, err error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0, err
	}
	user, kernel, err = statTimes(b)
	if err != nil {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return user, kernel, nil
}

// statTimes reads utime and stime from the text of a /proc/<pid>/stat.
func statTimes(b []byte) (user, kernel int64, err error) {
	// The command name may contain spaces and parentheses: fields start
	// after the last ')'. Field 3 (state) is f[0]; utime (14) is f[11],
	// stime (15) f[12].
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, errors.New("unexpected format")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, 0, errors.New("too few fields")
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, errors.New("bad times")
	}
	return u, s, nil
}

// work is what processes did besides using CPU: their read/write system
// calls (syscr + syscw of /proc/<pid>/io: the read and write family of all
// threads, living and ended; recvfrom, sendto and the other socket calls
// are not in these counters, nor are epoll, futex and the like)
// and the context switches of their living threads (voluntary and not,
// from /proc/<pid>/task/*/status). On one shared core both explain CPU
// time that profiles spread thinly: every switch between the proxy and
// its agent costs each a few microseconds.
type work struct{ syscalls, switches int64 }

// workOf sums the work counters of pids.
func workOf(pids []int) (work, error) {
	var w work
	for _, pid := range pids {
		dir := filepath.Join("/proc", strconv.Itoa(pid))
		b, err := os.ReadFile(filepath.Join(dir, "io"))
		if err != nil {
			return work{}, err
		}
		for _, k := range []string{"syscr", "syscw"} {
			n, err := procField(b, k)
			if err != nil {
				return work{}, fmt.Errorf("%s/io: %w", dir, err)
			}
			w.syscalls += n
		}
		tasks, err := os.ReadDir(filepath.Join(dir, "task"))
		if err != nil {
			return work{}, err
		}
		for _, t := range tasks {
			b, err := os.ReadFile(filepath.Join(dir, "task", t.Name(), "status"))
			if err != nil {
				continue // the thread ended meanwhile
			}
			for _, k := range []string{"voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"} {
				if n, err := procField(b, k); err == nil {
					w.switches += n
				}
			}
		}
	}
	return w, nil
}

// procField is the number after "key:" on its own line of a /proc file.
func procField(b []byte, key string) (int64, error) {
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(line, ":")
		if ok && k == key {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s", key)
}

// clockTick is the unit of /proc/<pid>/stat times: USER_HZ, which Linux
// fixes at 100 for user space on every architecture this runs on.
const clockTick = 10 * time.Millisecond

// cpuOf is the CPU time used so far by the processes pids together.
func cpuOf(pids []int) (time.Duration, error) {
	c, err := cpuSplitOf(pids)
	return c.total(), err
}

// cpuTime is CPU time split into user and kernel (system) time.
type cpuTime struct{ user, kernel time.Duration }

func (c cpuTime) total() time.Duration { return c.user + c.kernel }

// cpuSplitOf is the user and kernel CPU time used so far by the processes
// pids together.
func cpuSplitOf(pids []int) (cpuTime, error) {
	var c cpuTime
	for _, pid := range pids {
		u, s, err := cpuTicksSplit(pid)
		if err != nil {
			return cpuTime{}, err
		}
		c.user += time.Duration(u) * clockTick
		c.kernel += time.Duration(s) * clockTick
	}
	return c, nil
}

// children lists the processes whose parent is pid (nginx's workers).
func children(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, n)
		}
	}
	return out
}

// machineBusy is the CPU time all CPUs spent busy so far (user, nice,
// system, irq, softirq from /proc/stat; idle, iowait and steal excluded).
func machineBusy() time.Duration { return statSum(1, 2, 3, 6, 7) }

// machineSteal is the CPU time the hypervisor took from this machine's
// CPUs so far (steal in /proc/stat): on a shared VM, time our processes
// wanted to run and could not, which slows every row that meets it.
func machineSteal() time.Duration { return statSum(8) }

// statSum adds the given columns of /proc/stat's cpu line.
func statSum(cols ...int) time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal …
	var t int64
	for _, i := range cols {
		if i < len(f) {
			n, _ := strconv.ParseInt(f[i], 10, 64)
			t += n
		}
	}
	return time.Duration(t) * clockTick
}
