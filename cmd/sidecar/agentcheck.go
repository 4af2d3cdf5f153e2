package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentcheck"
)

// errChecksFailed: agent-check ran and some check failed (exit 1, the
// report says which).
var errChecksFailed = errors.New("agent-check: some checks failed")

const agentCheckSynopsis = `sidecar agent-check -transport uds|grpc|reverse -address ADDR [flags]

Checks an agent of protocol v2, written in any language, against
docs/protocol.md: handshake, version refusal, Ping/Pong, unknown frames,
request_id correlation and concurrency, cancellation, every declared phase,
malformed and oversized frames, connections closed at awkward moments,
reverse reconnection. -soak or -requests adds steady load; -expect adds the
author's own policy expectations. Exits 1 when a check FAILs.`

func agentCheckCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("agent-check", agentCheckSynopsis, stderr)
	var cfg agentcheck.Config
	fs.StringVar(&cfg.Transport, "transport", "uds", "how to reach the agent: uds, grpc or reverse (listen for its registration)")
	fs.StringVar(&cfg.Address, "address", "", "the agent's socket path or gRPC address; for reverse, where to listen (path or host:port)")
	fs.StringVar(&cfg.Token, "token", "", "reverse: the token the agent must register with (empty: any)")
	fs.StringVar(&cfg.PayloadEncoding, "payload-encoding", "json", "uds, reverse: json, or protobuf to check the agent's protobuf payloads (it must declare supports_protobuf_payloads)")
	fs.IntVar(&cfg.PID, "pid", 0, "the agent's process id: watch it for crashes, CPU spinning and memory growth")
	fs.DurationVar(&cfg.Timeout, "timeout", agentcheck.DefaultTimeout, "bound on each wait for one answer of the agent")
	fs.DurationVar(&cfg.ReconnectWait, "reconnect-wait", agentcheck.DefaultReconnectWait, "reverse: bound on the wait for the agent to register again")
	fs.DurationVar(&cfg.Soak, "soak", 0, "put the agent under steady load for this long (e.g. 60s)")
	fs.IntVar(&cfg.Requests, "requests", 0, "put the agent under steady load for this many requests")
	fs.IntVar(&cfg.Concurrency, "concurrency", agentcheck.DefaultConcurrency, "requests in flight during the soak (lowered to max_concurrent_requests)")
	expect := fs.String("expect", "", "YAML `file` of requests and the decisions expected for them")
	only := fs.String("only", "", "comma-separated check ids to run (default all: "+strings.Join(agentcheck.CheckIDs(), ",")+")")
	soakOnly := fs.Bool("no-checks", false, "run only the soak and the expectations")
	asJSON := fs.Bool("json", false, "write the report as JSON")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if cfg.Address == "" {
		fmt.Fprintln(stderr, "-address is required")
		fs.Usage()
		return errUsage
	}
	if *only != "" {
		known := map[string]bool{}
		for _, id := range agentcheck.CheckIDs() {
			known[id] = true
		}
		for _, id := range strings.Split(*only, ",") {
			id = strings.TrimSpace(id)
			if !known[id] {
				return fmt.Errorf("-only: unknown check %q (known: %s)", id, strings.Join(agentcheck.CheckIDs(), ", "))
			}
			cfg.Only = append(cfg.Only, id)
		}
	}
	cfg.SkipChecks = *soakOnly
	if *expect != "" {
		x, err := agentcheck.LoadExpectations(*expect)
		if err != nil {
			return err
		}
		cfg.Expectations = x
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	rep, err := agentcheck.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if *asJSON {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteTable(stdout)
		if err == nil {
			fmt.Fprintf(stdout, "(%v)\n", time.Since(start).Round(time.Millisecond))
		}
	}
	if err != nil {
		return err
	}
	if rep.Failed() {
		return errChecksFailed
	}
	return nil
}
