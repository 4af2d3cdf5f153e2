// Command spoeagent is the peer benchmark's HAProxy SPOE agent, built on
// github.com/dropmorepackets/haproxy-go (package spop). For the message
// "peers-check" with argument path, it sets the transaction variable block
// (bool) for /admin and below it, and processed = "true" for anything else;
// the HAProxy configuration turns block into a 403 and copies processed
// into the X-Agent-Processed request header.
//
//	spoeagent -listen unix:/tmp/spoe.sock
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/dropmorepackets/haproxy-go/pkg/encoding"
	"github.com/dropmorepackets/haproxy-go/spop"

	"github.com/zentinelproxy/sidecar/bench/peers/internal/job"
)

func handle(_ context.Context, w *encoding.ActionWriter, m *encoding.Message) {
	if string(m.NameBytes()) != "peers-check" {
		return
	}
	k := encoding.AcquireKVEntry()
	defer encoding.ReleaseKVEntry(k)
	deny := true // no path argument: deny
	for m.KV.Next(k) {
		if k.NameEquals("path") {
			deny = job.Denied(k.ValueBytes())
		}
	}
	if deny {
		_ = w.SetBool(encoding.VarScopeTransaction, "block", true)
		return
	}
	_ = w.SetString(encoding.VarScopeTransaction, "processed", job.Value)
}

func main() {
	listen := flag.String("listen", "unix:/tmp/spoeagent.sock", "`address`: unix:/path or host:port")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var ln net.Listener
	var err error
	if p, ok := strings.CutPrefix(*listen, "unix:"); ok {
		_ = os.Remove(p)
		ln, err = net.Listen("unix", p)
	} else {
		ln, err = net.Listen("tcp", *listen)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "spoeagent:", err)
		os.Exit(1)
	}
	a := &spop.Agent{Handler: spop.HandlerFunc(handle), BaseContext: ctx}
	if err := a.Serve(frameListener{ln}); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "spoeagent:", err)
		os.Exit(1)
	}
}

// frameListener hands the library connections whose frames cannot
// interleave. spop v0.0.5 writes each frame with two Write calls, its
// 4-byte length and then the rest, from as many goroutines as there are
// CPUs and without a lock: with GOMAXPROCS > 1 two frames' writes mix,
// HAProxy reads a length that is not one and drops the connection
// ("frame is too big", disconnect code 3), and the requests waiting on it
// get SPOE's error after its processing timeout. With GOMAXPROCS=1 it
// happens only when a goroutine is preempted between the two writes.
type frameListener struct{ net.Listener }

func (l frameListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tcp, ok := c.(*net.TCPConn); ok {
		// What the library does for a TCP connection it can see (its
		// buffers, four frames of 64 KiB); it cannot see it wrapped.
		_ = tcp.SetWriteBuffer(4 * (64<<10 - 1))
		_ = tcp.SetReadBuffer(4 * (64<<10 - 1))
	}
	return &frameConn{Conn: c}, nil
}

// frameConn holds its lock from a frame's length write to the write of
// the rest. A length is exactly 4 bytes; the rest of a frame never is (its
// type, flags and two ids alone take at least 7), so the size tells them
// apart.
type frameConn struct {
	net.Conn
	mu sync.Mutex
}

func (c *frameConn) Write(p []byte) (int, error) {
	if len(p) == 4 {
		c.mu.Lock()
		n, err := c.Conn.Write(p)
		if err != nil {
			c.mu.Unlock() // the library gives up on the frame
		}
		return n, err
	}
	defer c.mu.Unlock()
	return c.Conn.Write(p)
}
