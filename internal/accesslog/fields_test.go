package accesslog

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// TestFieldsConfigured: a line carries the configured fields and no
// other (level and message always), whatever their order in the list.
func TestFieldsConfigured(t *testing.T) {
	if numFields != len(config.AccessLogFields) {
		t.Fatalf("%d field bits for %d field names", numFields, len(config.AccessLogFields))
	}
	s := blocked()
	s.Start = time.Date(2026, 5, 9, 7, 30, 0, 0, time.UTC)
	s.Inspected = [2]int64{4096, 0}
	s.Mutated = [2]int64{10, 0}
	s.Protocol = []byte("HTTP/2.0")
	for _, c := range []struct {
		fields []string
		want   []string
	}{
		{[]string{"status", "route"}, []string{"level", "message", "route", "status"}},
		{[]string{"agent_time", "time"}, []string{"agent_request_body_us", "agent_request_headers_us", "level", "message", "time"}},
		{[]string{"start", "request_bytes_inspected", "request_bytes_mutated", "response_bytes_inspected", "response_bytes_mutated"},
			[]string{"level", "message", "request_bytes_inspected", "request_bytes_mutated", "response_bytes_inspected", "response_bytes_mutated", "start"}},
		{[]string{"protocol", "status"}, []string{"level", "message", "protocol", "status"}},
		{nil, []string{"agent", "agent_request_body_us", "agent_request_headers_us", "bytes_in", "bytes_out", "client", "corr",
			"duration_us", "host", "level", "message", "method", "outcome", "path", "protocol", "reason", "req", "route", "status", "time"}},
	} {
		var buf bytes.Buffer
		l, err := New(&buf, Config{Fields: c.fields})
		if err != nil {
			t.Fatal(err)
		}
		l.RecordRequest(s)
		got := lines(t, buf.String())
		if len(got) != 1 {
			t.Fatalf("%v: %d lines", c.fields, len(got))
		}
		var keys []string
		for k := range got[0] {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, c.want) {
			t.Errorf("fields %v: line has %v, want %v", c.fields, keys, c.want)
		}
		if slices.Contains(c.fields, "protocol") && got[0]["protocol"] != "HTTP/2.0" {
			t.Errorf("protocol %v", got[0]["protocol"])
		}
		if slices.Contains(c.fields, "start") && got[0]["start"] != "2026-05-09T07:30:00Z" {
			t.Errorf("start %v", got[0]["start"])
		}
	}
	if _, err := New(&bytes.Buffer{}, Config{Fields: []string{"status", "protocl"}}); !errors.Is(err, ErrAccessLogConfig) || !strings.Contains(err.Error(), `"protocl"`) {
		t.Errorf("unknown field: %v", err)
	}
}

// TestFileReopen: after the file is renamed, Reopen sends later writes
// to a new file at the path; the renamed one keeps what was written
// before.
func TestFileReopen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "access.log")
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	w := NewWriter(f, 0, 0, time.Hour)
	if _, err := w.Write([]byte("one\n")); err != nil {
		t.Fatal(err)
	}
	w.Flush()
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	_, _ = w.Write([]byte("two\n")) // buffered: goes where the next flush goes
	w.Flush()
	if err := f.Reopen(); err != nil {
		t.Fatal(err)
	}
	_, _ = w.Write([]byte("three\n"))
	w.Flush()
	_ = w.Close()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	old, _ := os.ReadFile(path + ".1")
	cur, _ := os.ReadFile(path)
	if string(old) != "one\ntwo\n" || string(cur) != "three\n" {
		t.Errorf("renamed %q, new %q", old, cur)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != fileMode&^currentUmask() {
		t.Errorf("new file mode %v (%v)", fi.Mode(), err)
	}
	// Closed: Reopen and Write fail, nothing is opened.
	if err := f.Reopen(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Reopen after Close: %v", err)
	}
	if _, err := f.Write([]byte("x\n")); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Write after Close: %v", err)
	}
	// A path that cannot be opened again keeps the old file.
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	g, err := OpenFile(filepath.Join(sub, "x.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := os.Rename(sub, sub+".old"); err != nil {
		t.Fatal(err)
	}
	if err := g.Reopen(); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Reopen in a directory gone: %v", err)
	}
	if _, err := g.Write([]byte("kept\n")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(sub+".old", "x.log")); string(b) != "kept\n" {
		t.Errorf("the old file has %q", b)
	}
}
