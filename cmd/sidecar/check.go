package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/supervisor"
)

const checkConfigSynopsis = `sidecar check-config FILE

Validates FILE as run and a reload would, without starting anything:
every key, the transports' options, and the files and directories a
start opens (TLS files, token files, the access log, Unix socket
directories). Prints OK with a summary, or the error with its key and
line and exits 1. Warnings (valid settings that are probably not what
was meant) are printed to stderr, each with its key and line; they do
not fail the check.`

func checkConfigCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("check-config", checkConfigSynopsis, stderr)
	if err := parseFlags(fs, args, 1); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "check-config: FILE is required")
		fs.Usage()
		return errUsage
	}
	path := fs.Arg(0)
	cfg, err := supervisor.Load(path, nil)
	if err != nil {
		if errors.Is(err, config.ErrConfigUnreadable) {
			return err // it names the file
		}
		return fmt.Errorf("%s: %w", path, err)
	}
	warns := supervisor.Warnings(cfg)
	for _, w := range warns {
		fmt.Fprintf(stderr, "warning: %s: %s\n", path, w)
	}
	fmt.Fprintf(stdout, "OK: %s: %d listener(s), %d upstream(s), %d agent(s), %d route(s)",
		path, len(cfg.Listeners), len(cfg.Upstreams), len(cfg.Agents), len(cfg.Routes))
	if len(warns) > 0 {
		fmt.Fprintf(stdout, ", %d warning(s)", len(warns))
	}
	fmt.Fprintln(stdout)
	return nil
}
