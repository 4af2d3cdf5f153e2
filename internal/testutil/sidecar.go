package testutil

import (
	"bufio"
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// Sidecar is a running sidecar process started by StartSidecar.
type Sidecar struct {
	Cmd *exec.Cmd
	// Addr and Admin are the host:port of the first listener and of the
	// admin listener ("" without one), from the "sidecar serving" line.
	Addr, Admin string
	// Exited receives cmd.Wait's result once the process has ended.
	Exited chan error

	mu    sync.Mutex
	lines []string
}

// StartSidecar starts cmd (a `sidecar run …` command line, not started
// yet; its stderr is the JSON log), keeps every log line and waits, at
// most LongWait, for the "sidecar serving" line that names its listeners.
// The process is killed when the test ends; if the test failed, the last
// log lines are shown.
func StartSidecar(t testing.TB, cmd *exec.Cmd) *Sidecar {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &Sidecar{Cmd: cmd, Exited: make(chan error, 1)}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	serving := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 8<<20)
		for sc.Scan() {
			line := sc.Text()
			s.mu.Lock()
			s.lines = append(s.lines, line)
			s.mu.Unlock()
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["message"] == "sidecar serving" {
				select {
				case serving <- m:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		s.Exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("sidecar log (last 60 lines):\n%s", s.Tail(60))
		}
	})
	select {
	case m := <-serving:
		ls, _ := m["listeners"].([]any)
		if len(ls) == 0 {
			t.Fatalf("serving line without listeners: %v", m)
		}
		s.Addr, _ = ls[0].(string)
		s.Admin, _ = m["admin"].(string)
	case err := <-s.Exited:
		t.Fatalf("sidecar exited at start: %v\n%s", err, s.Tail(40))
	case <-time.After(LongWait):
		t.Fatalf("sidecar did not start\n%s", s.Tail(40))
	}
	return s
}

// Lines is every log line so far.
func (s *Sidecar) Lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.lines...)
}

// Tail is the last n log lines, one per line.
func (s *Sidecar) Tail(n int) string {
	l := s.Lines()
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
