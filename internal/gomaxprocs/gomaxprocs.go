// Package gomaxprocs sizes GOMAXPROCS to the process's load: it lowers it
// while the CPU the process uses fits in fewer Ps, and raises it again,
// up to the runtime's default, at the next reading when it does not.
//
// Why: a proxy that is far from busy spends most of its CPU waking up.
// With idle Ps, every goroutine made runnable (a socket ready, an agent's
// reply) makes the Go scheduler wake another thread to look for work,
// which finds none and sleeps again. Measured on 2 vCPUs at 2 000
// requests/s through 16 connections (docs/operations.md, "CPU per request
// at a light load"): the sidecar cost 172–185 µs of CPU per request with
// GOMAXPROCS=2 and 96–101 with GOMAXPROCS=1, its Go SDK agent 76–79 and
// 35–36. A fixed GOMAXPROCS=1 caps a busy process at one core; Start gets
// the light-load cost without the cap.
//
// The rule (Policy): every Interval the process's CPU time (user + system,
// all threads, from getrusage) is read. When it used more than RaiseAbove
// of each P's time, or when its goroutines waited to run (the runtime's
// /sched/latencies: at least StarvedShare of the interval's waits took
// StarvedWait or more, as when other processes hold the CPUs and the
// process's CPU time alone cannot show the demand), GOMAXPROCS goes up,
// at least doubling. When its use would fit in fewer Ps at LowerTo each,
// for LowerAfter without a break, GOMAXPROCS goes down to that many. The gap between the two
// thresholds keeps it from flapping, since the same work costs less CPU
// with fewer Ps (the wake-ups this package removes), and a lowering that
// bounces back makes the next one wait longer.
//
// GOMAXPROCS is process-wide, so the changes are counted in package state
// (Changes, Adapting). Start does nothing when the GOMAXPROCS environment
// variable is set (the operator chose) or when the runtime's default is
// already 1. While GOMAXPROCS is at the runtime's default, the runtime may
// change that default by itself (Go 1.25+: a new cgroup CPU limit or CPU
// affinity); every reading takes the current value as the new maximum,
// and every change starts from the current default, so that Start never
// sets more Ps than the runtime would.
package gomaxprocs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/metrics"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// The thresholds of the rule.
const (
	// RaiseAbove: an interval in which the process used more than this of
	// each P's time (cores per P) raises GOMAXPROCS. At 0.75 of one P a
	// request that arrives waits on average 1.5 times a request's service
	// time before it runs (M/D/1); above that, waiting grows quickly.
	RaiseAbove = 0.75
	// LowerTo: the load GOMAXPROCS is lowered to fit, in cores per P. Its
	// gap to RaiseAbove is the hysteresis. The load is measured with more
	// Ps than it will run on, and there it costs more (the wake-ups): at
	// 2 000 requests/s, 172–185 µs of CPU per request for the sidecar with
	// 2 Ps (0.34–0.37 cores) and 96–101 with 1 (0.19–0.20), and in a slow
	// spell of the same machine 0.45–0.53 cores with 2 Ps; a lower LowerTo
	// would keep the extra Ps just where they cost the most.
	LowerTo = 0.6
	// StarvedWait and StarvedShare: an interval in which at least
	// StarvedShare of the goroutines' waits to run (and StarvedMin of them)
	// took StarvedWait or more raises GOMAXPROCS, whatever the CPU time.
	// On one P under a load it carries, a wait is a few goroutines' turns,
	// tens to hundreds of µs. The runtime records one goroutine transition
	// in eight, so a proxy's thousands per interval give it enough waits,
	// while a few CPU-bound goroutines give too few (their CPU time raises
	// instead).
	StarvedWait  = time.Millisecond
	StarvedShare = 0.01
	StarvedMin   = 10
)

// Config configures Start.
type Config struct {
	// Interval between two readings (default 100ms). A load that outgrows
	// the Ps is seen at the end of the interval it starts in, and each
	// reading at least doubles the Ps: from 1 to 16 takes four readings.
	Interval time.Duration
	// LowerAfter: how long the load must fit in fewer Ps without a break
	// before GOMAXPROCS is lowered (default 2s).
	LowerAfter time.Duration
}

// Bounds of Config's fields.
const (
	MinInterval   = 10 * time.Millisecond
	MaxInterval   = 10 * time.Second
	MaxLowerAfter = 10 * time.Minute
)

// ErrConfig marks a Config that Validate refused.
var ErrConfig = errors.New("gomaxprocs: invalid config")

// DefaultConfig returns the defaults: Interval 100ms, LowerAfter 2s.
func DefaultConfig() Config {
	return Config{Interval: 100 * time.Millisecond, LowerAfter: 2 * time.Second}
}

