package dataplane_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
)

const maxBodyOverLimitConfig = `
listeners:
  - name: test
    address: 127.0.0.1:0
    max_request_body: 150KiB
upstreams:
  - name: app
    address: {{.Upstream}}
agents:
  - name: a
    transport: uds
    address: {{.Path}}
    request_body:
      mode: buffered
      limit: 64KiB
      chunk_size: 16KiB
      over_limit: {{.Over}}
routes:
  - name: main
    upstream: app
    agents: [a]
`

// A chunked body over the agent's buffer limit but under max_request_body
// passes whole: the bytes read ahead for the agent count once towards
// the maximum, not again when they are sent on.
func TestOverLimitBodyCountedOnce(t *testing.T) {
	for _, over := range []string{"skip", "prefix", "stream"} {
		t.Run(over, func(t *testing.T) {
			u, addr := newCountingUpstream(t)
			ba := &bodyAgent{}
			path := serveAgent(t, ba.handler())
			cfg := configText(t, maxBodyOverLimitConfig, map[string]any{"Upstream": addr, "Path": path, "Over": over})
			p := startProxy(t, cfg, map[string]agentmux.Agent{"a": udsAgent(t, "a", path, nil)}, nil)
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
