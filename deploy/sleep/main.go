// Command sleep waits for a duration and exits 0, or at once on SIGINT
// or SIGTERM: the preStop hook of the agent images, which have no shell
// (distroless). In the Kubernetes example it keeps the WAF agent serving
// until the sidecar in front of it has drained.
//
//	sleep 20s
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: sleep DURATION (e.g. 20s)")
		os.Exit(2)
	}
	d, err := time.ParseDuration(os.Args[1])
	if err != nil || d < 0 || d > time.Hour {
		fmt.Fprintf(os.Stderr, "sleep: %q is not a duration in 0..1h\n", os.Args[1])
		os.Exit(2)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	select {
	case <-time.After(d):
	case <-sigs:
	}
}
