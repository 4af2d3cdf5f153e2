package schedpolicy_test

import (
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/zentinelproxy/sidecar/internal/schedpolicy"
)

// TestOneCPU: a thread pinned to one CPU is confined to it; with its
// affinity back, it is as confined as its affinity says; the process is
// as confined as its main thread.
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
	if !schedpolicy.OneCPUOf(0) {
		t.Fatalf("pinned to CPU %d: OneCPUOf(this thread) = false", cpu)
	}
	if err := unix.SchedSetaffinity(0, &orig); err != nil {
		t.Fatal(err)
	}
	if got, want := schedpolicy.OneCPUOf(0), orig.Count() == 1; got != want {
		t.Fatalf("with %d CPUs allowed: OneCPUOf(this thread) = %v", orig.Count(), got)
	}
	var main unix.CPUSet
	if err := unix.SchedGetaffinity(os.Getpid(), &main); err != nil {
		t.Fatal(err)
	}
	if got, want := schedpolicy.OneCPU(), main.Count() == 1; got != want {
		t.Fatalf("main thread allowed %d CPUs: OneCPU() = %v", main.Count(), got)
	}
}
