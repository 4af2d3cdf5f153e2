package exchange

import (
	"bytes"
	"testing"
)

// headOf fills ex's head with a request to host: a typical browser-sized
// head, its fields as a front end gives them.
func headOf(ex *Exchange, host string) {
	h := &ex.head
	h.Method, h.Target, h.Path, h.Proto, h.HTTP11 = []byte("GET"), []byte("/index.html?q=1"), []byte("/index.html"), []byte("HTTP/1.1"), true
	h.Host = []byte(host)
	h.Fields = h.Fields[:0]
	for _, l := range bytes.Split([]byte("Host: "+host+"\n"+
		"User-Agent: Mozilla/5.0 (X11; Linux x86_64) Gecko/20100101 Firefox/128.0\n"+
		"Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\n"+
		"Accept-Language: en-US,en;q=0.5\nAccept-Encoding: gzip, deflate, br\n"+
		"Cookie: session=0123456789abcdef; theme=dark\nConnection: keep-alive"), []byte("\n")) {
		k, v, _ := bytes.Cut(l, []byte(": "))
		h.Fields = append(h.Fields, Field{Name: k, Value: v})
	}
}

// BenchmarkPrepareHead prices the head normalisation of one request
// (prepareRequest: Host canonicalisation, the upstream header list) for
// a typical browser-sized head, with a Host already canonical (the
// common case: nothing is rewritten) and one that is not (lower-cased,
// its trailing dot dropped). It must not allocate.
func BenchmarkPrepareHead(b *testing.B) {
	for _, tc := range []struct{ name, host string }{
		{"canonical host", "www.example.com"},
		{"host with port", "www.example.com:8080"},
		{"upper case, trailing dot, port", "WWW.Example.COM.:8080"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ex := testExchange()
			ex.conn = &Conn{ClientIP: []byte("192.0.2.1"), ClientPort: 4321}
			ex.lst = &Listener{}
			headOf(ex, tc.host)
			ex.hostFull = ex.head.Host
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if !ex.prepareRequest() {
					b.Fatal("refused")
				}
			}
		})
	}
}
