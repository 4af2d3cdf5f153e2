//go:build !linux

package testutil

import (
	"net"
	"testing"
)

// RefusedAddr is a loopback TCP address that refuses connections: here
// a port freed by closing a listener (another test may take it again).
func RefusedAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
