package testutil

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// LogBuffer is a log sink safe for the goroutines of the code under test.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write implements io.Writer.
func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Lines returns the lines written so far.
func (b *LogBuffer) Lines() []string {
	s := strings.TrimRight(b.String(), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// WaitLog waits (up to LongWait) until the log holds each of want.
func (b *LogBuffer) WaitLog(t testing.TB, want ...string) {
	t.Helper()
	deadline := time.Now().Add(LongWait)
	for {
		s, missing := b.String(), ""
		for _, w := range want {
			if !strings.Contains(s, w) {
				missing = w
				break
			}
		}
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line containing %q; log:\n%s", missing, s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TopLevelKeys returns the keys of a JSON object line in order,
// duplicates included (encoding/json's Unmarshal would hide them).
func TopLevelKeys(line []byte) ([]string, error) {
	dec := json.NewDecoder(bytes.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("not a JSON object (%v, %v)", tok, err)
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		k, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("key is %T", tok)
		}
		keys = append(keys, k)
		// Skip the value, however deeply nested.
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
	}
	return keys, nil
}

// DuplicateKey returns a top-level key that appears twice in a JSON object
// line ("" if none, or if the line is not a JSON object).
func DuplicateKey(line string) string {
	keys, err := TopLevelKeys([]byte(line))
	if err != nil {
		return ""
	}
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		if seen[k] {
			return k
		}
		seen[k] = true
	}
	return ""
}
