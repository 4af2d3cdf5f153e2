package dataplane_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// bigBodySize is 256 MiB by default, 1 GiB with SIDECAR_BIG=1, and 32 MiB
// under the race detector (which multiplies memory and time).
func bigBodySize() int64 {
	switch {
	case os.Getenv("SIDECAR_BIG") == "1":
		return 1 << 30
	case raceEnabled:
		return 32 << 20
	}
	return 256 << 20
}

// peakRSS reads the process's peak resident set size (VmHWM) in bytes.
func peakRSS(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("parsing %q: %v", line, err)
			}
			return kb << 10
		}
	}
	t.Skip("no VmHWM in /proc/self/status")
	return 0
}

// resetPeakRSS makes VmHWM start from the current RSS (Linux 4.0+).
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// pattern is an endless deterministic byte stream.
type pattern struct{ n int64 }

func (p *pattern) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = byte('a' + (p.n+int64(i))%26)
	}
	p.n += int64(len(b))
	return len(b), nil
}

// TestHugeBodyStreamsInBoundedMemory pushes a large upload and a large
// download through a streaming agent that sees (and passes) every chunk,
// and checks the whole process's peak RSS — proxy, agent, upstream and
// client together — stays under 64 MiB.
func TestHugeBodyStreamsInBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("streams hundreds of MiB")
	}
	size := bigBodySize()
	var reqChunks, respChunks, reqBytes, respBytes atomic.Int64
	agent := &agentFuncs{Base: sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true,
		HandlesResponseBody: true, SupportsStreaming: true, SupportsCancellation: true}},
		reqBody: func(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
			reqChunks.Add(1)
			reqBytes.Add(int64(len(m.Data)))
			r.Pass()
			return nil
		},
		respBody: func(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
			respChunks.Add(1)
			respBytes.Add(int64(len(m.Data)))
			r.Pass()
			return nil
		}}
	var upstreamGot atomic.Int64
	up := newUpstreamRaw(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "POST" {
			n, _ := io.Copy(io.Discard, r.Body)
			upstreamGot.Store(n)
			return
		}
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		io.Copy(w, io.LimitReader(&pattern{}, size))
	})
	path := serveAgent(t, agent)
	cfg := configText(t, oneAgentConfig, map[string]any{
		"Upstream": up, "Chain": "a",
		"Agents": map[string]agentSpec{"a": {Path: path, ReqMode: "streaming", RespMode: "streaming"}},
	})
	p := startProxy(t, cfg, map[string]agentmux.Agent{"a": udsAgent(t, "a", path, nil)}, nil)
	// Hundreds of MiB through the race detector on a busy machine can
	// outlast the usual hang guard; this bound only stops a real hang.
	p.client.Timeout = 6 * hangGuard
	runtime.GC()
	resetPeakRSS()
	before := peakRSS(t)

	// Upload.
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
	if resp.StatusCode != 200 || upstreamGot.Load() != size || reqBytes.Load() != size {
		t.Fatalf("upload: status %d, upstream got %d, agent saw %d of %d", resp.StatusCode, upstreamGot.Load(), reqBytes.Load(), size)
	}

	// Download, read with a raw connection to count exactly.
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /download HTTP/1.1\r\nHost: x\r\n\r\n")
	dresp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, dresp.Body)
	if err != nil || n != size || respBytes.Load() != size {
		t.Fatalf("download: read %d (%v), agent saw %d of %d", n, err, respBytes.Load(), size)
	}

	peak := peakRSS(t)
	t.Logf("streamed %d MiB up (%d chunks) and %d MiB down (%d chunks); peak RSS %.1f MiB (%.1f MiB before)",
		size>>20, reqChunks.Load(), size>>20, respChunks.Load(), float64(peak)/(1<<20), float64(before)/(1<<20))
	if raceEnabled {
		return // the race detector's shadow memory makes RSS meaningless
	}
	if peak >= 64<<20 {
		t.Fatalf("peak RSS %.1f MiB, want < 64 MiB", float64(peak)/(1<<20))
	}
}

// newUpstreamRaw is an upstream that does not record bodies.
func newUpstreamRaw(t testing.TB, h http.HandlerFunc) string {
	srv := &http.Server{Handler: h}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}
