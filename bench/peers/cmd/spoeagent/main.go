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
	if err := a.Serve(ln); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "spoeagent:", err)
		os.Exit(1)
	}
}
