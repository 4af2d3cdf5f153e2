package exchange

import (
	"io"
	"strings"
	"testing"
	"time"
)

// heldSource is a Source that holds the first held bytes of its body in
// a buffer, and counts the read deadline moves.
type heldSource struct {
	r       io.Reader
	held    int64
	extends int
}

func (s *heldSource) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	s.held = max(s.held-int64(n), 0)
	return n, err
}
func (s *heldSource) Pending() bool               { return s.held > 0 }
func (s *heldSource) Buffered(rest int64) bool    { return rest >= 0 && s.held >= rest }
func (s *heldSource) ExtendRead()                 { s.extends++ }
func (s *heldSource) SetReadDeadline(_ time.Time) { s.extends++ }
func (s *heldSource) Truncated() bool             { return false }

// TestBufferedBodyLeavesTheDeadline is the reader's half of the rule
// (the upstream's Source is the other, in its package): reading the rest
// of a body that its source already holds does not move the read
// deadline; a body whose rest is still to come pushes it before reading.
func TestBufferedBodyLeavesTheDeadline(t *testing.T) {
	read := func(t *testing.T, body string, want, held int64) (moved bool) {
		t.Helper()
		src := &heldSource{r: io.LimitReader(strings.NewReader(body), want), held: held}
		s := bodyReader{src: src, want: want}
		p := make([]byte, want)
		if n, _, err := s.read(p, true); err != nil || int64(n) != want || string(p) != body[:want] {
			t.Fatalf("read %d bytes %q, %v", n, p[:n], err)
		}
		return src.extends > 0
	}
	if read(t, "hello", 5, 5) {
		t.Error("a body already buffered moved the read deadline")
	}
	if !read(t, "hello, world", 12, 5) {
		t.Error("a body still on the wire did not push the read deadline")
	}
}
