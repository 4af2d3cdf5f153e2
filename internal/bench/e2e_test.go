package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestRowsRun runs every registered row briefly: each sets up, serves
// requests without a single error, and the table names them all.
func TestRowsRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the sidecar under load")
	}
	opts := Options{Duration: 200 * time.Millisecond, Warmup: 50 * time.Millisecond, Concurrency: 8, LatencyDuration: 100 * time.Millisecond}
	results, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != len(Rows()) {
		t.Fatalf("%d results for %d rows", len(results), len(Rows()))
	}
	for _, r := range results {
		if r.Err != nil {
			t.Errorf("%s: %v", r.Row.Name, r.Err)
			continue
		}
		if r.Result.Requests == 0 || r.Result.Errors > 0 || r.Latency.Requests == 0 || r.Latency.Errors > 0 {
			t.Errorf("%s: %d requests, %d errors (first: %v)", r.Row.Name, r.Result.Requests, r.Result.Errors, r.Result.FirstError)
		}
	}
	var buf bytes.Buffer
	WriteTable(&buf, opts, results)
	for _, r := range results {
		if !strings.Contains(buf.String(), r.Row.Name) {
			t.Errorf("table lacks row %q:\n%s", r.Row.Name, buf.String())
		}
	}
	t.Log("\n" + buf.String())
}

// TestLoadCountsFailures checks the load generator against a dead target:
// every request is an error, none is measured.
func TestLoadCountsFailures(t *testing.T) {
	res, err := RunLoad(context.Background(), LoadConfig{
		Addr:        "127.0.0.1:1", // nothing listens on port 1
		Request:     GetRequest("x", "/"),
		Concurrency: 2,
		Requests:    10,
	})
	if err == nil || res.Requests != 0 || res.Errors != 10 {
		t.Fatalf("got %d requests, %d errors, err %v", res.Requests, res.Errors, err)
	}
}

// TestLoadShortDuration: a load whose duration ends before its workers
// first run (a short warmup on a loaded machine) still makes one request
// per worker, instead of measuring none and failing the row.
func TestLoadShortDuration(t *testing.T) {
	up, stop, err := StartUpstream()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	for range 20 {
		res, err := RunLoad(context.Background(), LoadConfig{
			Addr:        up,
			Request:     GetRequest(up, "/"),
			Concurrency: 4,
			Duration:    time.Nanosecond,
		})
		if err != nil || res.Requests < 4 || res.Errors != 0 {
			t.Fatalf("got %d requests, %d errors, err %v; want at least one a worker", res.Requests, res.Errors, err)
		}
	}
}

func TestLoadExactRequests(t *testing.T) {
	up, stop, err := StartUpstream()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	res, err := RunLoad(context.Background(), LoadConfig{
		Addr:        up,
		Request:     PostRequest(up, "/", 4096),
		Concurrency: 4,
		Requests:    101,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 101 || res.Errors != 0 || len(res.Latencies) != 101 {
		t.Fatalf("got %d requests, %d errors", res.Requests, res.Errors)
	}
	if res.Quantile(0.5) > res.Quantile(0.99) {
		t.Fatal("latencies not sorted")
	}
}
