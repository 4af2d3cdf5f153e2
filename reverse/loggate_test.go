package reverse

import (
	"testing"
	"time"
)

func TestLogGate(t *testing.T) {
	var g logGate
	now := time.Unix(1000, 0)
	for i := 0; i < logBurst; i++ {
		if ok, _ := g.allow(now); !ok {
			t.Fatalf("line %d gated", i)
		}
	}
	for i := 0; i < 5; i++ {
		if ok, _ := g.allow(now); ok {
			t.Fatal("burst exceeded")
		}
	}
	ok, suppressed := g.allow(now.Add(time.Second))
	if !ok || suppressed != 5 {
		t.Errorf("next second: %v, %d suppressed", ok, suppressed)
	}
}
