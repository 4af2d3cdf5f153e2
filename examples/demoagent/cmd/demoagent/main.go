// Command demoagent serves the demo agent (package demoagent) on a Unix
// socket until interrupted:
//
//	go run ./examples/demoagent/cmd/demoagent -socket /tmp/demoagent.sock
//
// Point an agent of the sidecar's config at the same socket path.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/examples/demoagent"
	"github.com/zentinelproxy/sidecar/sdk"
)

func main() {
	cfg := demoagent.DefaultConfig()
	socket := flag.String("socket", filepath.Join(os.TempDir(), "demoagent.sock"), "Unix socket `path` to listen on")
	flag.StringVar(&cfg.BlockPrefix, "block", cfg.BlockPrefix, "block requests under this `path` (empty: off)")
	flag.StringVar(&cfg.RedirectFrom, "redirect-from", cfg.RedirectFrom, "redirect requests under this `path` (empty: off)")
	flag.StringVar(&cfg.RedirectTo, "redirect-to", cfg.RedirectTo, "to the same path under this `path`")
	flag.StringVar(&cfg.Redact, "redact", cfg.Redact, "mask this `word` in text response bodies (empty: off)")
	flag.Parse()

	log := zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: "15:04:05"}).With().Timestamp().Str("agent", "demoagent").Logger()
	h, err := demoagent.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log.Info().Str("socket", *socket).Msg("serving")
	if err := sdk.ServeUDS(ctx, *socket, h, &sdk.Options{Name: "demoagent", Logger: &log}); err != nil && ctx.Err() == nil {
		log.Error().Err(err).Msg("serve")
		os.Exit(1)
	}
}
