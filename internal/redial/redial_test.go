package redial

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func TestLoopRetriesAndServes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var attempts, served atomic.Int64
	var seen []error
	cfg := Config{Min: time.Millisecond, Max: 4 * time.Millisecond, Logger: zerolog.Nop(),
		OnError: func(err error) { seen = append(seen, err) }}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Loop(ctx, cfg, func(context.Context) (func() error, error) {
			n := attempts.Add(1)
			if n <= 3 {
				return nil, fmt.Errorf("dial %d", n)
			}
			return func() error {
				if served.Add(1) == 2 {
					cancel()
				}
				return errors.New("peer closed")
			}, nil
		})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("loop did not stop after cancel")
	}
	if attempts.Load() != 5 || served.Load() != 2 {
		t.Fatalf("attempts=%d served=%d, want 5 and 2", attempts.Load(), served.Load())
	}
	// Three dial failures and one loss reported (the second loss came after cancel).
	if len(seen) != 4 {
		t.Fatalf("errors reported: %v", seen)
	}
}

func TestJitterBounds(t *testing.T) {
	for i := 0; i < 1000; i++ {
		d := Jitter(100 * time.Millisecond)
		if d < 75*time.Millisecond || d > 125*time.Millisecond {
			t.Fatalf("jitter %v outside ±25%%", d)
		}
	}
	if Jitter(0) != 0 {
		t.Fatal("jitter of 0")
	}
}

func TestSleepStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep ignored a canceled context")
	}
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("Sleep cut short")
	}
}
