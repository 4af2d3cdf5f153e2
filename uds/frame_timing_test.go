package uds

import (
	"testing"

	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/protocol"
)

// browserRequest is a RequestHeaders event of about 1 KB: the headers a
// browser sends for a page, and the metadata the proxy adds.
func browserRequest() *protocol.RequestHeaders {
	m := &protocol.RequestHeaders{RequestID: 1 << 40, Method: []byte("GET"), URI: []byte("/account/orders?page=2&sort=date"),
		Metadata: protocol.Metadata{CorrelationID: []byte("9f86d081884c7d65"), ClientIP: []byte("203.0.113.7"), ClientPort: 51234,
			Protocol: []byte("HTTP/1.1"), ServerName: []byte("shop.example.com"), RouteID: []byte("default"), UpstreamID: []byte("app"),
			Timestamp: []byte("2026-11-23T10:00:00Z")}}
	for _, kv := range [][2]string{
		{"host", "shop.example.com"},
		{"user-agent", "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36"},
		{"accept", "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"},
		{"accept-language", "en-GB,en;q=0.9,de;q=0.8"},
		{"accept-encoding", "gzip, deflate, br, zstd"},
		{"referer", "https://shop.example.com/account"},
		{"cookie", "session=3f9a1c0e7b2d4a6f8e1c3b5d7f9a2c4e; theme=dark; consent=analytics:0,ads:0"},
		{"sec-fetch-dest", "document"},
		{"sec-fetch-mode", "navigate"},
		{"sec-fetch-site", "same-origin"},
		{"sec-fetch-user", "?1"},
		{"upgrade-insecure-requests", "1"},
		{"cache-control", "max-age=0"},
		{"x-forwarded-for", "198.51.100.23"},
		{"x-request-id", "0f8fad5b-d9cb-469f-a165-70867728950e"},
		{"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
	} {
		m.Headers = m.Headers.Add([]byte(kv[0]), []byte(kv[1]))
	}
	return m
}

func benchAppend(b *testing.B, enc Encoding) {
	m := browserRequest()
	buf, err := AppendFrameAs(nil, m, enc)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = AppendFrameAs(buf[:0], m, enc)
	}
}

// BenchmarkAppendFrameJSON and BenchmarkAppendFrameProtobuf encode the same
// 1 KB RequestHeaders frame in each payload encoding.
func BenchmarkAppendFrameJSON(b *testing.B)     { benchAppend(b, JSON) }
func BenchmarkAppendFrameProtobuf(b *testing.B) { benchAppend(b, Protobuf) }

// BenchmarkDecodeJSON and BenchmarkDecodeProtobuf decode its payload the
// way each end does: the JSON decoder copies it into the message; the
// protobuf path copies it into a buffer of the receiver and decodes in
// place.
func BenchmarkDecodeJSON(b *testing.B) {
	f, _ := AppendFrame(nil, browserRequest())
	p := f[HeaderSize:]
	var m protocol.RequestHeaders
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		if err := m.Decode(p); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeProtobuf(b *testing.B) {
	f, _ := AppendFrameAs(nil, browserRequest(), Protobuf)
	p := f[HeaderSize:]
	var m protocol.RequestHeaders
	var fr pbwire.Frame
	buf := make([]byte, 0, len(p))
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		buf = append(buf[:0], p...)
		fr.Parse(buf)
		if err := fr.DecodeRequestHeaders(&m); err != nil {
			b.Fatal(err)
		}
	}
}
