package extproc

import (
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/protocol"
)

// BenchmarkMapRequestHeaders measures our own per-request mapping of a
// request's headers to a ProcessingRequest (requestHeaders), without the
// stream.
func BenchmarkMapRequestHeaders(b *testing.B) {
	st := &reqStream{l: &link{c: &Client{cfg: DefaultConfig("bench", "127.0.0.1:1")}}}
	m := &protocol.RequestHeaders{
		RequestID: 1,
		Method:    []byte("GET"),
		URI:       []byte("/api/v1/items?id=42"),
		Headers: protocol.Headers{
			{Name: []byte("Host"), Value: []byte("example.com")},
			{Name: []byte("User-Agent"), Value: []byte("bench/1.0")},
			{Name: []byte("Accept"), Value: []byte("*/*")},
			{Name: []byte("x-request-id"), Value: []byte("abc")},
			{Name: []byte("Content-Type"), Value: []byte("application/json")},
			{Name: []byte("cookie"), Value: []byte("a=b")},
		},
	}
	b.ReportAllocs()
	for b.Loop() {
		st.sentFirst = false
		if st.requestHeaders(m) == nil {
			b.Fatal("nil")
		}
	}
}

// TestLowerName: lowerName is strings.ToLower of the name.
func TestLowerName(t *testing.T) {
	for _, s := range []string{"", "host", "Host", "X-Request-ID", "x-a1_B2", "Ünïcode-Name", "\xff\xfeA", "ALLCAPS", "content-type", "Content-Type"} {
		if got, want := lowerName([]byte(s)), strings.ToLower(s); got != want {
			t.Errorf("lowerName(%q) = %q, want %q", s, got, want)
		}
	}
}
