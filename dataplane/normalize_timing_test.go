package dataplane

import (
	"testing"
)

// BenchmarkPrepareHead prices the head normalisation of one request
// (prepareRequest: target, Host canonicalisation, the upstream header
// list) for a typical browser-sized head, with a Host already canonical
// (the common case: nothing is rewritten) and one that is not (lower-cased,
// its trailing dot dropped, fasthttp's Host rewritten). It must not
// allocate.
func BenchmarkPrepareHead(b *testing.B) {
	const rest = "User-Agent: Mozilla/5.0 (X11; Linux x86_64) Gecko/20100101 Firefox/128.0\r\n" +
		"Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n" +
		"Accept-Language: en-US,en;q=0.5\r\nAccept-Encoding: gzip, deflate, br\r\n" +
		"Cookie: session=0123456789abcdef; theme=dark\r\nConnection: keep-alive\r\n\r\n"
	for _, tc := range []struct{ name, host string }{
		{"canonical host", "www.example.com"},
		{"host with port", "www.example.com:8080"},
		{"upper case, trailing dot, port", "WWW.Example.COM.:8080"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			rs := headState([]byte("GET /index.html?q=1 HTTP/1.1\r\nHost: " + tc.host + "\r\n" + rest))
			h := &rs.ctx.Request.Header
			orig := []byte(tc.host)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				h.SetHostBytes(orig)
				if !rs.prepareRequest() {
					b.Fatal("refused")
				}
				benchHostLines(rs)
			}
		})
	}
}

// benchHostLines is what serve does with the host after prepareRequest
// before routing: nothing since prepareRequest canonicalises it.
func benchHostLines(*reqState) {}