// Validate checks the bounds: Interval within [MinInterval, MaxInterval],
// LowerAfter within [Interval, MaxLowerAfter].
func (c Config) Validate() error {
	if c.Interval < MinInterval || c.Interval > MaxInterval {
		return fmt.Errorf("%w: interval %v is outside [%v, %v]", ErrConfig, c.Interval, MinInterval, MaxInterval)
	}
	if c.LowerAfter < c.Interval || c.LowerAfter > MaxLowerAfter {
		return fmt.Errorf("%w: lower_after %v is outside [interval %v, %v]", ErrConfig, c.LowerAfter, c.Interval, MaxLowerAfter)
	}
	return nil
}

// Policy is the rule on its own, fed what each interval measured; Start
// drives it with real readings. The zero value is not usable: set Max,
// Procs and LowerAfter.
//
// A bounce (the first raise after a lowering comes before the lowering
// has held for its wait: the load did not fit after all) doubles the time
// the next lowering waits for, up to MaxBackoff doublings; a first raise
// after a lowering that held resets it. A load that sits at the threshold
// then costs a change now and then, not one every LowerAfter.
type Policy struct {
	// Max is the most Ps the policy asks for: the runtime's default.
	Max int
	// Procs is the current count.
	Procs int
	// LowerAfter is how long a lower count must do before it is taken.
	LowerAfter time.Duration

	low     time.Duration // how long the load has fitted in fewer Ps
	want    int           // the most Ps wanted during that spell
	backoff int           // the wait before lowering is LowerAfter << backoff
	since   time.Duration // time since the last lowering
	judged  bool          // the raise after the last lowering was judged
}

// MaxBackoff bounds the doubling of LowerAfter after bounces: 2^6 = 64
// times (about 2 minutes at the default 2s).
const MaxBackoff = 6

// Wait is how long the load must fit in fewer Ps now before Next lowers
// the count: LowerAfter, doubled by each bounce (saturating).
func (p *Policy) Wait() time.Duration {
	if p.LowerAfter > math.MaxInt64>>p.backoff {
		return math.MaxInt64
	}
	return p.LowerAfter << p.backoff
}

// Next takes the CPU time used over an interval of elapsed wall time and
// whether the process's goroutines starved for a P in it, and returns the
// count of Ps to run with from now on; it updates Procs to it.
func (p *Policy) Next(used, elapsed time.Duration, starved bool) int {
	if elapsed <= 0 {
		return p.Procs
	}
	p.since += elapsed
	u := used.Seconds() / elapsed.Seconds() // cores used
	if p.Procs < p.Max && (starved || u > RaiseAbove*float64(p.Procs)) {
		if !p.judged {
			// The first raise after a lowering tells whether it held.
			if p.since < p.Wait() {
				p.backoff = min(p.backoff+1, MaxBackoff)
			} else {
				p.backoff = 0
			}
			p.judged = true
		}
		n := max(2*p.Procs, fit(u))
		p.Procs, p.low, p.want = min(n, p.Max), 0, 0
		return p.Procs
	}
	want := fit(u)
	if starved || want >= p.Procs {
		p.low, p.want = 0, 0
		return p.Procs
	}
	p.low += elapsed
	p.want = max(p.want, want)
	if p.low >= p.Wait() {
		p.Procs, p.low, p.want = p.want, 0, 0
		p.since, p.judged = 0, false
	}
	return p.Procs
}

// fit is how many Ps carry a load of u cores at LowerTo each (at least 1).
func fit(u float64) int {
	n := math.Ceil(u / LowerTo)
	if n < 1 || math.IsNaN(n) {
		return 1
	}
	if n > math.MaxInt32 {
		return math.MaxInt32
	}
	return int(n)
}

// Counters of the changes made, process-wide.
var raised, lowered atomic.Uint64

// running is set while a Start's goroutine adapts GOMAXPROCS.
var running atomic.Bool

// Changes returns how many times Start's goroutine raised and lowered
// GOMAXPROCS.
func Changes() (up, down uint64) { return raised.Load(), lowered.Load() }

// Adapting reports whether a Start's goroutine is adapting GOMAXPROCS now.
func Adapting() bool { return running.Load() }

// ErrNotAdapting is returned by Start when it leaves GOMAXPROCS alone.
var ErrNotAdapting = errors.New("gomaxprocs: not adapting")

