package dataplane_test

import (
	"bytes"
	"context"
	"hash/crc32"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/zentinelproxy/sidecar/dataplane"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

const prefixConfig = `
listeners:
  - name: test
    address: 127.0.0.1:0
{{- with .MaxBody}}
    max_request_body: {{.}}
{{- end}}
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

// bodyAgent records what it sees of request bodies: bytes, chunks, the
// last chunk's is_last, and blocks a body whose data contains "EVIL".
type bodyAgent struct {
	mu      sync.Mutex
	seen    int64
	chunks  int
	sawLast bool
	total   int64
}

func (b *bodyAgent) handler() sdk.Handler {
	return &agentFuncs{
		Base: sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true, SupportsCancellation: true}},
		reqBody: func(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
			b.mu.Lock()
			b.seen += int64(len(m.Data))
			b.chunks++
			b.sawLast = b.sawLast || m.IsLast
			b.total = m.TotalSize
			b.mu.Unlock()
			if bytes.Contains(m.Data, []byte("EVIL")) {
				r.UseMutation = false
				r.Decision.Kind, r.Decision.Status, r.Decision.Body = protocol.DecisionBlock, 403, []byte("blocked")
				return nil
			}
			if !m.IsLast {
				r.NeedMore()
			}
			return nil
		},
	}
}

func (b *bodyAgent) stats() (int64, int, bool, int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.seen, b.chunks, b.sawLast, b.total
}

type countingUpstream struct {
	mu      sync.Mutex
	n       int64
	crc     uint32
	marker  string
	te      []string
	hits    atomic.Int64
	handler http.HandlerFunc
}

func newCountingUpstream(t *testing.T) (*countingUpstream, string) {
	u := &countingUpstream{}
	addr := newUpstreamRaw(t, func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		h := crc32.NewIEEE()
		n, _ := io.Copy(h, r.Body)
		u.mu.Lock()
		u.n, u.crc, u.marker, u.te = n, h.Sum32(), r.Header.Get("X-Sidecar-Inspection"), r.TransferEncoding
		u.mu.Unlock()
	})
	return u, addr
}

func prefixSetup(t *testing.T, over string) (*proxy, *countingUpstream, *bodyAgent) {
	t.Helper()
	return prefixSetupMax(t, over, "")
}

// prefixSetupMax is prefixSetup with the listener's max_request_body
// (none when empty).
func prefixSetupMax(t *testing.T, over, maxBody string) (*proxy, *countingUpstream, *bodyAgent) {
	t.Helper()
	u, addr := newCountingUpstream(t)
	ba := &bodyAgent{}
	path := serveAgent(t, ba.handler())
	cfg := configText(t, prefixConfig, map[string]any{"Upstream": addr, "Path": path, "Over": over, "MaxBody": maxBody})
	return startProxy(t, cfg, map[string]agentmux.Agent{"a": udsAgent(t, "a", path, nil)}, nil), u, ba
}

func agentBodyCounts(t *testing.T, p *proxy) dataplane.BodyStatus {
	t.Helper()
	return onlyAgent(t, p.srv.PolicyStatus().Bodies, func(s dataplane.BodyStatus) string { return s.Agent }, "a")
}

// over_limit prefix: the agent decides on the first 64 KiB (its last
// chunk says is_last), the rest of a large body streams to the upstream
// unchanged, marked partial, in memory bounded by the limit.
func TestPrefixInspectionLargeBody(t *testing.T) {
	p, up, ba := prefixSetup(t, "prefix")
	size := bigBodySize() / 4
	want := crc32.NewIEEE()
	if _, err := io.Copy(want, io.LimitReader(&pattern{}, size)); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	resetPeakRSS()
	before := peakRSS(t)
	req, err := http.NewRequest("POST", p.url("/upload"), io.LimitReader(&pattern{}, size))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = size
	resp, err := p.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	peak := peakRSS(t)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	up.mu.Lock()
	n, crc, marker := up.n, up.crc, up.marker
	up.mu.Unlock()
	if n != size || crc != want.Sum32() || marker != "partial" {
		t.Fatalf("upstream got %d bytes (want %d), crc ok %v, marker %q", n, size, crc == want.Sum32(), marker)
	}
	seen, chunks, last, total := ba.stats()
	if seen != 64<<10 || chunks != 4 || !last || total != size {
		t.Fatalf("agent saw %d bytes in %d chunks, is_last %v, total %d; want 64KiB in 4, is_last, %d", seen, chunks, last, total, size)
	}
	if st := agentBodyCounts(t, p); st.Prefix != 1 || st.Stream != 0 {
		t.Fatalf("counters %+v", st)
	}
	t.Logf("%d MiB through a 64 KiB prefix inspection; peak RSS %.1f MiB (%.1f before)", size>>20, float64(peak)/(1<<20), float64(before)/(1<<20))
	if !raceEnabled && peak-before >= 32<<20 {
		t.Fatalf("peak RSS grew by %.1f MiB for a %d MiB body", float64(peak-before)/(1<<20), size>>20)
	}
}

// The prefix decides: a block on it answers without the upstream; what
// is past the prefix is never seen, so it cannot block.
func TestPrefixInspectionBlocks(t *testing.T) {
	p, up, _ := prefixSetup(t, "prefix")
	body := "EVIL" + strings.Repeat("x", 200<<10)
	if resp, got := p.do(t, "POST", "/", strings.NewReader(body)); resp.StatusCode != 403 || got != "blocked" {
		t.Fatalf("evil prefix: %d %q", resp.StatusCode, got)
	}
	if up.hits.Load() != 0 {
		t.Fatalf("upstream contacted %d times", up.hits.Load())
	}
	body = strings.Repeat("x", 100<<10) + "EVIL"
	if resp, _ := p.do(t, "POST", "/", strings.NewReader(body)); resp.StatusCode != 200 {
		t.Fatalf("evil past the prefix: %d, want 200 (not inspected)", resp.StatusCode)
	}
	// A chunked body of unknown length takes the same path.
	pr, pw := io.Pipe()
	go func() {
		pw.Write([]byte(strings.Repeat("y", 90<<10)))
		pw.Write([]byte("tail"))
		pw.Close()
	}()
	req, _ := http.NewRequest("POST", p.url("/"), pr)
	resp, err := p.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	up.mu.Lock()
	n, marker := up.n, up.marker
	up.mu.Unlock()
	if resp.StatusCode != 200 || n != 90<<10+4 || marker != "partial" {
		t.Fatalf("chunked: %d, upstream got %d, marker %q", resp.StatusCode, n, marker)
	}
	// A body within the limit is inspected whole, unmarked.
	if resp, _ := p.do(t, "POST", "/", strings.NewReader("small EVIL")); resp.StatusCode != 403 {
		t.Fatalf("small body: %d", resp.StatusCode)
	}
	if st := agentBodyCounts(t, p); st.Prefix != 3 {
		t.Fatalf("prefix count %+v, want 3", st)
	}
}

// over_limit stream: past the limit the agent gets every chunk, so a
// block late in the body still stops it.
func TestOverLimitStream(t *testing.T) {
	p, up, ba := prefixSetup(t, "stream")
	body := strings.Repeat("x", 200<<10)
	resp, _ := p.do(t, "POST", "/", strings.NewReader(body))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	seen, _, last, _ := ba.stats()
	up.mu.Lock()
	n, marker := up.n, up.marker
	up.mu.Unlock()
	if seen != int64(len(body)) || !last || n != int64(len(body)) || marker != "" {
		t.Fatalf("agent saw %d (last %v), upstream got %d marked %q", seen, last, n, marker)
	}
	late := strings.Repeat("x", 150<<10) + "EVIL" + strings.Repeat("x", 50<<10)
	if resp, got := p.do(t, "POST", "/", strings.NewReader(late)); resp.StatusCode != 403 || got != "blocked" {
		t.Fatalf("late block: %d %q, want 403", resp.StatusCode, got)
	}
	if st := agentBodyCounts(t, p); st.Stream != 2 || st.Prefix != 0 {
		t.Fatalf("counters %+v", st)
	}
}
