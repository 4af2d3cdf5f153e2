// Command upstream is the peer benchmark's upstream: a fasthttp server that
// answers every request 200 with a short body and counts what reached it,
// so that the harness can check that an agent's header arrived.
//
//	upstream -addr 127.0.0.1:9000
//
// GET /__peers/stats (not counted) answers "total=N marked=M admin=A":
// requests seen, those carrying X-Agent-Processed: true, and those for
// /admin (a proxy that does the job never lets one through).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/bench/peers/internal/job"
)

var (
	statsPath = []byte("/__peers/stats")
	body      = []byte("hello from upstream\n")
	headerVal = []byte(job.Value)
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9000", "TCP `address` to listen on")
	flag.Parse()

	var total, marked, admin atomic.Int64
	srv := &fasthttp.Server{
		Name:                          "upstream",
		NoDefaultDate:                 true,
		DisableHeaderNamesNormalizing: false,
		Handler: func(ctx *fasthttp.RequestCtx) {
			path := ctx.Path()
			if bytes.Equal(path, statsPath) {
				fmt.Fprintf(ctx, "total=%d marked=%d admin=%d\n", total.Load(), marked.Load(), admin.Load())
				return
			}
			total.Add(1)
			if bytes.Equal(ctx.Request.Header.Peek(job.Header), headerVal) {
				marked.Add(1)
			}
			if job.Denied(ctx.RequestURI()) {
				admin.Add(1)
			}
			ctx.SetContentType("text/plain")
			ctx.SetBody(body)
		},
	}
	go func() {
		c := make(chan os.Signal, 1)
		signal.Notify(c, os.Interrupt, syscall.SIGTERM)
		<-c
		os.Exit(0)
	}()
	if err := srv.ListenAndServe(*addr); err != nil {
		fmt.Fprintln(os.Stderr, "upstream:", err)
		os.Exit(1)
	}
}
