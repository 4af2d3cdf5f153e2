package accesslog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/observe"
	"github.com/zentinelproxy/sidecar/internal/testutil"
)

func lines(t *testing.T, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

func blocked() *observe.RequestSummary {
	return &observe.RequestSummary{
		ID:          42,
		Correlation: []byte("corr-1"),
		Route:       0,
		RouteName:   "api",
		Method:      []byte("POST"),
		Protocol:    []byte("HTTP/1.1"),
		Host:        []byte("app.example"),
		Path:        []byte("/upload?x=\"1\"\n"),
		ClientIP:    []byte("10.0.0.7"),
		Status:      403,
		Outcome:     observe.RequestBlocked,
		Agent:       1,
		AgentName:   "waf",
		Reason:      "blocked by waf",
		Duration:    512 * time.Microsecond,
		AgentTime:   [observe.NumPhases]time.Duration{85 * time.Microsecond, 240 * time.Microsecond},
		BytesIn:     4096,
		BytesOut:    9,
	}
}

func allowed(status int) *observe.RequestSummary {
	return &observe.RequestSummary{ID: 1, Route: 0, RouteName: "api", Status: status, Outcome: observe.RequestAllowed, Agent: -1}
}

func TestLineFields(t *testing.T) {
	var buf bytes.Buffer
	l, err := New(&buf, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	l.RecordRequest(blocked())
	got := lines(t, buf.String())
	if len(got) != 1 {
		t.Fatalf("%d lines, want 1", len(got))
	}
	want := map[string]any{
		"req": 42.0, "corr": "corr-1", "route": "api", "method": "POST", "host": "app.example",
		"path": "/upload?x=\"1\"\n", "client": "10.0.0.7", "status": 403.0, "outcome": "blocked",
		"agent": "waf", "reason": "blocked by waf", "agent_request_headers_us": 85.0,
		"agent_request_body_us": 240.0, "bytes_in": 4096.0, "bytes_out": 9.0, "duration_us": 512.0,
		"message": "access", "level": "info",
	}
	for k, v := range want {
		if got[0][k] != v {
			t.Errorf("%s = %#v, want %#v", k, got[0][k], v)
		}
	}
	for _, k := range []string{"agent_response_headers_us", "agent_response_body_us", "fail_open", "aborted"} {
		if _, ok := got[0][k]; ok {
			t.Errorf("field %s present for a zero value", k)
		}
	}
	if _, ok := got[0]["time"]; !ok {
		t.Error("no time field")
	}
	if strings.Count(buf.String(), "\n") != 1 {
		t.Error("a newline in the path split the line")
	}
}

func TestNoRouteLine(t *testing.T) {
	var buf bytes.Buffer
	l, _ := New(&buf, DefaultConfig())
	l.RecordRequest(&observe.RequestSummary{Route: -1, Status: 404, Outcome: observe.RequestRejected, Agent: -1, Reason: "no route"})
	got := lines(t, buf.String())[0]
	if _, ok := got["route"]; ok {
		t.Error("route logged for a request without one")
	}
	if got["outcome"] != "rejected" || got["reason"] != "no route" {
		t.Errorf("line %v", got)
	}
}

func TestSampling(t *testing.T) {
	tests := []struct {
		every              int
		allowed, always    int
		wantLines, wantOut int
	}{
		{every: 1, allowed: 50, always: 0, wantLines: 50, wantOut: 0},
		{every: 10, allowed: 100, always: 0, wantLines: 10, wantOut: 90},
		{every: 10, allowed: 100, always: 7, wantLines: 17, wantOut: 90},
		{every: 1000, allowed: 10, always: 3, wantLines: 3, wantOut: 10},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("every%d", tc.every), func(t *testing.T) {
			var buf bytes.Buffer
			l, err := New(&buf, Config{SampleEvery: tc.every})
			if err != nil {
				t.Fatal(err)
			}
			alwaysKinds := []*observe.RequestSummary{
				blocked(),
				{Outcome: observe.RequestRedirected, Status: 302},
				{Outcome: observe.RequestFailedClosed, Status: 503},
				{Outcome: observe.RequestUpstreamError, Status: 502},
				allowed(500), // an upstream 5xx
				{Outcome: observe.RequestAllowed, Status: 200, FailedOpen: 1},
				{Outcome: observe.RequestClientGone},
			}
			for i := range tc.allowed {
				l.RecordRequest(allowed(200 + i%300))
			}
			for i := range tc.always {
				l.RecordRequest(alwaysKinds[i%len(alwaysKinds)])
			}
			got := lines(t, buf.String())
			if len(got) != tc.wantLines {
				t.Errorf("%d lines, want %d", len(got), tc.wantLines)
			}
			st := l.Stats()
			if st.Logged != uint64(tc.wantLines) || st.SampledOut != uint64(tc.wantOut) {
				t.Errorf("stats %+v, want logged %d sampled out %d", st, tc.wantLines, tc.wantOut)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	if _, err := New(io.Discard, Config{SampleEvery: -1}); err == nil {
		t.Error("negative sample_every accepted")
	}
	c := Config{}
	if err := c.Validate(); err != nil || c.SampleEvery != 1 {
		t.Errorf("zero config: %v, every %d", err, c.SampleEvery)
	}
}

func TestRecordDoesNotAllocate(t *testing.T) {
	l, _ := New(io.Discard, DefaultConfig())
	s := blocked()
	if n := testing.AllocsPerRun(200, func() { l.RecordRequest(s) }); n != 0 {
		t.Errorf("%v allocations per line, want 0", n)
	}
	ls, _ := New(io.Discard, Config{SampleEvery: 100})
	a := allowed(200)
	if n := testing.AllocsPerRun(200, func() { ls.RecordRequest(a) }); n != 0 {
		t.Errorf("%v allocations per sampled request, want 0", n)
	}
}

// TestWriterConcurrent: lines from many goroutines come out whole and
// complete after Close.
func TestWriterConcurrent(t *testing.T) {
	var out testutil.LogBuffer
	w := NewWriter(&out, 512, 1<<20, time.Millisecond)
	l, _ := New(w, DefaultConfig())
	const workers, per = 4, 500
	var wg sync.WaitGroup
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				s := blocked()
				s.ID = uint64(g*per + i)
				l.RecordRequest(s)
			}
		}()
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got := lines(t, out.String())
	if len(got) != workers*per {
		t.Fatalf("%d lines, want %d (dropped %d)", len(got), workers*per, w.Dropped())
	}
	seen := make(map[float64]bool, len(got))
	for _, m := range got {
		seen[m["req"].(float64)] = true
	}
	if len(seen) != workers*per {
		t.Errorf("%d distinct requests, want %d", len(seen), workers*per)
	}
	// Closed: further lines are dropped, not written.
	l.RecordRequest(blocked())
	if w.Dropped() != 1 {
		t.Errorf("dropped %d after close, want 1", w.Dropped())
	}
}

// stalledWriter blocks every write until released.
type stalledWriter struct {
	release chan struct{}
	testutil.LogBuffer
}

func (s *stalledWriter) Write(p []byte) (int, error) {
	<-s.release
	return s.LogBuffer.Write(p)
}

// TestWriterStalledOutput: a stalled output drops lines instead of
// blocking the caller, and the lines kept arrive once it resumes.
func TestWriterStalledOutput(t *testing.T) {
	out := &stalledWriter{release: make(chan struct{})}
	w := NewWriter(out, 256, 4096, time.Millisecond)
	line := []byte(strings.Repeat("x", 99) + "\n")
	const total = 1000
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range total {
			if _, err := w.Write(line); err != nil {
				t.Error(err)
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Write blocked on a stalled output")
	}
	if w.Dropped() == 0 {
		t.Error("nothing dropped while the output stalled")
	}
	close(out.release)
	w.Flush()
	_ = w.Close()
	kept := strings.Count(out.String(), "\n")
	if uint64(kept)+w.Dropped() != total {
		t.Errorf("kept %d + dropped %d != %d", kept, w.Dropped(), total)
	}
	if out.String() != strings.Repeat(string(line), kept) {
		t.Error("output holds partial lines")
	}
}

func TestWriterFlush(t *testing.T) {
	var out testutil.LogBuffer
	w := NewWriter(&out, 1<<20, 0, time.Hour)
	defer w.Close()
	_, _ = w.Write([]byte("one\n"))
	if out.String() != "" {
		t.Fatal("written before a flush")
	}
	w.Flush()
	if out.String() != "one\n" {
		t.Fatalf("after Flush: %q", out.String())
	}
}
