// Command wafagent serves the example WAF agent on a Unix socket until
// interrupted:
//
//	go run ./examples/wafagent/cmd/wafagent -socket /tmp/wafagent.sock
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/zentinelproxy/sidecar/examples/wafagent"
	"github.com/zentinelproxy/sidecar/sdk"
)

func main() {
	socket := flag.String("socket", filepath.Join(os.TempDir(), "wafagent.sock"), "Unix socket `path` to listen on")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Fprintf(os.Stderr, "wafagent: serving on %s\n", *socket)
	if err := sdk.ServeUDS(ctx, *socket, wafagent.New(), &sdk.Options{Name: "wafagent"}); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "wafagent:", err)
		os.Exit(1)
	}
}
