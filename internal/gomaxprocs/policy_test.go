package gomaxprocs

import (
	"math"
	"slices"
	"testing"
	"time"
)

const tick = 100 * time.Millisecond

// cores is the CPU time of u cores over a tick.
func cores(u float64) time.Duration { return time.Duration(u * float64(tick)) }

// load feeds p n intervals of tick in which the process used u cores and
// returns the counts Next returned.
func load(p *Policy, u float64, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = p.Next(cores(u), tick, false)
	}
	return out
}

// lowerAt feeds p intervals of 0.3 cores until it lowers to 1 P and
// returns how many it took.
func lowerAt(t *testing.T, p *Policy) int {
	t.Helper()
	for i := 1; i <= 1000; i++ {
		if p.Next(cores(0.3), tick, false) == 1 {
			return i
		}
	}
	t.Fatal("never lowered")
	return 0
}

func newPolicy(max int) *Policy {
	return &Policy{Max: max, Procs: max, LowerAfter: time.Second}
}

func TestPolicyLowersOnlyAfterASteadySpell(t *testing.T) {
	p := newPolicy(2)
	got := load(p, 0.3, 10)
	for i, n := range got[:9] {
		if n != 2 {
			t.Fatalf("interval %d: %d Ps, want 2 until LowerAfter has passed: %v", i, n, got)
		}
	}
	if got[9] != 1 {
		t.Fatalf("after LowerAfter of 0.3 cores: %d Ps, want 1: %v", got[9], got)
	}
	// A busier interval in the middle of a spell starts it again.
	p = newPolicy(2)
	load(p, 0.3, 9)
	if n := p.Next(cores(0.9), tick, false); n != 2 {
		t.Fatalf("a load that needs 2 Ps: %d", n)
	}
	if got := load(p, 0.3, 9); got[8] != 2 {
		t.Fatalf("the spell restarted, yet it lowered after 9 intervals: %v", got)
	}
}

func TestPolicyRaisesAtOnce(t *testing.T) {
	p := newPolicy(2)
	load(p, 0.2, 10)
	if p.Procs != 1 {
		t.Fatalf("not lowered: %d", p.Procs)
	}
	// 0.75 of one P is still below the threshold; 0.8 is above it.
	if n := p.Next(750*time.Millisecond, time.Second, false); n != 1 {
		t.Fatalf("0.75 cores on 1 P raised to %d", n)
	}
	if n := p.Next(cores(0.8), tick, false); n != 2 {
		t.Fatalf("0.8 cores on 1 P: %d Ps, want 2", n)
	}
}

func TestPolicyManyCPUs(t *testing.T) {
	p := newPolicy(16)
	// 1.5 cores fit in 3 Ps at LowerTo (0.6) each.
	load(p, 1.5, 10)
	if p.Procs != 3 {
		t.Fatalf("1.5 cores on 16 Ps lowered to %d, want 3", p.Procs)
	}
	// The count lowered to is the highest wanted during the spell.
	p = newPolicy(16)
	load(p, 0.2, 5)
	load(p, 2.9, 1)
	load(p, 0.2, 4)
	if p.Procs != 5 {
		t.Fatalf("a spell that peaked at 2.9 cores lowered to %d, want 5", p.Procs)
	}
	// Saturated on 3 Ps: at least double, up to Max; past double when
	// 1 P used 2.5 cores (threads outside the Ps, in system calls), which
	// needs ceil(2.5/0.6) = 5 at LowerTo.
	for _, c := range []struct {
		procs   int
		used    float64
		want    int
		because string
	}{
		{3, 3, 6, "3 busy Ps: double"},
		{6, 6, 12, "6 busy Ps: double"},
		{12, 12, 16, "12 busy Ps: Max"},
		{1, 2.5, 5, "2.5 cores on 1 P"},
		{5, 16, 16, "5 Ps that used 16 cores: Max"},
	} {
		p = &Policy{Max: 16, Procs: c.procs, LowerAfter: time.Second}
		if n := p.Next(cores(c.used), tick, false); n != c.want {
			t.Fatalf("%s: %d Ps, want %d", c.because, n, c.want)
		}
	}
}

