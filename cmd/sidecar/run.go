package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/gomaxprocs"
	"github.com/zentinelproxy/sidecar/internal/schedpolicy"
	"github.com/zentinelproxy/sidecar/internal/supervisor"
)

func runCmd(args []string, stderr io.Writer) error {
	fs := newFlagSet("run", "sidecar run -config FILE [flags]", stderr)
	path := fs.String("config", "", "configuration `file` (required); SIGHUP or POST /reload on the admin listener re-reads it")
	level := fs.String("log-level", "", "log `level`: trace, debug, info, warn or error (default: the file's logging.level)")
	format := fs.String("log-format", "", "log `format`: json or console (default: the file's logging.format)")
	drain := fs.Duration("drain", supervisor.DefaultDrain, "how long in-flight requests may take to finish on shutdown")
	procs := fs.String("gomaxprocs", "adaptive", "`mode`: adaptive (GOMAXPROCS follows the load: fewer Ps while the load fits in them, more at the next reading, every 100ms, when it does not, up to the Go runtime's default; see docs/operations.md), or runtime (the Go runtime's default throughout). The GOMAXPROCS environment variable, when set, wins")
	sched := fs.String("sched", "normal", "scheduling `policy`: normal, or batch (SCHED_BATCH, Linux: a wake-up does not preempt the task running on the CPU; for a sidecar that shares a core with its agents, see docs/operations.md)")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if err := oneOf(fs, "sched", *sched, "normal", "batch"); err != nil {
		return err
	}
	if err := oneOf(fs, "gomaxprocs", *procs, "adaptive", "runtime"); err != nil {
		return err
	}
	if *path == "" {
		fmt.Fprintln(stderr, "run: -config is required")
		fs.Usage()
		return errUsage
	}
	override := func(c *config.Config) {
		if *level != "" {
			c.Logging.Level = *level
		}
		if *format != "" {
			c.Logging.Format = *format
		}
	}
	cfg, err := supervisor.Load(*path, override)
	if err != nil {
		return err
	}
	log, err := supervisor.NewLogger(cfg.Logging, stderr)
	if err != nil {
		return err
	}
	if *sched == "batch" {
		if err := schedpolicy.SetBatch(); err != nil {
			return err
		}
		log.Info().Str("policy", "SCHED_BATCH").Msg("scheduling policy set")
	}
	// Signals are caught from here on: one that arrives while the sidecar
	// starts is handled as soon as it serves.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1)
	defer signal.Stop(sigs)
	o := supervisor.DefaultOptions()
	o.Path, o.Override, o.Log, o.Version, o.Drain = *path, override, log, version(), *drain
	s, err := supervisor.Start(context.Background(), cfg, o)
	if err != nil {
		return err
	}
	if *procs == "adaptive" {
		ctx, stop := context.WithCancel(context.Background())
		done, err := gomaxprocs.Start(ctx, gomaxprocs.DefaultConfig(), log)
		if err != nil {
			stop()
			log.Info().Err(err).Msg("GOMAXPROCS stays as it is")
		} else {
			defer func() { stop(); <-done }()
		}
	}
	return s.Run(context.Background(), sigs)
}
