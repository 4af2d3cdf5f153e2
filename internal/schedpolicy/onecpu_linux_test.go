package schedpolicy_test

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/zentinelproxy/sidecar/internal/schedpolicy"
)

// TestOneCPU: a thread pinned to one CPU is confined to it; with its
// affinity back, OneCPU says what that affinity allows.
func TestOneCPU(t *testing.T) {
	runtime.LockOSThread() // the affinity set here is this thread's
	defer runtime.UnlockOSThread()
	var orig unix.CPUSet
	if err := unix.SchedGetaffinity(0, &orig); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := unix.SchedSetaffinity(0, &orig); err != nil {
			t.Fatal(err)
		}
	}()
	cpu := -1
	for i := range 1024 {
		if orig.IsSet(i) {
			cpu = i
			break
		}
	}
	var one unix.CPUSet
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatal(err)
	}
	if !schedpolicy.OneCPU() {
		t.Fatalf("pinned to CPU %d: OneCPU() = false", cpu)
	}
	if err := unix.SchedSetaffinity(0, &orig); err != nil {
		t.Fatal(err)
	}
	if got, want := schedpolicy.OneCPU(), orig.Count() == 1; got != want {
		t.Fatalf("with %d CPUs allowed: OneCPU() = %v", orig.Count(), got)
	}
}
