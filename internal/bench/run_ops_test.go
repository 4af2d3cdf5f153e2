package bench

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestRoundOrder(t *testing.T) {
	for _, tc := range []struct {
		n, round int
		want     string
	}{
		{4, 0, "[0 1 2 3]"}, {4, 1, "[3 2 1 0]"}, {4, 2, "[0 1 2 3]"}, {1, 1, "[0]"}, {0, 1, "[]"},
	} {
		if got := fmt.Sprint(roundOrder(tc.n, tc.round)); got != tc.want {
			t.Errorf("roundOrder(%d, %d) = %s, want %s", tc.n, tc.round, got, tc.want)
		}
	}
}

// TestWriteVersus: a row naming a Versus row gets a note with the
// throughput ratio and the CPU per request it adds.
func TestWriteVersus(t *testing.T) {
	res := func(name, versus string, rps int, cpu time.Duration) RowResult {
		return RowResult{Row: Row{Name: name, Versus: versus}, Result: Result{Requests: rps, Elapsed: time.Second, CPU: time.Duration(rps) * cpu}}
	}
	var buf bytes.Buffer
	writeVersus(&buf, []RowResult{
		res("off", "", 1000, 50*time.Microsecond),
		res("on", "off", 980, 51*time.Microsecond),
		res("orphan", "missing", 10, time.Microsecond),
	})
	out := buf.String()
	if !strings.Contains(out, "on vs off: 98.0% throughput, +1.0µs CPU/req") {
		t.Errorf("note %q", out)
	}
	if strings.Contains(out, "orphan") {
		t.Errorf("note for a row whose Versus was not measured: %q", out)
	}
}
