// Command allowagent serves the allow-all agent on a Unix socket until
// interrupted:
//
//	go run ./examples/allowagent/cmd/allowagent -socket /tmp/allowagent.sock [-body]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/zentinelproxy/sidecar/examples/allowagent"
	"github.com/zentinelproxy/sidecar/sdk"
)

func main() {
	socket := flag.String("socket", filepath.Join(os.TempDir(), "allowagent.sock"), "Unix socket `path` to listen on")
	body := flag.Bool("body", false, "also ask for request bodies")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Fprintf(os.Stderr, "allowagent: serving on %s\n", *socket)
	if err := sdk.ServeUDS(ctx, *socket, allowagent.New(*body), &sdk.Options{Name: "allowagent"}); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "allowagent:", err)
		os.Exit(1)
	}
}
