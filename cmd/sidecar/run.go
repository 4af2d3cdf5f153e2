package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/config"
	"github.com/zentinelproxy/sidecar/dataplane"
)

// agentWait is how long run waits for agents before it starts serving
// anyway (their failure modes then decide until they connect).
const agentWait = 3 * time.Second

func runCmd(args []string, stderr io.Writer) error {
	fs := newFlagSet("run", "sidecar run -config FILE [flags]", stderr)
	path := fs.String("config", "", "configuration `file` (required)")
	level := fs.String("log-level", "", "log `level`: trace, debug, info, warn or error (default: the file's logging.level)")
	format := fs.String("log-format", "", "log `format`: json or console (default: the file's logging.format)")
	drain := fs.Duration("drain", 10*time.Second, "how long in-flight requests may take to finish on shutdown")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if *path == "" {
		fmt.Fprintln(stderr, "run: -config is required")
		fs.Usage()
		return errUsage
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	if *level != "" {
		cfg.Logging.Level = *level
	}
	if *format != "" {
		cfg.Logging.Format = *format
	}
	log, err := newLogger(cfg.Logging, stderr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return serve(ctx, cfg, log, *drain)
}

// serve runs cfg on its configured listeners until ctx ends.
func serve(ctx context.Context, cfg *config.Config, log zerolog.Logger, drain time.Duration) error {
	set, err := buildAgents(cfg, log)
	if err != nil {
		return err
	}
	rctx, stopReverse := context.WithCancel(context.Background())
	defer stopReverse()
	revErr := set.serveReverse(rctx)

	wctx, cancel := context.WithTimeout(ctx, agentWait)
	missing := waitAgents(wctx, set.agents)
	cancel()
	for _, name := range missing {
		log.Warn().Str("agent", name).Str("last_error", set.agents[name].Snapshot().LastError).
			Msg("agent not connected yet; its failure mode applies until it is")
	}

	srv, err := dataplane.New(dataplane.Config{File: cfg}, set.agents, log)
	if err != nil {
		set.close()
		return err
	}
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe() }()
	addrs := make([]string, len(cfg.Listeners))
	for i, l := range cfg.Listeners {
		addrs[i] = l.Address
	}
	log.Info().Str("listeners", strings.Join(addrs, ",")).Int("routes", len(cfg.Routes)).
		Int("agents", len(cfg.Agents)).Msg("sidecar serving")

	select {
	case <-ctx.Done():
		log.Info().Dur("drain", drain).Msg("shutting down")
	case err = <-served:
		// A listener failed (port in use, …) before any shutdown.
	case err = <-revErr:
	}
	sctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	if serr := srv.Shutdown(sctx); serr != nil && err == nil && serr != dataplane.ErrDataplaneClosed {
		err = fmt.Errorf("shutdown: %w", serr)
	}
	stopReverse()
	set.closeListeners()
	return err
}

// newLogger builds the zerolog logger of l, writing to w.
func newLogger(l config.Logging, w io.Writer) (zerolog.Logger, error) {
	level, err := zerolog.ParseLevel(strings.ToLower(l.Level))
	if err != nil || level == zerolog.NoLevel {
		return zerolog.Logger{}, fmt.Errorf("log level %q: want trace, debug, info, warn or error", l.Level)
	}
	out := w
	switch l.Format {
	case "", "json":
	case "console":
		out = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05"}
	default:
		return zerolog.Logger{}, fmt.Errorf("log format %q: want json or console", l.Format)
	}
	return zerolog.New(out).Level(level).With().Timestamp().Logger(), nil
}
