package main

import (
	"testing"

	"github.com/zentinelproxy/sidecar/protocol"
)

// The per-request work of the loop allocates nothing once its buffers
// have grown.
func TestAllocsPerRequest(t *testing.T) {
	req := []byte("GET / HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: wrk\r\n\r\n")
	resp := []byte("HTTP/1.1 200 OK\r\nServer: upstream\r\nContent-Type: text/plain\r\nContent-Length: 20")
	ops := []protocol.HeaderOp{{Op: protocol.HeaderSet, Name: []byte("X-Agent-Processed"), Value: []byte("true")}}
	var ev protocol.RequestHeaders
	var scratch []byte
	n := testing.AllocsPerRun(1000, func() {
		ev.Reset()
		if !parseRequest(req, &ev) || contentLength(resp) != 20 {
			t.Fatal("parse failed")
		}
		scratch = applyOps(scratch[:0], req, ops)
	})
	if n != 0 {
		t.Errorf("%.1f allocations per request, want 0", n)
	}
}
