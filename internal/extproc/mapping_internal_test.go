package extproc

import (
	"slices"
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

// TestHeaderMapReuse: a reqStream's memory maps the next request's
// headers as a fresh one would, whichever names it kept from the last
// (same names, other names, upper-case ones at the same places, more and
// fewer headers).
func TestHeaderMapReuse(t *testing.T) {
	var h headersMsg
	for _, names := range [][]string{
		{"host", "accept", "x-a"},
		{"host", "accept", "x-a"},
		{"Host", "ACCEPT", "x-a", "x-b"},
		{"host", "accept", "X-A", "x-b", "", "x-ünï"},
		{"x-b"},
		{"host", "accept", "x-a", "x-b", "", "x-Ünï"},
	} {
		for dir := range 2 {
			var hs protocol.Headers
			for _, n := range names {
				hs = hs.Add([]byte(n), []byte("v"))
			}
			hm := h.headerMap([]pseudoHeader{{":p", []byte("1")}}, hs, dir == 0, dir)
			want := []string{":p"}
			for _, n := range names {
				if l := strings.ToLower(n); dir == 1 || l != "host" {
					want = append(want, l)
				}
			}
			var got []string
			for _, v := range hm.Headers {
				got = append(got, v.Key)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("names %q (dir %d): keys %q, want %q", names, dir, got, want)
			}
		}
	}
}
