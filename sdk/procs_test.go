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
	ctx, cancel := context.WithCancel(context.Background())
	if err := AdaptGOMAXPROCS(ctx); err != nil {
		t.Fatal(err)
	}
	if !gomaxprocs.Adapting() {
		t.Error("not adapting")
	}
	cancel()
	deadline := time.Now().Add(20 * time.Second)
	for gomaxprocs.Adapting() {
		if time.Now().After(deadline) {
			t.Fatal("still adapting after its context ended")
		}
		time.Sleep(5 * time.Millisecond)
	}

	t.Setenv("GOMAXPROCS", "1")
	if err := AdaptGOMAXPROCS(context.Background()); !errors.Is(err, ErrNotAdapting) {
		t.Errorf("with GOMAXPROCS set: %v, want ErrNotAdapting", err)
	}
}
