// Command sidecar is an HTTP reverse proxy that sits in front of one
// service and shows every request and response to policy agents — over a
// Unix socket, gRPC or connections the agents open themselves — and does
// what they decide: allow, block, redirect, change headers, rewrite bodies.
//
// Usage:
//
//	sidecar demo [-listen 127.0.0.1:8080] [-agent-transport uds|grpc|reverse] [-log-level info]
//	sidecar run -config FILE [-log-level LEVEL] [-log-format json|console] [-drain 10s]
//	sidecar -config FILE ...             (the same as run)
//	sidecar check-config FILE
//	sidecar agent-check -transport uds|grpc|reverse -address ADDR [flags]
//	sidecar sleep DURATION
//	sidecar version
//	sidecar completion bash|zsh|fish
//
// demo starts everything needed to try the sidecar on one machine, without
// network access or root: a built-in upstream service, the example agent of
// examples/demoagent, and the sidecar on an embedded configuration (print
// it with `sidecar demo -print-config`). It prints curl commands to try and
// runs until interrupted:
//
//	go run ./cmd/sidecar demo
//
// run serves the configuration FILE until SIGINT or SIGTERM, then stops
// accepting, lets in-flight requests finish within -drain and closes the
// agents (a second signal ends the drain at once). SIGHUP re-reads FILE:
// routes, upstreams and agents change without dropping a request, and a
// file that does not validate is refused while the running configuration
// keeps serving. SIGUSR1 reopens the access log file at its path (log
// rotation). The admin listener (default 127.0.0.1:9901) serves
// /metrics, /healthz, /readyz, /status and POST /reload. The
// configuration format is described in package config and
// docs/configuration.md, operations in docs/operations.md. run exits 0
// after a clean shutdown, 1 when the configuration is refused, a
// listener fails or a shutdown cut requests off (a second signal, or the
// drain ran out), 2 on a command-line error.
//
// check-config validates FILE as run would: every key, the transport
// options of its agents and the files and directories a start opens
// (TLS and token files, the access log, Unix socket directories). It
// prints OK and a summary, or the error with the key and line it
// concerns and exits 1; warnings (valid but probably wrong settings) go
// to stderr with their key and line and do not fail it.
//
// agent-check connects to an agent written in any language as the sidecar
// would, runs the protocol checks of package internal/agentcheck (and a
// soak and the author's expectations when asked), prints a table or JSON
// and exits 1 when a check fails; see docs/agent-authors.md.
//
// Flags of run:
//
//	-config FILE       configuration file (required)
//	-log-level LEVEL   trace, debug, info, warn or error (default: the file's logging.level)
//	-log-format FMT    json or console (default: the file's logging.format)
//	-drain DURATION    how long in-flight requests may take to finish on shutdown (default 10s)
//
// Flags of demo:
//
//	-listen ADDR                 the sidecar's address (default 127.0.0.1:8080; port 0 picks one)
//	-agent-transport T           how the demo agent connects: uds (default), grpc or reverse
//	-log-level LEVEL             default info; debug logs one line per request
//	-print-config                print the embedded configuration and exit
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	buildinfo "github.com/zentinelproxy/sidecar/internal/version"
)

const usageText = `sidecar: an HTTP reverse proxy that lets policy agents decide on every request.

Usage:
  sidecar demo [-listen 127.0.0.1:8080] [-agent demo|waf] [-agent-transport uds|grpc|reverse] [-log-level info]
        Run a self-contained demo: built-in upstream, example agent, sidecar.
        Prints curl commands to try; stop with Ctrl-C.
  sidecar run -config FILE [-log-level LEVEL] [-log-format json|console] [-drain 10s]
        Serve the configuration in FILE until SIGINT/SIGTERM; SIGHUP reloads it,
        SIGUSR1 reopens the access log file.
        "sidecar -config FILE" is the same.
  sidecar check-config FILE
        Validate FILE as run would; print OK or the error with its key and line (exit 1).
  sidecar agent-check -transport uds|grpc|reverse -address ADDR [-pid PID] [-soak 60s] [-expect FILE] [-json]
        Check an agent in any language against the protocol (exit 1 on FAIL).
  sidecar sleep DURATION
        Wait, then exit 0: a preStop hook for an image without a shell.
  sidecar version
        Print the version, commit, commit date and Go version.
  sidecar completion bash|zsh|fish
        Print the shell completion script.

Run "sidecar COMMAND -h" for the flags of a command.
`

// errUsage marks a command-line error: the usage was printed, exit 2.
var errUsage = errors.New("usage")

func main() {
	os.Exit(sidecarMain(os.Args[1:], os.Stdout, os.Stderr))
}

// sidecarMain runs the command line args and returns the exit code.
func sidecarMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return 2
	}
	cmd, rest := args[0], args[1:]
	if strings.HasPrefix(cmd, "-") {
		switch cmd {
		case "-h", "-help", "--help":
			fmt.Fprint(stdout, usageText)
			return 0
		case "-version", "--version":
			cmd, rest = "version", nil
		default:
			cmd, rest = "run", args
		}
	}
	var err error
	switch cmd {
	case "run":
		err = runCmd(rest, stderr)
	case "check-config":
		err = checkConfigCmd(rest, stdout, stderr)
	case "demo":
		err = demoCmd(rest, stdout, stderr)
	case "agent-check":
		err = agentCheckCmd(rest, stdout, stderr)
	case "sleep":
		err = sleepCmd(rest, stderr)
	case "completion":
		err = completionCmd(rest, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "sidecar", buildinfo.Get())
		return 0
	case "help":
		fmt.Fprint(stdout, usageText)
		return 0
	default:
		fmt.Fprintf(stderr, "sidecar: unknown command %q\n\n%s", cmd, usageText)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	}
	fmt.Fprintln(stderr, "sidecar:", err)
	return 1
}

// version is the version the binary was built with (see package
// internal/version).
func version() string { return buildinfo.Get().Version }

// newFlagSet returns a flag set for a command that prints its usage to
// stderr and returns errors instead of exiting.
func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s\n", synopsis)
		hasFlags := false
		fs.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			fmt.Fprint(stderr, "\nFlags:\n")
			fs.PrintDefaults()
		}
	}
	return fs
}

// oneOf refuses a flag value that is not one of the allowed ones, as a
// usage error: "<cmd>: -<flag> must be a or b, not "x"".
func oneOf(fs *flag.FlagSet, flagName, v string, allowed ...string) error {
	if slices.Contains(allowed, v) {
		return nil
	}
	fmt.Fprintf(fs.Output(), "%s: -%s must be %s, not %q\n", fs.Name(), flagName, strings.Join(allowed, " or "), v)
	fs.Usage()
	return errUsage
}

// parseFlags parses args and rejects extra arguments.
func parseFlags(fs *flag.FlagSet, args []string, maxArgs int) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > maxArgs {
		fmt.Fprintf(fs.Output(), "unexpected argument %q\n", fs.Arg(maxArgs))
		fs.Usage()
		return errUsage
	}
	return nil
}
