// Command authserver is the peer benchmark's auth service for nginx
// auth_request and Caddy forward_auth: a fasthttp server on a Unix socket
// (or TCP) that decides on the original request's target, which the proxy
// passes in X-Original-URI (nginx) or X-Forwarded-Uri (Caddy).
//
//	authserver -listen unix:/tmp/auth.sock
//
// /admin and below it: 403. Anything else: 200 with X-Agent-Processed: true,
// which the proxy copies onto the upstream request.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/bench/peers/internal/job"
)

var denied = []byte("denied\n")

func main() {
	listen := flag.String("listen", "unix:/tmp/authserver.sock", "`address`: unix:/path or host:port")
	flag.Parse()

	srv := &fasthttp.Server{
		Name:          "authserver",
		NoDefaultDate: true,
		Handler: func(ctx *fasthttp.RequestCtx) {
			target := ctx.Request.Header.Peek("X-Original-URI")
			if len(target) == 0 {
				target = ctx.Request.Header.Peek("X-Forwarded-Uri")
			}
			if len(target) == 0 || job.Denied(target) {
				ctx.SetStatusCode(job.DenyStatus)
				ctx.SetBody(denied)
				return
			}
			ctx.Response.Header.Set(job.Header, job.Value)
		},
	}
	ln, err := listenAddr(*listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "authserver:", err)
		os.Exit(1)
	}
	go func() {
		c := make(chan os.Signal, 1)
		signal.Notify(c, os.Interrupt, syscall.SIGTERM)
		<-c
		ln.Close()
		os.Exit(0)
	}()
	if err := srv.Serve(ln); err != nil {
		fmt.Fprintln(os.Stderr, "authserver:", err)
		os.Exit(1)
	}
}

func listenAddr(a string) (net.Listener, error) {
	if p, ok := strings.CutPrefix(a, "unix:"); ok {
		_ = os.Remove(p)
		ln, err := net.Listen("unix", p)
		if err == nil {
			err = os.Chmod(p, 0o666)
		}
		return ln, err
	}
	return net.Listen("tcp", a)
}
