package main

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

const h2loadReport = `starting benchmark...
spawning thread #0: 64 total client(s). Timing-based test with 0s of warm-up time and 4s of main duration for measurements.
Warm-up phase is over for thread #0.
Main benchmark duration is started for thread #0.
Application protocol: h2c
Main benchmark duration is over for thread #0. Stopping all clients.
Stopped all clients for thread #0

finished in 4.02s, 9082.25 req/s, 382.48KB/s
requests: 36329 total, 36969 started, 36329 done, 36320 succeeded, 9 failed, 2 errored, 1 timeout
status codes: 36320 2xx, 0 3xx, 7 4xx, 0 5xx
traffic: 1.50MB (1573696) total, 145.72KB (149216) headers (space savings 93.41%), 638.69KB (654022) data
                     min         max         mean         sd        +/- sd
time for request:     1.37ms     42.27ms     14.52ms      5.08ms    73.94%
time for connect:       87us      3.00ms      1.79ms      1.05ms    57.81%
time to 1st byte:     4.12ms     51.22ms     21.30ms     10.11ms    70.31%
req/s           :     140.12      145.33      141.91        1.22    68.75%
`

func TestParseH2load(t *testing.T) {
	o, err := parseH2load(strings.NewReader(h2loadReport))
	if err != nil {
		t.Fatal(err)
	}
	if o.requests != 36329 || o.elapsed != 4020*time.Millisecond {
		t.Errorf("requests %d in %v, want 36329 in 4.02s", o.requests, o.elapsed)
	}
	if o.failures != 9 {
		t.Errorf("failures %d, want 9 (h2load's failed, which counts errored and timed out)", o.failures)
	}
	for _, bad := range []string{
		"",
		"finished in 4.02s, 0.00 req/s, 0B/s\n", // no requests line
		"requests: 1 total, 1 started, 1 done, 1 succeeded, 0 failed\n", // no window
		"finished in 4.02q, 1 req/s\nrequests: 1 total, 1 done\n",
	} {
		if _, err := parseH2load(strings.NewReader(bad)); err == nil {
			t.Errorf("no error for %q", bad)
		}
	}
}

func TestH2loadPercentiles(t *testing.T) {
	// 100 requests taking 1..100 ms, in an order that is not sorted.
	var b strings.Builder
	for i := range 100 {
		ms := (i*37)%100 + 1
		b.WriteString("1764331200000000\t200\t" + strconv.Itoa(ms*1000) + "\n")
	}
	p50, p99, err := h2loadPercentiles(strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if p50 != 51*time.Millisecond || p99 != 100*time.Millisecond {
		t.Errorf("p50 %v p99 %v, want 51ms 100ms", p50, p99)
	}
	if _, _, err := h2loadPercentiles(strings.NewReader("")); err == nil {
		t.Error("no error for an empty log")
	}
	if _, _, err := h2loadPercentiles(strings.NewReader("1\t200\tx\n")); err == nil {
		t.Error("no error for a log line without a duration")
	}
}
