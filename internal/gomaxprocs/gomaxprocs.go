// Package gomaxprocs sizes GOMAXPROCS to the process's load: it lowers it
// while the CPU the process uses fits in fewer Ps, and gives the runtime
// its default back as soon as it does not.
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
// of each P's time, GOMAXPROCS goes up at once, at least doubling. When
// its use would fit in fewer Ps at LowerTo each, for LowerAfter without a
// break, GOMAXPROCS goes down to that many. The gap between the two
// thresholds keeps it from flapping, since the same work costs less CPU
// with fewer Ps (the wake-ups this package removes), and a lowering that
// bounces back makes the next one wait longer.
//
// GOMAXPROCS is process-wide, so the changes are counted in package state
// (Changes, Adapting). Start does nothing when the GOMAXPROCS environment
// variable is set (the operator chose) or when the runtime's default is
// already 1.
package gomaxprocs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// The thresholds of the rule, in cores used per P.
const (
	// RaiseAbove: an interval in which the process used more than this of
	// each P's time raises GOMAXPROCS. At 0.75 of one P a request that
	// arrives waits on average 1.5 times a request's service time before
	// it runs (M/D/1); above that, waiting grows quickly.
	RaiseAbove = 0.75
	// LowerTo: the load GOMAXPROCS is lowered to fit, per P. Its gap to
	// RaiseAbove is the hysteresis. The load is measured with more Ps than
	// it will run on, and there it costs more (the wake-ups): at 2 000
	// requests/s the sidecar used 0.35–0.53 cores with 2 Ps and 0.19–0.26
	// with 1, so a lower LowerTo would keep the extra Ps just where they
	// cost the most.
	LowerTo = 0.6
)

// Config configures Start.
type Config struct {
	// Interval between two readings of the process's CPU time (default
	// 100ms): how long a sudden load runs on the lowered Ps at most
	// before they are raised.
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

// Policy is the rule on its own, fed the CPU time used over each
// interval; Start drives it with real readings. The zero value is not
// usable: set Max, Procs and LowerAfter.
//
// A raise soon after a lowering (a bounce: the load did not fit after
// all) doubles the time the next lowering waits for, up to MaxBackoff
// times LowerAfter; a raise after a lowering that held that long resets
// it. A load that sits at the threshold then costs a change now and then,
// not one every LowerAfter.
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
	since   time.Duration // time since the last lowering, while lowered
	lowered bool          // a lowering happened (since is meaningful)
}

// MaxBackoff bounds the doubling of LowerAfter after bounces: 2^6 = 64
// times (about 2 minutes at the default 2s).
const MaxBackoff = 6

// Wait is how long the load must fit in fewer Ps now before Next lowers
// the count: LowerAfter, doubled by each bounce.
func (p *Policy) Wait() time.Duration { return p.LowerAfter << p.backoff }

// Next takes the CPU time used over an interval of elapsed wall time and
// returns the count of Ps to run with from now on; it updates Procs to it.
func (p *Policy) Next(used, elapsed time.Duration) int {
	if elapsed <= 0 {
		return p.Procs
	}
	if p.lowered {
		p.since += elapsed
	}
	u := used.Seconds() / elapsed.Seconds() // cores used
	if p.Procs < p.Max && u > RaiseAbove*float64(p.Procs) {
		if p.lowered && p.since < p.Wait() {
			p.backoff = min(p.backoff+1, MaxBackoff)
		} else {
			p.backoff = 0
		}
		n := max(2*p.Procs, fit(u))
		p.Procs, p.low, p.want, p.lowered = min(n, p.Max), 0, 0, false
		return p.Procs
	}
	want := fit(u)
	if want >= p.Procs {
		p.low, p.want = 0, 0
		return p.Procs
	}
	p.low += elapsed
	p.want = max(p.want, want)
	if p.low >= p.Wait() {
		p.Procs, p.low, p.want = p.want, 0, 0
		p.lowered, p.since = true, 0
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

// running is 1 while a Start's goroutine adapts GOMAXPROCS.
var running atomic.Int32

// Changes returns how many times Start's goroutine raised and lowered GOMAXPROCS.
func Changes() (up, down uint64) { return raised.Load(), lowered.Load() }

// Adapting reports whether a Start's goroutine is adapting GOMAXPROCS now.
func Adapting() bool { return running.Load() > 0 }

// ErrNotAdapting is returned by Start when it leaves GOMAXPROCS alone.
var ErrNotAdapting = errors.New("gomaxprocs: not adapting")

// Start begins adapting GOMAXPROCS to the process's load in a goroutine
// of its own, until ctx ends; then GOMAXPROCS goes back to the runtime's
// default and the returned channel closes. It adapts nothing and returns
// an error wrapping ErrNotAdapting, saying why, when the GOMAXPROCS
// environment variable is set, when the runtime's default is 1, when the
// process's CPU time cannot be read, or when another Start is adapting;
// and ErrConfig's wrap for a bad cfg. Changes are logged at debug level
// only: under a load that swings they can come every LowerAfter.
func Start(ctx context.Context, cfg Config, log zerolog.Logger) (<-chan struct{}, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if v := os.Getenv("GOMAXPROCS"); v != "" {
		return nil, fmt.Errorf("%w: the GOMAXPROCS environment variable is set (%s)", ErrNotAdapting, v)
	}
	cpu, err := cpuTime()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotAdapting, err)
	}
	if !running.CompareAndSwap(0, 1) {
		return nil, fmt.Errorf("%w: already adapting", ErrNotAdapting)
	}
	// Start from the runtime's default, whatever was set before.
	runtime.SetDefaultGOMAXPROCS()
	p := &Policy{Max: runtime.GOMAXPROCS(0), LowerAfter: cfg.LowerAfter}
	p.Procs = p.Max
	if p.Max <= 1 {
		running.Store(0)
		return nil, fmt.Errorf("%w: the runtime's default GOMAXPROCS is 1", ErrNotAdapting)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer running.Store(0)
		defer runtime.SetDefaultGOMAXPROCS()
		p.run(ctx, cfg.Interval, cpu, log)
	}()
	return done, nil
}

// run reads the CPU time every interval and applies the policy's changes.
func (p *Policy) run(ctx context.Context, interval, lastCPU time.Duration, log zerolog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	lastT := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			cpu, err := cpuTime()
			if err != nil {
				continue
			}
			was := p.Procs
			n := p.Next(cpu-lastCPU, now.Sub(lastT))
			lastCPU, lastT = cpu, now
			if n == was {
				continue
			}
			if n >= p.Max {
				// Back to the default, which also re-enables the runtime's
				// own updates from the cgroup's CPU limit; that limit may
				// have changed meanwhile.
				runtime.SetDefaultGOMAXPROCS()
				p.Max = runtime.GOMAXPROCS(0)
				p.Procs = p.Max
			} else {
				runtime.GOMAXPROCS(n)
			}
			if p.Procs > was {
				raised.Add(1)
			} else {
				lowered.Add(1)
			}
			log.Debug().Int("from", was).Int("to", p.Procs).Msg("GOMAXPROCS changed to fit the load")
		}
	}
}
