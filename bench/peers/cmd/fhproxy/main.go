// Command fhproxy is the peer benchmark's baseline reverse proxy: a fasthttp
// server whose handler forwards each request with one fasthttp
// HostClient.Do and copies the response back — no routing, no agents, no
// metrics, no header rewriting. It shows what an HTTP/1.1 proxy built on
// the same library as the sidecar costs with nothing else.
//
//	fhproxy -listen 127.0.0.1:8080 -upstream 127.0.0.1:9000
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/valyala/fasthttp"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "TCP `address` to listen on")
	upstream := flag.String("upstream", "127.0.0.1:9000", "upstream `host:port`")
	flag.Parse()

	hc := &fasthttp.HostClient{Addr: *upstream, MaxConns: 1024}
	srv := &fasthttp.Server{
		Name:          "fhproxy",
		NoDefaultDate: true,
		Handler: func(ctx *fasthttp.RequestCtx) {
			req := &ctx.Request
			req.Header.Del("Connection")
			if err := hc.Do(req, &ctx.Response); err != nil {
				ctx.ResetBody()
				ctx.SetStatusCode(fasthttp.StatusBadGateway)
				fmt.Fprintln(ctx, "upstream error:", err)
			}
			ctx.Response.Header.Del("Connection")
		},
	}
	go func() {
		c := make(chan os.Signal, 1)
		signal.Notify(c, os.Interrupt, syscall.SIGTERM)
		<-c
		os.Exit(0)
	}()
	if err := srv.ListenAndServe(*listen); err != nil {
		fmt.Fprintln(os.Stderr, "fhproxy:", err)
		os.Exit(1)
	}
}
