// Package testagent runs agents on real Unix sockets for tests: one on
// the SDK, and a frame-level one that speaks frames by hand. It is
// imported by _test files only.
package testagent

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/uds"
)

// Serve serves h with the SDK on a Unix socket at path until stop is
// called or the test ends; stop waits for the agent to return.
func Serve(t testing.TB, path string, h sdk.Handler) (stop func()) {
	t.Helper()
	return ServeWith(t, path, h, nil)
}

// ServeWith is Serve with the SDK's options (nil: the defaults).
func ServeWith(t testing.TB, path string, h sdk.Handler, opts *sdk.Options) (stop func()) {
	t.Helper()
	ln, err := sdk.ListenUDS(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = sdk.Serve(ctx, ln, h, opts)
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// Raw listens at path, answers each connection's handshake with caps
// and hands the connection to serve, which speaks frames by hand. It
// returns the number of connections accepted so far.
func Raw(t testing.TB, path string, caps protocol.Capabilities, serve func(nc net.Conn, fr *uds.FrameReader)) *atomic.Int64 {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open = append(open, nc)
			mu.Unlock()
			conns.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer nc.Close()
				fr := uds.NewFrameReader(nc)
				if _, _, err := fr.Next(); err != nil {
					return
				}
				resp := protocol.HandshakeResponse{ProtocolVersion: protocol.Version, AgentName: "raw", Accepted: true, Capabilities: caps}
				if uds.WriteFrame(nc, &resp) != nil {
					return
				}
				serve(nc, fr)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range open {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return &conns
}

// NextHeaders reads frames off fr, skipping every other type, until a
// RequestHeaders event and returns its payload (valid until the next
// read); ok is false once the connection has ended. It is the read step of
// a Raw agent's serve loop.
func NextHeaders(fr *uds.FrameReader) (payload []byte, ok bool) {
	for {
		t, p, err := fr.Next()
		if err != nil {
			return nil, false
		}
		if t == protocol.TypeRequestHeaders {
			return p, true
		}
	}
}
