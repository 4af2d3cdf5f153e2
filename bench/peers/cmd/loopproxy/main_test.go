package main

import (
	"bytes"
	"testing"

	"github.com/zentinelproxy/sidecar/protocol"
)

func TestParseRequest(t *testing.T) {
	var ev protocol.RequestHeaders
	head := []byte("GET /admin/x HTTP/1.1\r\nHost: a\r\nX-Y:  z \r\nContent-Length: 0\r\n\r\n")
	if !parseRequest(head, &ev) {
		t.Fatal("a GET was refused")
	}
	if string(ev.Method) != "GET" || string(ev.URI) != "/admin/x" || len(ev.Headers) != 3 ||
		string(ev.Headers[1].Name) != "X-Y" || string(ev.Headers[1].Value) != "z" {
		t.Errorf("parsed %q %q %+v", ev.Method, ev.URI, ev.Headers)
	}
	for _, bad := range []string{
		"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\n",
		"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
		"GET\r\n\r\n",
		"GET / HTTP/1.1\r\nno colon\r\n\r\n",
	} {
		ev.Reset()
		if parseRequest([]byte(bad), &ev) {
			t.Errorf("%q was taken", bad)
		}
	}
}

func TestContentLength(t *testing.T) {
	for head, want := range map[string]int{
		"HTTP/1.1 200 OK\r\ncontent-length: 20":            20,
		"HTTP/1.1 200 OK\r\nServer: u\r\nContent-Length:7": 7,
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked":    -1,
		"HTTP/1.1 200 OK\r\nContent-Length: -1":            -1,
		"HTTP/1.1 200 OK\r\nContent-Length: x":             -1,
	} {
		if got := contentLength([]byte(head)); got != want {
			t.Errorf("contentLength(%q) = %d, want %d", head, got, want)
		}
	}
}

func TestApplyOps(t *testing.T) {
	head := []byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	got := applyOps(nil, head, []protocol.HeaderOp{
		{Op: protocol.HeaderSet, Name: []byte("X-Agent-Processed"), Value: []byte("true")},
		{Op: protocol.HeaderRemove, Name: []byte("Host")},
	})
	want := []byte("GET / HTTP/1.1\r\nHost: a\r\nX-Agent-Processed: true\r\n\r\n")
	if !bytes.Equal(got, want) {
		t.Errorf("applyOps = %q, want %q", got, want)
	}
}
