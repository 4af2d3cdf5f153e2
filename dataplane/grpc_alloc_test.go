package dataplane_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// hpackBlock encodes fields as one header block.
func hpackBlock(fields ...[2]string) []byte {
	var blk bytes.Buffer
	enc := hpack.NewEncoder(&blk)
	for _, f := range fields {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	return blk.Bytes()
}

// frameGRPCUpstream is an h2c upstream that answers every stream as a
// unary gRPC call does (HEADERS, one message, trailers) from frames
// encoded once, reading the request's frames without decoding them: it
// allocates (almost) nothing, so a benchmark's allocations are the
// proxy's.
func frameGRPCUpstream(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = ln.Close() })
	head := hpackBlock([2]string{":status", "200"}, [2]string{"content-type", "application/grpc"})
	trailers := hpackBlock([2]string{"grpc-status", "0"}, [2]string{"grpc-message", ""})
	msg := append([]byte{0, 0, 0, 0, 16}, "0123456789abcdef"...)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serveFrameGRPC(c, head, trailers, msg)
		}
	}()
	return ln.Addr().String()
}

func serveFrameGRPC(c net.Conn, head, trailers, msg []byte) {
	defer c.Close()
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil {
		return
	}
	bw := bufio.NewWriter(c)
	fr := http2.NewFramer(bw, bufio.NewReader(c))
	_ = fr.WriteSettings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 1000})
	// A connection window the requests never exhaust.
	_ = fr.WriteWindowUpdate(0, 1<<30)
	_ = bw.Flush()
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = fr.WritePing(true, f.Data)
			}
		}
		if !f.Header().Flags.Has(http2.FlagDataEndStream) || (f.Header().Type != http2.FrameData && f.Header().Type != http2.FrameHeaders) {
			if bw.Buffered() > 0 {
				_ = bw.Flush()
			}
			continue
		}
		id := f.Header().StreamID
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: head, EndHeaders: true})
		_ = fr.WriteData(id, false, msg)
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: trailers, EndHeaders: true, EndStream: true})
		if bw.Flush() != nil {
			return
		}
	}
}

// BenchmarkGRPCProxiedCall: a unary gRPC call (HEADERS and one DATA
// frame, the answer's HEADERS, DATA and trailers) over h2c through the
// proxy to an h2c upstream (frameGRPCUpstream), one call at a time;
// allocs/op are the proxy's (see frameClient).
func BenchmarkGRPCProxiedCall(b *testing.B) {
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0", protocols: [http1, h2c]}]
upstreams: [{name: app, address: %q, protocol: h2c}]
routes: [{upstream: app}]
`, frameGRPCUpstream(b))))
	if err != nil {
		b.Fatal(err)
	}
	p := startProxy(b, cfg, nil, nil)
	fc := newFrameClient(b, p.addr)
	var frames bytes.Buffer
	fr := http2.NewFramer(&frames, nil)
	blk := hpackBlock([2]string{":method", "POST"}, [2]string{":scheme", "http"}, [2]string{":authority", "x"},
		[2]string{":path", "/peers.Echo/Echo"}, [2]string{"content-type", "application/grpc"}, [2]string{"te", "trailers"})
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: blk, EndHeaders: true}); err != nil {
		b.Fatal(err)
	}
	dataAt := frames.Len()
	if err := fr.WriteData(1, true, append([]byte{0, 0, 0, 0, 16}, "0123456789abcdef"...)); err != nil {
		b.Fatal(err)
	}
	call := frames.Bytes()
	do := func() {
		binary.BigEndian.PutUint32(call[5:9], fc.id)
		binary.BigEndian.PutUint32(call[dataAt+5:dataAt+9], fc.id)
		if _, err := fc.c.Write(call); err != nil {
			b.Fatal(err)
		}
		_ = fc.c.SetReadDeadline(time.Now().Add(hangGuard))
		for {
			f, err := fc.fr.ReadFrame()
			if err != nil {
				b.Fatal(err)
			}
			h := f.Header()
			if h.StreamID == fc.id && h.Type == http2.FrameHeaders && h.Flags.Has(http2.FlagHeadersEndStream) {
				break
			}
			if h.StreamID == fc.id && h.Type == http2.FrameData && h.Flags.Has(http2.FlagDataEndStream) {
				b.Fatal("the answer ended without trailers")
			}
			if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
				_ = fc.fr.WriteSettingsAck()
			}
			if rf, ok := f.(*http2.RSTStreamFrame); ok {
				b.Fatalf("stream %d reset: %v", rf.StreamID, rf.ErrCode)
			}
		}
		fc.id += 2
	}
	for range 200 {
		do()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		do()
	}
}
