package gomaxprocs

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// fakeStep is one interval of a fakeEnv: the CPU time used, whether
// goroutines starved, and the runtime's default during it (0: as before).
type fakeStep struct {
	used    time.Duration
	starved bool
	def     int
}

// fakeEnv plays the process for run: GOMAXPROCS, the runtime's default
// (which GOMAXPROCS follows while it is at the default, as the runtime's
// own updates do), CPU time and the clock, one step per tick.
type fakeEnv struct {
	t         *testing.T
	now0      time.Time
	cpuT      time.Duration
	def, cur  int
	atDefault bool
	steps     []fakeStep
	i         int
	started   bool
	trace     []int // GOMAXPROCS after each step
}

func (f *fakeEnv) cpu() (time.Duration, error) {
	if !f.started {
		f.started = true
		return f.cpuT, nil
	}
	if f.i > 0 {
		f.trace = append(f.trace, f.cur)
	}
	st := f.steps[f.i]
	f.i++
	f.now0 = f.now0.Add(tick)
	f.cpuT += st.used
	if st.def != 0 {
		f.def = st.def
		if f.atDefault {
			f.cur = f.def
		}
	}
	return f.cpuT, nil
}

func (f *fakeEnv) starved() bool {
	if f.i == 0 {
		return false
	}
	return f.steps[f.i-1].starved
}

func (f *fakeEnv) procs() int     { return f.cur }
func (f *fakeEnv) now() time.Time { return f.now0 }

func (f *fakeEnv) setDefault() int {
	f.cur, f.atDefault = f.def, true
	return f.def
}

func (f *fakeEnv) set(n int) {
	if n > f.def {
		f.t.Errorf("step %d: GOMAXPROCS set to %d, above the runtime's default %d", f.i, n, f.def)
	}
	f.cur, f.atDefault = n, false
}

// play runs run over steps from GOMAXPROCS def and returns GOMAXPROCS after
// each step, and the changes counted.
func play(t *testing.T, def int, steps []fakeStep) (trace []int, up, down uint64) {
	t.Helper()
	f := &fakeEnv{t: t, now0: time.Unix(0, 0), def: def, cur: def, atDefault: true, steps: steps}
	ticks := make(chan time.Time, len(steps))
	for range steps {
		ticks <- time.Time{}
	}
	close(ticks)
	up0, down0 := Changes()
	run(context.Background(), ticks, f, time.Second, zerolog.Nop())
	f.trace = append(f.trace, f.cur)
	up1, down1 := Changes()
	return f.trace, up1 - up0, down1 - down0
}

func steps(n int, cores float64, starved bool, def int) []fakeStep {
	out := make([]fakeStep, n)
	for i := range out {
		out[i] = fakeStep{used: time.Duration(cores * float64(tick)), starved: starved}
	}
	if n > 0 {
		out[0].def = def
	}
	return out
}

func cat(parts ...[]fakeStep) []fakeStep {
	var out []fakeStep
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// TestRunLowersAndRaises: 1 s of a light load lowers GOMAXPROCS to 1, a
// busy interval or one in which goroutines starved raises it back; each
// change is counted once.
func TestRunLowersAndRaises(t *testing.T) {
	trace, up, down := play(t, 2, cat(steps(10, 0.3, false, 0), steps(1, 0.9, false, 0), steps(1, 0.3, false, 0)))
	if trace[8] != 2 || trace[9] != 1 || trace[10] != 2 || trace[11] != 2 {
		t.Errorf("GOMAXPROCS by step %v: want 2 until step 10, 1 after it, 2 after the busy one", trace)
	}
	if up != 1 || down != 1 {
		t.Errorf("counted %d up, %d down; want 1 and 1", up, down)
	}
	trace, up, down = play(t, 2, cat(steps(10, 0.3, false, 0), steps(1, 0.4, true, 0)))
	if trace[10] != 2 || up != 1 || down != 1 {
		t.Errorf("starved: GOMAXPROCS by step %v, %d up, %d down", trace, up, down)
	}
}

// TestRunFollowsTheRuntimesDefault: while at the default, the runtime may
// change it (a new CPU limit or affinity). The controller takes the new
// value, keeps working when it comes back, and never sets more Ps than
// the default.
func TestRunFollowsTheRuntimesDefault(t *testing.T) {
	// Lowered to 1; the default falls to 1 (a raise then finds 1 the most
	// there is) and comes back to 2, which the runtime applies by itself
	// at the default: it is lowered to 1 again, not left for dead (after
	// twice LowerAfter: the raise came right after the lowering, a bounce).
	trace, up, down := play(t, 2, cat(steps(10, 0.3, false, 0), steps(1, 0.9, false, 1), steps(22, 0.3, false, 2)))
	if trace[9] != 1 || trace[10] != 1 || trace[11] != 2 || trace[len(trace)-1] != 1 {
		t.Errorf("GOMAXPROCS by step %v: want 1 after step 10, 2 when the default came back, 1 again at the end", trace)
	}
	if up != 0 || down != 2 {
		t.Errorf("counted %d up, %d down; want 0 and 2 (the runtime's own changes are not ours)", up, down)
	}
	// The default shrinks from 4 to 2 while at it: a load of 1.5 cores
	// fits in 3 Ps, which is not fewer than 2, so nothing changes; a light
	// one lowers to 1. fakeEnv.set fails the test for a count above the
	// default.
	trace, up, down = play(t, 4, cat(steps(2, 1.5, false, 0), steps(12, 1.5, false, 2), steps(11, 0.3, false, 0)))
	if trace[13] != 2 || trace[len(trace)-1] != 1 || up != 0 || down != 1 {
		t.Errorf("GOMAXPROCS by step %v, %d up, %d down", trace, up, down)
	}
}
