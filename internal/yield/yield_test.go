package yield

import "testing"

// TestPolicy: a Policy keeps yielding while yields pay, stops once they
// mostly do not, then probes every ProbeEvery calls, and a probe that
// pays starts it again.
func TestPolicy(t *testing.T) {
	// run makes n calls; hit(i) tells whether call i's yield (if it
	// yielded) paid. It returns how many of them yielded.
	run := func(y *Policy, n int, hit func(i int) bool) int {
		yields := 0
		for i := 0; i < n; i++ {
			if y.Before() {
				yields++
				y.After(hit(i))
			}
		}
		return yields
	}
	var y Policy
	if got := run(&y, 100, func(int) bool { return true }); got != 100 {
		t.Fatalf("every yield paying: %d of 100 calls yielded", got)
	}
	// Credit runs out after at most CreditMax yields that do not pay,
	// then one call in ProbeEvery yields.
	if got := run(&y, CreditMax+10*ProbeEvery, func(int) bool { return false }); got != CreditMax+10 {
		t.Fatalf("no yield paying: %d yielded, want %d", got, CreditMax+10)
	}
	if got := run(&y, 1000, func(int) bool { return false }); got < 1000/ProbeEvery-1 || got > 1000/ProbeEvery+1 {
		t.Fatalf("idle: %d of 1000 calls yielded, want about %d", got, 1000/ProbeEvery)
	}
	// A probe that pays brings yielding back at once.
	run(&y, ProbeEvery, func(int) bool { return true })
	if got := run(&y, 50, func(int) bool { return true }); got != 50 {
		t.Fatalf("after a probe paid: %d of 50 calls yielded", got)
	}
	// One yield in four paying keeps it on; one in twenty does not.
	y = Policy{}
	if got := run(&y, 4000, func(i int) bool { return i%4 == 0 }); got < 3800 {
		t.Fatalf("a quarter paying: %d of 4000 calls yielded", got)
	}
	y = Policy{}
	if got := run(&y, 4000, func(i int) bool { return i%20 == 0 }); got > 1000 {
		t.Fatalf("a twentieth paying: %d of 4000 calls yielded", got)
	}
}
