//go:build linux

package sdk_test

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/sdk"
)

// TestSetBatchScheduling runs itself as a child process that sets its
// nice value to 5, calls SetBatchScheduling and then starts more threads:
// every thread of the child, those started later included, is under
// SCHED_BATCH (3), and the nice value is still 5. The child is this test
// binary, so the policy never touches the other tests.
func TestSetBatchScheduling(t *testing.T) {
	if os.Getenv("SDK_SCHED_CHILD") == "1" {
		// A nice value set before stays: SCHED_BATCH takes it into
		// account, and an unprivileged process may not lower it. Nice
		// is per thread on Linux: stay on this one.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, 0, 5); err != nil {
			t.Fatal(err)
		}
		if err := sdk.SetBatchScheduling(); err != nil {
			t.Fatal(err)
		}
		if prio, err := syscall.Getpriority(syscall.PRIO_PROCESS, 0); err != nil || 20-prio != 5 {
			t.Fatalf("nice after SetBatchScheduling = %d (%v); want 5", 20-prio, err)
		}
		// Threads created after the call: goroutines locked to their
		// own threads, alive together.
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				runtime.LockOSThread()
				time.Sleep(200 * time.Millisecond)
			}()
		}
		time.Sleep(50 * time.Millisecond)
		pols := testutil.ThreadPolicies(t, os.Getpid())
		wg.Wait()
		if len(pols) < 5 {
			t.Fatalf("only %d threads", len(pols))
		}
		for i, p := range pols {
			if p != 3 {
				t.Errorf("thread %d of %d has policy %d, want 3 (SCHED_BATCH)", i, len(pols), p)
			}
		}
		return
	}
	// The parent stays under the default policy.
	for _, p := range testutil.ThreadPolicies(t, os.Getpid()) {
		if p != 0 {
			t.Skipf("the test process already runs under policy %d", p)
		}
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSetBatchScheduling$", "-test.v")
	cmd.Env = append(os.Environ(), "SDK_SCHED_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestSetBatchScheduling") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}
