package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

const sleepSynopsis = `sidecar sleep DURATION

Waits DURATION (5s, 1m; a bare number is seconds) and exits 0, or at
once on SIGINT or SIGTERM. It is the preStop hook of a container whose
image has no shell (the distroless image): the sidecar keeps serving
while the pod's endpoint removal propagates, before SIGTERM starts the
drain. Kubernetes' own sleep action needs 1.30.`

// maxSleep bounds sleep: longer is a mistake (Kubernetes kills a preStop
// hook at the end of the grace period anyway).
const maxSleep = time.Hour

func sleepCmd(args []string, stderr io.Writer) error {
	fs := newFlagSet("sleep", sleepSynopsis, stderr)
	if err := parseFlags(fs, args, 1); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "sleep: DURATION is required")
		fs.Usage()
		return errUsage
	}
	d, err := time.ParseDuration(fs.Arg(0))
	if err != nil {
		n, nerr := strconv.ParseUint(fs.Arg(0), 10, 32)
		if nerr != nil {
			fmt.Fprintf(stderr, "sleep: %q is not a duration (5s, 1m) or a number of seconds\n", fs.Arg(0))
			fs.Usage()
			return errUsage
		}
		d = time.Duration(n) * time.Second
	}
	if d < 0 || d > maxSleep {
		fmt.Fprintf(stderr, "sleep: %v is not in 0..%v\n", d, maxSleep)
		fs.Usage()
		return errUsage
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-sigs:
	}
	return nil
}
