package bench

import (
	"net"

	"github.com/valyala/fasthttp"
)

// upstreamBody is what the benchmark upstream answers: small, so that the
// benchmark measures the proxy and not the copying of bodies.
var upstreamBody = []byte("hello from the upstream\n")

// StartUpstream starts the benchmark upstream on a loopback port: a
// fasthttp server answering every request 200 with a small body. It
// returns the address and a function that stops it.
func StartUpstream() (addr string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	s := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			ctx.SetContentType("text/plain")
			ctx.SetBody(upstreamBody)
		},
		Name:                          "bench-upstream",
		NoDefaultDate:                 true,
		DisableHeaderNamesNormalizing: true,
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(ln)
	}()
	return ln.Addr().String(), func() {
		_ = s.Shutdown()
		<-done
	}, nil
}
