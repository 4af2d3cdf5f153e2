package dataplane_test

import (
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/sdk"
)

// fastUpstream is a minimal fasthttp upstream, so that benchmarks measure
// the proxy rather than the backend.
func fastUpstream(b testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	body := []byte("hello from upstream")
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/plain")
		ctx.SetBody(body)
	}}
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Shutdown() })
	return ln.Addr().String()
}

func benchProxy(b *testing.B, withAgent bool, reqBody []byte) {
	benchProxyView(b, withAgent, false, reqBody)
}

// benchProxyView is benchProxy with the agent's view: the forwarded
// request's (the view of agents without client_request) or the client's.
func benchProxyView(b *testing.B, withAgent, clientView bool, reqBody []byte) {
	up := fastUpstream(b)
	data := map[string]any{"Upstream": up, "Chain": ""}
	agents := map[string]agentmux.Agent{}
	if withAgent {
		caps := headersOnly()
		spec := agentSpec{}
		if reqBody != nil {
			caps.HandlesRequestBody = true
			spec.ReqMode = "buffered"
		}
		if clientView {
			spec.Path = serveAgent(b, &agentFuncs{Base: sdk.Base{Caps: caps}})
		} else {
			spec.Path = serveAgentUpstreamView(b, &agentFuncs{Base: sdk.Base{Caps: caps}})
		}
		data["Chain"] = "a"
		data["Agents"] = map[string]agentSpec{"a": spec}
		agents["a"] = udsAgent(b, "a", spec.Path, nil)
	}
	cfg := configText(b, oneAgentConfig, data)
	p := startProxy(b, cfg, agents, nil)
	hc := &fasthttp.HostClient{Addr: p.addr, MaxConns: 256, ReadTimeout: 5 * time.Second}
	b.ReportAllocs()
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req := fasthttp.AcquireRequest()
		resp := fasthttp.AcquireResponse()
		req.SetRequestURI("http://x/bench")
		if reqBody != nil {
			req.Header.SetMethod("POST")
			req.SetBody(reqBody)
		}
		for pb.Next() {
			if err := hc.Do(req, resp); err != nil {
				b.Error(err)
				return
			}
			if resp.StatusCode() != 200 {
				b.Errorf("status %d", resp.StatusCode())
				return
			}
		}
	})
}

// BenchmarkProxyNoAgent is the proxy alone (client, proxy and upstream
// share the machine).
func BenchmarkProxyNoAgent(b *testing.B) { benchProxy(b, false, nil) }

// BenchmarkProxyHeadersAgent adds one headers-only UDS agent that takes
// the forwarded request's view.
func BenchmarkProxyHeadersAgent(b *testing.B) { benchProxy(b, true, nil) }

// BenchmarkProxyHeadersAgentClientRequest is BenchmarkProxyHeadersAgent
// with an agent that negotiated client_request (the client's view).
func BenchmarkProxyHeadersAgentClientRequest(b *testing.B) { benchProxyView(b, true, true, nil) }

// BenchmarkProxyBufferedBody4K adds a 4 KiB request body inspected by
// the agent in buffered mode.
func BenchmarkProxyBufferedBody4K(b *testing.B) {
	benchProxy(b, true, make([]byte, 4096))
}
