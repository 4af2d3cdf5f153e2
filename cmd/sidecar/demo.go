package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"text/template"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/examples/demoagent"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/supervisor"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/sdk/grpcsdk"
)

// demoConfig is the configuration the demo runs; its addresses are
// replaced by the ones the demo picks.
//
//go:embed demo.yaml
var demoConfig []byte

// demoAgentName is the agent's name in demo.yaml.
const demoAgentName = "demoagent"

// demoAgentWait bounds the wait for the demo agent to connect.
const demoAgentWait = 10 * time.Second

// Errors of the demo.
var (
	// errDemoListen: the sidecar's address is taken or invalid.
	errDemoListen = errors.New("demo: cannot listen")
	// errDemoTransport: the -agent-transport value is unknown.
	errDemoTransport = errors.New("demo: unknown agent transport")
	// errDemoAgent: the -agent value is unknown.
	errDemoAgent = errors.New("demo: unknown agent")
)

// demoOptions configure runDemo.
type demoOptions struct {
	// Listen is the sidecar's address; port 0 picks a free one.
	Listen string
	// Transport is how the demo agent connects: uds, grpc or reverse.
	Transport string
	// Agent is the agent run: demo (examples/demoagent, the default) or
	// waf (examples/corazawaf: Coraza with the OWASP Core Rule Set).
	Agent string
	// Log receives the sidecar's and the agent's logs.
	Log zerolog.Logger
	// LogLevel overrides the embedded config's logging.level ("" keeps it).
	LogLevel string
}

// demoAddrs are the addresses the demo picked, reported once it serves.
type demoAddrs struct {
	// Sidecar is the sidecar's host:port.
	Sidecar string
	// Upstream is the built-in upstream's host:port.
	Upstream string
	// Transport and Agent: how and where the agent connects.
	Transport string
	Agent     string
	// Kind is the agent run: demo or waf.
	Kind string
}

func demoCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", "sidecar demo [flags]", stderr)
	listen := fs.String("listen", "127.0.0.1:8080", "the sidecar's `address` (port 0 picks a free one)")
	transport := fs.String("agent-transport", "uds", "how the demo agent connects: uds, grpc or reverse")
	agent := fs.String("agent", "demo", "the agent: demo (examples/demoagent) or waf (Coraza with the OWASP Core Rule Set, examples/corazawaf)")
	level := fs.String("log-level", "info", "log `level`: trace, debug (one line per request), info, warn or error")
	printConfig := fs.Bool("print-config", false, "print the embedded configuration and exit")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if *printConfig {
		_, err := stdout.Write(demoConfig)
		return err
	}
	lv, err := zerolog.ParseLevel(*level)
	if err != nil || lv == zerolog.NoLevel {
		fmt.Fprintf(stderr, "demo: -log-level %q: want trace, debug, info, warn or error\n", *level)
		return errUsage
	}
	log := zerolog.New(zerolog.ConsoleWriter{Out: stderr, TimeFormat: "15:04:05"}).
		Level(lv).With().Timestamp().Logger()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runDemo(ctx, demoOptions{Listen: *listen, Transport: *transport, Agent: *agent, Log: log, LogLevel: *level},
		func(a demoAddrs) { printInstructions(stdout, a) })
}

