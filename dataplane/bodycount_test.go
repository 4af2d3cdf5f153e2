package dataplane_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// A chunked body over the agent's buffer limit but under max_request_body
// passes whole: the bytes read ahead for the agent count once towards
// the maximum, not again when they are sent on.
func TestOverLimitBodyCountedOnce(t *testing.T) {
	for _, over := range []string{"skip", "prefix", "stream"} {
		t.Run(over, func(t *testing.T) {
			p, u, _ := prefixSetupMax(t, over, "150KiB")
			const size = 100 << 10
			// A reader without a known length: sent chunked.
			body := io.MultiReader(strings.NewReader(strings.Repeat("x", size)))
			resp, msg := p.do(t, http.MethodPost, "/upload", body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d %q, want 200", resp.StatusCode, msg)
			}
			u.mu.Lock()
			n := u.n
			u.mu.Unlock()
			if n != size {
				t.Fatalf("upstream got %d bytes, want %d", n, size)
			}
		})
	}
}
