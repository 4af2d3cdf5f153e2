package sdk

import (
	"context"
	"errors"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/gomaxprocs"
)

// TestAdaptGOMAXPROCS: it adapts until its context ends, then gives the
// runtime's default back; with GOMAXPROCS in the environment it refuses.
func TestAdaptGOMAXPROCS(t *testing.T) {
	if _, ok := os.LookupEnv("GOMAXPROCS"); ok || runtime.NumCPU() < 2 {
		t.Skip("GOMAXPROCS set in the environment, or one CPU")
	}
	t.Cleanup(runtime.SetDefaultGOMAXPROCS)
	runtime.SetDefaultGOMAXPROCS()
	def := runtime.GOMAXPROCS(0)
	ctx, cancel := context.WithCancel(context.Background())
	done, err := AdaptGOMAXPROCS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !gomaxprocs.Adapting() {
		t.Error("not adapting")
	}
	// An idle test process: lowered within the first seconds (2s of light
	// load), bounded here by what a loaded machine does not reach.
	deadline := time.Now().Add(30 * time.Second)
	for runtime.GOMAXPROCS(0) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("an idle process kept GOMAXPROCS %d", runtime.GOMAXPROCS(0))
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("still adapting after its context ended")
	}
	if got := runtime.GOMAXPROCS(0); got != def || gomaxprocs.Adapting() {
		t.Errorf("after the end: GOMAXPROCS %d (want the default %d), adapting %v", got, def, gomaxprocs.Adapting())
	}

	t.Setenv("GOMAXPROCS", "1")
	if _, err := AdaptGOMAXPROCS(context.Background()); !errors.Is(err, ErrNotAdapting) {
		t.Errorf("with GOMAXPROCS set: %v, want ErrNotAdapting", err)
	}
}
