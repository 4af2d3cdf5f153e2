package gomaxprocs

import (
	"context"
	"errors"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// needAdaptable skips where Start cannot adapt: one CPU, or GOMAXPROCS
// chosen in the environment.
func needAdaptable(t *testing.T) int {
	t.Helper()
	if v, ok := os.LookupEnv("GOMAXPROCS"); ok {
		t.Skipf("GOMAXPROCS=%s is set in the environment", v)
	}
	t.Cleanup(runtime.SetDefaultGOMAXPROCS)
	runtime.SetDefaultGOMAXPROCS()
	def := runtime.GOMAXPROCS(0)
	if def < 2 {
		t.Skip("the runtime's default GOMAXPROCS is 1 here")
	}
	return def
}

// waitProcs waits, within a bound that a loaded machine does not reach,
// until GOMAXPROCS is want; what it waits for is the controller's own
// reading of this process's CPU time, not a wall-clock promise.
func waitProcs(t *testing.T, want int, what string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for runtime.GOMAXPROCS(0) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: GOMAXPROCS is %d, want %d", what, runtime.GOMAXPROCS(0), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStartFollowsTheLoad: an idle process goes down to 1 P, a busy one
// goes back up to the runtime's default, and the end gives the default
// back; each change is counted.
func TestStartFollowsTheLoad(t *testing.T) {
	def := needAdaptable(t)
	up0, down0 := Changes()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done, err := Start(ctx, Config{Interval: 20 * time.Millisecond, LowerAfter: 100 * time.Millisecond}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if !Adapting() {
		t.Error("Adapting is false while adapting")
	}
	waitProcs(t, 1, "idle")

	// Work that keeps more than one core's worth busy if it could.
	var stop atomic.Bool
	spun := make(chan struct{})
	for range def {
		go func() {
			defer func() { spun <- struct{}{} }()
			x := 0
			for !stop.Load() {
				x++
			}
			_ = x
		}()
	}
	waitProcs(t, def, "busy")
	stop.Store(true)
	for range def {
		<-spun
	}
	waitProcs(t, 1, "idle again")

	cancel()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Start's goroutine did not end with its context")
	}
	if got := runtime.GOMAXPROCS(0); got != def {
		t.Errorf("after the end: GOMAXPROCS %d, want the default %d", got, def)
	}
	if Adapting() {
		t.Error("Adapting is true after the end")
	}
	up, down := Changes()
	if up-up0 < 1 || down-down0 < 2 {
		t.Errorf("changes counted: %d up, %d down; want at least 1 and 2", up-up0, down-down0)
	}
}

// TestStartRefuses: an operator's GOMAXPROCS, a second Start and a bad
// config each leave GOMAXPROCS as it is, with an error that says so.
func TestStartRefuses(t *testing.T) {
	def := needAdaptable(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	if _, err := Start(ctx, Config{}, zerolog.Nop()); !errors.Is(err, ErrConfig) {
		t.Errorf("zero config: %v, want ErrConfig", err)
	}

	done, err := Start(ctx, DefaultConfig(), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Start(ctx, DefaultConfig(), zerolog.Nop()); !errors.Is(err, ErrNotAdapting) {
		t.Errorf("second Start: %v, want ErrNotAdapting", err)
	}
	cancel()
	<-done

	t.Setenv("GOMAXPROCS", "1")
	runtime.GOMAXPROCS(def) // as a program that set it in code
	if _, err := Start(context.Background(), DefaultConfig(), zerolog.Nop()); !errors.Is(err, ErrNotAdapting) {
		t.Errorf("with GOMAXPROCS set: %v, want ErrNotAdapting", err)
	}
	if Adapting() || runtime.GOMAXPROCS(0) != def {
		t.Errorf("refused, yet adapting %v, GOMAXPROCS %d", Adapting(), runtime.GOMAXPROCS(0))
	}
}

// TestProcessStarved: the runtime's scheduling latencies, read as the
// controller reads them, show goroutines queued behind each other on one
// P, and show nothing while the process idles.
func TestProcessStarved(t *testing.T) {
	t.Cleanup(runtime.SetDefaultGOMAXPROCS)
	runtime.GOMAXPROCS(1)
	pr := newProcess()
	pr.starved()
	time.Sleep(50 * time.Millisecond)
	if pr.starved() {
		t.Error("an idle process starved")
	}
	// 8 goroutines share one P, each running for 0.5ms and then yielding:
	// each waits about 3.5ms for the others, hundreds of times (the
	// runtime records one wait in eight).
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				for t0 := time.Now(); time.Since(t0) < 500*time.Microsecond; {
				}
				runtime.Gosched()
			}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	if !pr.starved() {
		t.Error("8 busy goroutines on one P did not starve")
	}
}
