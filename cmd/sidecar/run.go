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

	"github.com/zentinelproxy/sidecar/internal/config"
)

// agentWait is how long run waits for agents before it starts serving
// anyway (their failure modes then decide until they connect), and how
// long a reload waits for the agents it adds. Tests shorten it.
var agentWait = 3 * time.Second

func runCmd(args []string, stderr io.Writer) error {
	fs := newFlagSet("run", "sidecar run -config FILE [flags]", stderr)
	path := fs.String("config", "", "configuration `file` (required); SIGHUP or POST /reload on the admin listener re-reads it")
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
	override := func(c *config.Config) {
		if *level != "" {
			c.Logging.Level = *level
		}
		if *format != "" {
			c.Logging.Format = *format
		}
	}
	cfg, err := loadConfig(*path, override)
	if err != nil {
		return err
	}
	log, err := newLogger(cfg.Logging, stderr)
	if err != nil {
		return err
	}
	// Signals are caught from here on: one that arrives while the sidecar
	// starts is handled as soon as it serves.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	s, err := startSidecar(cfg, *path, override, log)
	if err != nil {
		return err
	}
	for {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				s.reloadSignal()
				continue
			}
			log.Info().Str("signal", sig.String()).Dur("drain", *drain).Msg("shutting down")
			return s.stop(*drain, sigs)
		case err := <-s.failed:
			log.Error().Err(err).Msg("a listener failed; shutting down")
			_ = s.stop(*drain, nil)
			return err
		}
	}
}

// serve runs cfg on its configured listeners until ctx ends; without a
// configuration file there is nothing to reload.
func serve(ctx context.Context, cfg *config.Config, log zerolog.Logger, drain time.Duration) error {
	s, err := startSidecar(cfg, "", nil, log)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return s.stop(drain, nil)
	case err := <-s.failed:
		_ = s.stop(drain, nil)
		return err
	}
}

// stop shuts the sidecar down, letting in-flight requests finish within
// drain; another SIGINT or SIGTERM on sigs ends the drain at once.
func (s *sidecar) stop(drain time.Duration, sigs <-chan os.Signal) error {
	ctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	done := make(chan struct{})
	defer close(done)
	if sigs != nil {
		go func() {
			for {
				select {
				case sig := <-sigs:
					if sig != syscall.SIGHUP {
						s.log.Warn().Str("signal", sig.String()).Msg("second signal: ending the drain now")
						cancel()
						return
					}
				case <-done:
					return
				}
			}
		}()
	}
	err := s.shutdown(ctx)
	if err != nil {
		s.log.Error().Err(err).Msg("stopped before every request finished")
		return err
	}
	s.log.Info().Msg("stopped")
	return nil
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
