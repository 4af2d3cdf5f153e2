package dataplane_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// h2cListenerProxy starts a proxy whose listener serves HTTP/1.1 and h2c,
// in front of the zero-allocation upstream.
func h2cListenerProxy(tb testing.TB) *proxy {
	tb.Helper()
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0", protocols: [http1, h2c]}]
upstreams: [{name: app, address: %q}]
routes: [{upstream: app}]
`, fastUpstream(tb))))
	if err != nil {
		tb.Fatal(err)
	}
	return startProxy(tb, cfg, nil, nil)
}

// TestAllocsHTTP1OnH2CListener: an HTTP/1.1 request on a listener that
// also serves h2c allocates nothing either (sorting the connection costs
// per connection, not per request).
func TestAllocsHTTP1OnH2CListener(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	p := h2cListenerProxy(t)
	req := fasthttp.AcquireRequest()
	req.SetRequestURI("http://x/alloc")
	n := testing.AllocsPerRun(500, steadyRequest(t, p.addr, req))
	if n > 0 {
		t.Errorf("%.2f allocations per HTTP/1.1 request on an h2c listener, want 0", n)
	}
}

// frameClient is an h2c client that sends one pre-encoded GET per stream
// and reads the answer's frames without decoding them: it allocates
// (almost) nothing itself, so the allocations of a request through the
// proxy are the proxy's (and the upstream's, which has none).
type frameClient struct {
	c    net.Conn
	fr   *http2.Framer
	head []byte // a HEADERS frame; its stream id is patched per request
	id   uint32
}

func newFrameClient(tb testing.TB, addr string) *frameClient {
	tb.Helper()
	c, err := net.DialTimeout("tcp", addr, hangGuard)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		tb.Fatal(err)
	}
	fc := &frameClient{c: c, fr: http2.NewFramer(c, c), id: 1}
	if err := fc.fr.WriteSettings(); err != nil {
		tb.Fatal(err)
	}
	// A connection window the responses never exhaust.
	if err := fc.fr.WriteWindowUpdate(0, 1<<30); err != nil {
		tb.Fatal(err)
	}
	var blk bytes.Buffer
	enc := hpack.NewEncoder(&blk)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", "x"}, {":path", "/alloc"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	var frame bytes.Buffer
	hf := http2.NewFramer(&frame, nil)
	if err := hf.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: blk.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
		tb.Fatal(err)
	}
	fc.head = frame.Bytes()
	return fc
}

// do sends one request and reads frames until its stream ends.
func (fc *frameClient) do(tb testing.TB) {
	binary.BigEndian.PutUint32(fc.head[5:9], fc.id)
	if _, err := fc.c.Write(fc.head); err != nil {
		tb.Fatal(err)
	}
	_ = fc.c.SetReadDeadline(time.Now().Add(hangGuard))
	for {
		f, err := fc.fr.ReadFrame()
		if err != nil {
			tb.Fatal(err)
		}
		if f.Header().StreamID == fc.id && f.Header().Flags.Has(http2.FlagDataEndStream) {
			break
		}
		if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
			_ = fc.fr.WriteSettingsAck()
		}
		if rf, ok := f.(*http2.RSTStreamFrame); ok {
			tb.Fatalf("stream %d reset: %v", rf.StreamID, rf.ErrCode)
		}
	}
	fc.id += 2
}

// BenchmarkHTTP2ProxiedRequest: a GET over h2c through the proxy to the
// zero-allocation upstream; allocs/op are the proxy's (see frameClient).
func BenchmarkHTTP2ProxiedRequest(b *testing.B) {
	p := h2cListenerProxy(b)
	fc := newFrameClient(b, p.addr)
	for i := 0; i < 200; i++ {
		fc.do(b)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		fc.do(b)
	}
}