func TestPolicyBacksOffAfterBounces(t *testing.T) {
	p := newPolicy(2)
	if n := lowerAt(t, p); n != 10 {
		t.Fatalf("first lowering after %d intervals, want 10", n)
	}
	// Bounces: raised in the interval after each lowering.
	for i, want := range []int{20, 40, 80, 160, 320, 640, 640} {
		if p.Next(tick, tick, false) != 2 {
			t.Fatal("a busy interval did not raise")
		}
		if n := lowerAt(t, p); n != want {
			t.Fatalf("after bounce %d: lowered after %d intervals, want %d", i+1, n, want)
		}
	}
	// A lowering that holds for the whole wait resets it.
	// (The wait is at its most now: 64 times LowerAfter.)
	load(p, 0.3, 640)
	if p.Next(tick, tick, false) != 2 {
		t.Fatal("a busy interval did not raise")
	}
	if n := lowerAt(t, p); n != 10 {
		t.Fatalf("after a lowering that held: lowered after %d intervals, want 10", n)
	}
}

func TestPolicyOneCPU(t *testing.T) {
	p := newPolicy(1)
	for _, u := range []float64{0, 0.5, 1, 3} {
		if got := load(p, u, 20); got[19] != 1 {
			t.Fatalf("Max 1, %.1f cores: %v", u, got)
		}
	}
	if n := p.Next(time.Second, 0, false); n != 1 {
		t.Fatalf("no elapsed time: %d", n)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []Config{
		{Interval: time.Millisecond, LowerAfter: time.Second},
		{Interval: time.Minute, LowerAfter: time.Hour},
		{Interval: time.Second, LowerAfter: time.Millisecond},
		{Interval: time.Second, LowerAfter: time.Hour},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: accepted", c)
		}
	}
}

// TestPolicyBounceInSteps: on 8 Ps a bounce that takes two raises to get
// back (1 → 2 → 4) is one bounce: the back-off doubles once, and the
// second raise does not reset it.
func TestPolicyBounceInSteps(t *testing.T) {
	p := newPolicy(8)
	spells := []int{}
	for range 4 {
		n := lowerAt(t, p)
		spells = append(spells, n)
		if got := p.Next(tick, tick, false); got != 2 {
			t.Fatalf("1 busy P raised to %d, want 2", got)
		}
		if got := p.Next(2*tick, tick, false); got != 4 {
			t.Fatalf("2 busy Ps raised to %d, want 4", got)
		}
	}
	// Each lowering from 4 Ps goes straight to 1 (0.3 cores): the first
	// after 10 intervals, then 20, 40, 80.
	if want := []int{10, 20, 40, 80}; !slices.Equal(spells, want) {
		t.Fatalf("lowered after %v intervals, want %v", spells, want)
	}
}

// TestPolicyStarved: goroutines that waited for a P raise the count
// whatever the CPU time says, and an interval with such waits does not
// count towards lowering.
func TestPolicyStarved(t *testing.T) {
	p := newPolicy(4)
	load(p, 0.3, 10)
	if p.Procs != 1 {
		t.Fatalf("not lowered: %d", p.Procs)
	}
	if n := p.Next(cores(0.4), tick, true); n != 2 {
		t.Fatalf("starved on 1 P with 0.4 cores: %d Ps, want 2", n)
	}
	p = newPolicy(2)
	load(p, 0.3, 9)
	if n := p.Next(cores(0.3), tick, true); n != 2 {
		t.Fatalf("starved at 2 Ps: %d", n)
	}
	if got := load(p, 0.3, 9); got[8] != 2 {
		t.Fatalf("the starved interval did not restart the spell: %v", got)
	}
	if got := load(p, 0.3, 1); got[0] != 1 {
		t.Fatalf("10 quiet intervals did not lower: %v", got)
	}
}

func TestPolicyWaitSaturates(t *testing.T) {
	p := &Policy{Max: 2, Procs: 2, LowerAfter: time.Duration(math.MaxInt64 / 4), backoff: MaxBackoff}
	if w := p.Wait(); w != math.MaxInt64 {
		t.Fatalf("Wait = %v, want the largest duration", w)
	}
}