// runDemo starts the built-in upstream, the demo agent and the sidecar,
// calls ready with their addresses once all serve, and runs until ctx
// ends. It stops them in reverse order: the sidecar drains first, so that
// no request loses its agent or upstream midway.
func runDemo(ctx context.Context, o demoOptions, ready func(demoAddrs)) (err error) {
	switch o.Transport {
	case "", "uds":
		o.Transport = "uds"
	case "grpc", "reverse":
	default:
		return fmt.Errorf("%w %q (want uds, grpc or reverse)", errDemoTransport, o.Transport)
	}
	switch o.Agent {
	case "", "demo":
		o.Agent = "demo"
	case "waf":
	default:
		return fmt.Errorf("%w %q (want demo or waf)", errDemoAgent, o.Agent)
	}
	var stops []func()
	defer func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}()
	// failed reports a component that stopped on its own.
	failed := make(chan error, 4)

	// Listen first: a taken port is the likeliest failure, report it
	// before anything else starts.
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("%w on %s: %v\n"+
			"  Another program uses this address. Pick another one, e.g.\n"+
			"    sidecar demo -listen 127.0.0.1:8081\n"+
			"  or let the system choose a free port with -listen 127.0.0.1:0", errDemoListen, o.Listen, err)
	}
	stops = append(stops, func() { _ = ln.Close() })
	// Sockets live in a private directory (short path: the limit is 107 bytes).
	dir, err := os.MkdirTemp("", "sidecar-demo")
	if err != nil {
		return err
	}
	stops = append(stops, func() { _ = os.RemoveAll(dir) })

	upCtx, stopUp := context.WithCancel(context.Background())
	upAddr, upDone, err := startUpstream(upCtx, "127.0.0.1:0")
	if err != nil {
		stopUp()
		return err
	}
	stops = append(stops, func() { stopUp(); <-upDone })

	cfg, err := config.Parse(demoConfig)
	if err != nil {
		return fmt.Errorf("demo: embedded config: %w", err)
	}
	cfg.Listeners[0].Address = ln.Addr().String()
	cfg.Upstreams[0].Address = upAddr.String()
	// No admin listener (a second demo would collide on its port), and so
	// no metrics.
	cfg.Admin.Enabled = new(false)
	if o.LogLevel != "" {
		cfg.Logging.Level = o.LogLevel
	}
	agentCfg := cfg.Agent(demoAgentName)
	if agentCfg == nil {
		return fmt.Errorf("demo: embedded config has no agent %q", demoAgentName)
	}

	// The agent, on the side of the socket the demo's transport needs.
	agentLog := o.Log.With().Str("side", "agent").Logger()
	var h sdk.Handler
	if o.Agent == "waf" {
		wh, err := newDemoWAF(agentCfg, &agentLog)
		if err != nil {
			return err
		}
		// Registered before the agent's stop, so it runs after it.
		stops = append(stops, func() { _ = wh.Close() })
		h = wh
	} else if h, err = demoagent.New(demoagent.DefaultConfig()); err != nil {
		return err
	}
	agentOpts := &sdk.Options{Name: demoAgentName, Logger: &agentLog}
	agentCtx, stopAgent := context.WithCancel(context.Background())
	agentDone := make(chan struct{})
	runAgent := func(serve func() error) {
		go func() {
			defer close(agentDone)
			if err := serve(); err != nil || agentCtx.Err() == nil {
				failed <- fmt.Errorf("demo: the agent stopped: %v", err)
			}
		}()
		stops = append(stops, func() { stopAgent(); <-agentDone })
	}
	var agentAddr string
	switch o.Transport {
	case "uds":
		agentAddr = filepath.Join(dir, "demoagent.sock")
		aln, err := sdk.ListenUDS(agentAddr, agentOpts)
		if err != nil {
			stopAgent()
			return err
		}
		runAgent(func() error { return sdk.Serve(agentCtx, aln, h, agentOpts) })
		agentCfg.Transport, agentCfg.Address = config.TransportUDS, agentAddr
	case "grpc":
		aln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			stopAgent()
			return err
		}
		agentAddr = aln.Addr().String()
		runAgent(func() error {
			return grpcsdk.Serve(agentCtx, aln, h, &grpcsdk.Options{Name: agentOpts.Name, Logger: agentOpts.Logger})
		})
		agentCfg.Transport, agentCfg.Address = config.TransportGRPC, agentAddr
	case "reverse":
		// The sidecar listens and the agent dials in (started below). The
		// socket file's mode (0660) decides who may connect, so the demo
		// needs no token.
		agentAddr = filepath.Join(dir, "reverse.sock")
		agentCfg.Transport, agentCfg.Address = config.TransportReverse, "unix:"+agentAddr
		agentCfg.Options = map[string]string{"allow_no_token": "true"}
	}
	if err := cfg.Validate(); err != nil {
		stopAgent()
		return fmt.Errorf("demo: config: %w", err)
	}
	if err := supervisor.Check(cfg); err != nil {
		stopAgent()
		return fmt.Errorf("demo: config: %w", err)
	}

	// The sidecar.
	sideLog := o.Log.With().Str("side", "sidecar").Logger()
	if lv, err := zerolog.ParseLevel(cfg.Logging.Level); err == nil {
		sideLog = sideLog.Level(lv)
	}
	if o.Transport == "reverse" {
		// It dials until the sidecar's reverse listener, bound by Start,
		// takes it.
		runAgent(func() error {
			return sdk.DialAndServe(agentCtx, sdk.ReverseConfig{
				Address: agentAddr, AgentID: demoAgentName, Logger: &agentLog,
				BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
			}, h)
		})
	}
	so := supervisor.DefaultOptions()
	so.Log, so.Version, so.AgentWait, so.Drain, so.Listener = sideLog, version(), demoAgentWait, 5*time.Second, ln
	s, err := supervisor.Start(ctx, cfg, so)
	if err != nil {
		stopAgent()
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("demo: sidecar: %w", err)
	}
	stops = append(stops, func() {
		sctx, cancel := context.WithTimeout(context.Background(), so.Drain)
		defer cancel()
		_ = s.Shutdown(sctx)
	})
	for _, st := range s.Agents() {
		if !st.Ready {
			return fmt.Errorf("demo: agent %s did not connect: %s", st.Name, st.LastError)
		}
	}

	if ready != nil {
		ready(demoAddrs{Sidecar: ln.Addr().String(), Upstream: upAddr.String(), Transport: o.Transport, Agent: agentAddr, Kind: o.Agent})
	}
	select {
	case <-ctx.Done():
		o.Log.Info().Msg("stopping the demo")
		return nil
	case err := <-failed:
		return err
	case err := <-s.Failed():
		return fmt.Errorf("demo: sidecar: %w", err)
	}
}

