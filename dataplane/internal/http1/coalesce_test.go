package http1

import (
	"bufio"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// TestStreamReaderFound: the reader under fasthttp's body stream is found
// (coalesce.go). If a fasthttp upgrade moves it, request bodies go back
// to one agent event per chunk of the client's framing.
func TestStreamReaderFound(t *testing.T) {
	if bodyStreamReader.typ == nil {
		t.Fatal("the reader field of fasthttp's body stream was not found")
	}
	var req fasthttp.Request
	req.Header.SetContentLength(-1)
	br := bufio.NewReader(strings.NewReader("1\r\nx\r\n0\r\n\r\n"))
	if err := req.ContinueReadBodyStream(br, 0, false); err != nil {
		t.Fatal(err)
	}
	if got := bodyStreamReader.reader(req.BodyStream()); got != br {
		t.Fatalf("reader %p, want %p", got, br)
	}
	if bodyStreamReader.reader(strings.NewReader("x")) != nil {
		t.Fatal("a reader found in a stream of another type")
	}
}
