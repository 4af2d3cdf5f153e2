package main

import (
	"fmt"
	"io"

	"github.com/zentinelproxy/sidecar/internal/supervisor"
)

func checkConfigCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("check-config", "sidecar check-config FILE", stderr)
	if err := parseFlags(fs, args, 1); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errUsage
	}
	path := fs.Arg(0)
	cfg, err := supervisor.Load(path, nil)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	fmt.Fprintf(stdout, "OK: %s: %d listener(s), %d upstream(s), %d agent(s), %d route(s)\n",
		path, len(cfg.Listeners), len(cfg.Upstreams), len(cfg.Agents), len(cfg.Routes))
	return nil
}