// Start begins adapting GOMAXPROCS to the process's load in a goroutine
// of its own, until ctx ends; then GOMAXPROCS goes back to the runtime's
// default and the returned channel closes. It starts from the runtime's
// default: a GOMAXPROCS the program set in code is replaced. It adapts
// nothing, leaves GOMAXPROCS as it was and returns an error wrapping
// ErrNotAdapting, saying why, when the GOMAXPROCS environment variable is
// set, when the runtime's default is 1, when the process's CPU time cannot
// be read, or when another Start is adapting; and ErrConfig's wrap for a
// bad cfg. Changes are logged at debug level only: under a load that
// swings they can come every LowerAfter.
func Start(ctx context.Context, cfg Config, log zerolog.Logger) (<-chan struct{}, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if v := os.Getenv("GOMAXPROCS"); v != "" {
		return nil, fmt.Errorf("%w: the GOMAXPROCS environment variable is set (%s)", ErrNotAdapting, v)
	}
	e := newProcess()
	if _, err := e.cpu(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotAdapting, err)
	}
	if !running.CompareAndSwap(false, true) {
		return nil, fmt.Errorf("%w: already adapting", ErrNotAdapting)
	}
	was := runtime.GOMAXPROCS(0)
	if def := e.setDefault(); def <= 1 {
		if was != def {
			runtime.GOMAXPROCS(was)
		}
		running.Store(false)
		return nil, fmt.Errorf("%w: the runtime's default GOMAXPROCS is 1", ErrNotAdapting)
	}
	t := time.NewTicker(cfg.Interval)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer running.Store(false)
		defer runtime.SetDefaultGOMAXPROCS()
		defer t.Stop()
		run(ctx, t.C, e, cfg.LowerAfter, log)
	}()
	return done, nil
}

// env is what run reads and changes: the process (process), or a fake in
// tests.
type env interface {
	cpu() (time.Duration, error) // the process's CPU time so far
	starved() bool               // whether goroutines starved since the last call
	procs() int                  // GOMAXPROCS now
	setDefault() int             // GOMAXPROCS back to the runtime's default, which it returns
	set(n int)                   // GOMAXPROCS to n
	now() time.Time
}

// run applies the policy at every tick until ctx ends.
func run(ctx context.Context, ticks <-chan time.Time, e env, lowerAfter time.Duration, log zerolog.Logger) {
	p := Policy{Max: e.procs(), LowerAfter: lowerAfter}
	p.Procs = p.Max
	lastCPU, _ := e.cpu()
	lastT := e.now()
	e.starved()
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-ticks:
			if !ok {
				return // only a test's ticks end
			}
		}
		cpu, err := e.cpu()
		now := e.now()
		starved := e.starved()
		if err != nil {
			continue
		}
		if p.Procs == p.Max {
			// At the default, which the runtime may have changed by itself.
			cur := e.procs()
			p.Max, p.Procs = cur, cur
		}
		n := p.Next(cpu-lastCPU, now.Sub(lastT), starved)
		lastCPU, lastT = cpu, now
		was := e.procs()
		if n == was {
			continue
		}
		// Every change starts from the current default (one more stop of
		// the world when lowering): never more Ps than the runtime would
		// set, and its own updates back on at the default.
		def := e.setDefault()
		p.Max = def
		if n < def {
			e.set(n)
			p.Procs = n
		} else {
			p.Procs = def
		}
		switch {
		case p.Procs > was:
			raised.Add(1)
		case p.Procs < was:
			lowered.Add(1)
		default:
			continue
		}
		log.Debug().Int("from", was).Int("to", p.Procs).Bool("starved", starved).Msg("GOMAXPROCS changed to fit the load")
	}
}

// process is the env of the running process.
type process struct {
	sample []metrics.Sample
	last   []uint64 // the latency histogram's counts at the last reading
	slowAt int      // the first bucket whose waits are StarvedWait or more
}

const latencies = "/sched/latencies:seconds"

func newProcess() *process {
	return &process{sample: []metrics.Sample{{Name: latencies}}, slowAt: -1}
}

func (*process) cpu() (time.Duration, error) { return cpuTime() }
func (*process) procs() int                  { return runtime.GOMAXPROCS(0) }
func (*process) set(n int)                   { runtime.GOMAXPROCS(n) }
func (*process) now() time.Time              { return time.Now() }

func (*process) setDefault() int {
	runtime.SetDefaultGOMAXPROCS()
	return runtime.GOMAXPROCS(0)
}

// starved compares the scheduling latency histogram with the last
// reading's.
func (pr *process) starved() bool {
	metrics.Read(pr.sample)
	if pr.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return false
	}
	h := pr.sample[0].Value.Float64Histogram()
	if pr.slowAt < 0 {
		pr.slowAt = len(h.Counts)
		for i := range h.Counts {
			if h.Buckets[i] >= StarvedWait.Seconds() {
				pr.slowAt = i
				break
			}
		}
	}
	if len(pr.last) != len(h.Counts) {
		pr.last = append(pr.last[:0], h.Counts...)
		return false
	}
	var total, slow uint64
	for i, c := range h.Counts {
		d := c - pr.last[i]
		total += d
		if i >= pr.slowAt {
			slow += d
		}
	}
	copy(pr.last, h.Counts)
	return slow >= StarvedMin && float64(slow) >= StarvedShare*float64(total)
}