var instructions = template.Must(template.New("").Parse(`
The sidecar demo is running:

  curl ──▶ sidecar http://{{.Sidecar}} ──▶ upstream http://{{.Upstream}}
                   │
                   └─ agent "demoagent" over {{.Transport}} ({{.Agent}})

Try (in another terminal):

  # Allowed: the upstream echoes the request it got, with the headers the
  # agent added (x-demo, x-client-class).
  curl -s http://{{.Sidecar}}/hello

  # Blocked by the agent: 403, a JSON body and an x-blocked-by header.
  # The upstream never sees the request.
  curl -i http://{{.Sidecar}}/admin

  # The same over HTTP/2 (cleartext, prior knowledge): the agent sees the
  # same request, its protocol HTTP/2.0.
  curl -i --http2-prior-knowledge http://{{.Sidecar}}/admin

  # Redirected by the agent: 302 to /new/page.
  curl -i http://{{.Sidecar}}/old/page

  # The word "secret" masked in the response body as it streams through,
  # also where the upstream splits it across writes. Compare with the
  # upstream itself.
  curl -s http://{{.Sidecar}}/page
  curl -s http://{{.Upstream}}/page

  # A longer body: 1000 lines, every "secret" masked, none left.
  curl -s 'http://{{.Sidecar}}/page?repeat=1000' | grep -ci secret

Restart with -log-level debug to see one log line per request.
Press Ctrl-C to stop.
`))

func printInstructions(w io.Writer, a demoAddrs) {
	if a.Kind == "waf" {
		_ = wafInstructions.Execute(w, a)
		return
	}
	_ = instructions.Execute(w, a)
}
