// Command sdkagent is the peer benchmark's agent for the sidecar, built on
// the sidecar's Go SDK and served on a Unix socket: a RequestHeaders
// handler that blocks /admin (and below it) with 403 and adds the request
// header X-Agent-Processed: true to everything else.
//
//	sdkagent -socket /tmp/sdkagent.sock [-sched batch] [-gomaxprocs runtime]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"

	"github.com/zentinelproxy/sidecar/bench/peers/internal/job"
)

// Package-level values: a reply may reference them after the handler
// returns.
var (
	headerName  = []byte(job.Header)
	headerValue = []byte(job.Value)
	deniedBody  = []byte("denied\n")
)

type agent struct{ sdk.Base }

func (agent) OnRequestHeaders(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
	if job.Denied(m.URI) {
		d.Kind, d.Status, d.Body = protocol.DecisionBlock, job.DenyStatus, deniedBody
		return nil
	}
	d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderSet, Name: headerName, Value: headerValue})
	return nil
}

func main() {
	socket := flag.String("socket", "/tmp/sdkagent.sock", "Unix socket `path` to listen on")
	sched := flag.String("sched", "normal", "scheduling `policy`: normal, or batch (sdk.SetBatchScheduling)")
	procs := flag.String("gomaxprocs", "adaptive", "`mode`: adaptive (sdk.AdaptGOMAXPROCS, as the sidecar does by default), or runtime (the Go runtime's default)")
	flag.Parse()
	if *procs != "adaptive" && *procs != "runtime" {
		fmt.Fprintf(os.Stderr, "sdkagent: -gomaxprocs must be adaptive or runtime, not %q\n", *procs)
		os.Exit(2)
	}
	switch *sched {
	case "normal":
	case "batch":
		if err := sdk.SetBatchScheduling(); err != nil {
			fmt.Fprintln(os.Stderr, "sdkagent:", err)
			os.Exit(1)
		}
	default:
		fmt.Fprintf(os.Stderr, "sdkagent: -sched must be normal or batch, not %q\n", *sched)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *procs == "adaptive" {
		if _, err := sdk.AdaptGOMAXPROCS(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "sdkagent: GOMAXPROCS stays as it is:", err)
		}
	}
	h := agent{sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true}}}
	if err := sdk.ServeUDS(ctx, *socket, h, &sdk.Options{Name: "sdkagent"}); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "sdkagent:", err)
		os.Exit(1)
	}
}
