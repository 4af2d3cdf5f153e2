package gomaxprocs

import (
	"testing"
	"time"
)

const tick = 100 * time.Millisecond

// load feeds p n intervals of tick in which the process used u cores and
// returns the counts Next returned.
func load(p *Policy, u float64, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = p.Next(time.Duration(u*float64(tick)), tick)
	}
	return out
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
	if n := p.Next(time.Duration(0.9*float64(tick)), tick); n != 2 {
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
	if n := p.Next(time.Duration(0.75*float64(tick)), tick); n != 1 {
		t.Fatalf("0.75 cores on 1 P raised to %d", n)
	}
	if n := p.Next(time.Duration(0.8*float64(tick)), tick); n != 2 {
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
	// Saturated on 3 Ps: at least double, and enough for the load at
	// LowerTo.
	p = &Policy{Max: 16, Procs: 3, LowerAfter: time.Second}
	if n := p.Next(3*tick, tick); n != 6 {
		t.Fatalf("3 busy Ps raised to %d, want 6", n)
	}
	if n := p.Next(6*tick, tick); n != 12 {
		t.Fatalf("6 busy Ps raised to %d, want 12", n)
	}
	if n := p.Next(12*tick, tick); n != 16 {
		t.Fatalf("12 busy Ps raised to %d, want Max 16", n)
	}
	// Past double: 1 P that used 2.5 cores (threads outside the Ps, in
	// system calls) needs ceil(2.5/0.6) = 5.
	p = &Policy{Max: 16, Procs: 1, LowerAfter: time.Second}
	if n := p.Next(25*tick/10, tick); n != 5 {
		t.Fatalf("2.5 cores on 1 P raised to %d, want 5", n)
	}
	if n := p.Next(16*tick, tick); n != 16 {
		t.Fatalf("at Max: %d", n)
	}
}

func TestPolicyBacksOffAfterBounces(t *testing.T) {
	p := newPolicy(2)
	lowerAt := func() int { // intervals of 0.3 cores until it lowers
		for i := 1; i <= 1000; i++ {
			if p.Next(time.Duration(0.3*float64(tick)), tick) == 1 {
				return i
			}
		}
		t.Fatal("never lowered")
		return 0
	}
	if n := lowerAt(); n != 10 {
		t.Fatalf("first lowering after %d intervals, want 10", n)
	}
	// Bounces: raised in the interval after each lowering.
	for i, want := range []int{20, 40, 80, 160, 320, 640, 640} {
		if p.Next(tick, tick) != 2 {
			t.Fatal("a busy interval did not raise")
		}
		if n := lowerAt(); n != want {
			t.Fatalf("after bounce %d: lowered after %d intervals, want %d", i+1, n, want)
		}
	}
	// A lowering that holds for the whole wait resets it.
	load(p, 0.3, 640)
	if p.Next(tick, tick) != 2 {
		t.Fatal("a busy interval did not raise")
	}
	if n := lowerAt(); n != 10 {
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
	if n := p.Next(time.Second, 0); n != 1 {
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
