package extproc_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/conformance"
	"github.com/zentinelproxy/sidecar/internal/extproc"
	"github.com/zentinelproxy/sidecar/internal/grpcclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/sdk/grpcsdk"
)

// benchExtProc is a client of a processor that answers CONTINUE, with only
// the request headers sent: one exchange is one stream, opened, one
// request_headers message each way, half-closed.
func benchExtProc(b *testing.B, conns int) agentmux.Agent {
	p, addr, _ := startProcessor(b, continueAll, nil)
	p.quiet = true
	c := newClient(b, addr, func(cfg *extproc.Config) {
		cfg.Conns = conns
		cfg.Mode.ResponseHeader = extprocfilter.ProcessingMode_SKIP
	})
	ctx := context.Background()
	for c.Len() < conns {
		if err := c.WaitReady(ctx); err != nil {
			b.Fatal(err)
		}
	}
	return c
}

// benchGRPC is the baseline: the same exchange with the sidecar's own
// gRPC transport and the Go SDK, in the same process and run.
func benchGRPC(b *testing.B) agentmux.Agent {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = grpcsdk.Serve(ctx, ln, &sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true, SupportsCancellation: true}}, nil)
	}()
	c, err := grpcclient.NewClient(grpcclient.DefaultConfig("bench", ln.Addr().String()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close(); cancel(); <-done })
	if err := c.WaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	return c
}

// BenchmarkExtProcRoundTrip1: one request in flight over loopback TCP,
// request headers to an ext_proc processor and its answer back.
func BenchmarkExtProcRoundTrip1(b *testing.B) { conformance.BenchRoundTrips(b, benchExtProc(b, 1), 1) }

// BenchmarkExtProcRoundTrip64: 64 requests (64 streams) in flight on one
// HTTP/2 connection.
func BenchmarkExtProcRoundTrip64(b *testing.B) {
	conformance.BenchRoundTrips(b, benchExtProc(b, 1), 64)
}

// BenchmarkExtProcRoundTrip64Conns2 spreads the 64 streams over two
// connections.
func BenchmarkExtProcRoundTrip64Conns2(b *testing.B) {
	conformance.BenchRoundTrips(b, benchExtProc(b, 2), 64)
}

// BenchmarkGRPCBaselineRoundTrip1 is BenchmarkExtProcRoundTrip1 over the
// sidecar's gRPC transport (one long-lived stream), for the ratio.
func BenchmarkGRPCBaselineRoundTrip1(b *testing.B) { conformance.BenchRoundTrips(b, benchGRPC(b), 1) }

// BenchmarkGRPCBaselineRoundTrip64 is BenchmarkExtProcRoundTrip64 over the
// sidecar's gRPC transport.
func BenchmarkGRPCBaselineRoundTrip64(b *testing.B) { conformance.BenchRoundTrips(b, benchGRPC(b), 64) }

// The conversation benchmarks compare the sidecar's ext_proc client with
// a bare grpc-go client holding the same conversation with the same
// processor: one Process stream per request, request_headers and
// response_headers each way, half-close, the server's end of stream. The
// processor runs in a child process (this test binary, see
// serveBenchProcessor), so the CPU time the benchmark measures is the
// client's alone.

// benchProcessorEnv makes the test binary serve a CONTINUE processor on
// loopback, print its address and exit when its standard input closes.
const benchProcessorEnv = "EXTPROC_BENCH_PROCESSOR"

// serveBenchProcessor is the child's main: a processor on
// go-control-plane's server types answering every message with CONTINUE.
func serveBenchProcessor() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	srv := grpc.NewServer()
	p := &processor{handle: continueAll, quiet: true}
	extprocsvc.RegisterExternalProcessorServer(srv, p)
	go func() { _ = srv.Serve(ln) }()
	fmt.Println(ln.Addr().String())
	_, _ = io.Copy(io.Discard, os.Stdin) // the parent is gone
	srv.Stop()
	os.Exit(0)
}

// startBenchProcessor starts the child processor and returns its address.
func startBenchProcessor(b *testing.B) string {
	b.Helper()
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), benchProcessorEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		b.Fatalf("processor: %v", err)
	}
	return strings.TrimSpace(line)
}

// benchResponseHeaders is the response of the conversation benchmarks.
func benchResponseHeaders() *protocol.ResponseHeaders {
	m := &protocol.ResponseHeaders{StatusCode: 200, HasBody: true}
	for _, h := range [][2]string{
		{"content-type", "application/json"}, {"content-length", "512"}, {"cache-control", "private, max-age=0"},
		{"date", "Sat, 21 Nov 2026 10:00:00 GMT"}, {"server", "app"}, {"vary", "Accept-Encoding"},
	} {
		m.Headers = m.Headers.Add([]byte(h[0]), []byte(h[1]))
	}
	return m
}

// conversation runs one request's conversation on one side.
type conversation func() error

// sidecarConversation drives the sidecar's client through its normal
// path: Begin, RequestHeaders, ResponseHeaders, Finish.
func sidecarConversation(b *testing.B, addr string) conversation {
	c, err := extproc.NewClient(func() extproc.Config {
		cfg := extproc.DefaultConfig("bench", addr)
		cfg.MessageTimeout = 5 * time.Second
		return cfg
	}())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	// The exchange writes its request id into the events: one pair per
	// conversation running at once.
	type events struct {
		req  *protocol.RequestHeaders
		resp *protocol.ResponseHeaders
	}
	pool := sync.Pool{New: func() any {
		return &events{conformance.TypicalRequestHeaders(), benchResponseHeaders()}
	}}
	return func() error {
		ev := pool.Get().(*events)
		defer pool.Put(ev)
		// Every wait has a deadline, as the dataplane's (the agent's
		// request budget) has.
		w := agentmux.Wait{Deadline: time.Now().Add(5 * time.Second)}
		ex, err := c.Begin(w)
		if err != nil {
			return err
		}
		defer ex.Finish()
		if _, err := ex.RequestHeaders(w, ev.req); err != nil {
			return err
		}
		_, err = ex.ResponseHeaders(w, ev.resp)
		return err
	}
}

// bareConversation is the baseline: grpc-go and go-control-plane's client
// alone, the messages built once, one stream per request. It dials with
// the sidecar's own dial options (fixed flow-control windows, no retry):
// with grpc-go's defaults its bandwidth-estimator pings would cost it
// more than the sidecar pays, and the comparison is of what the sidecar
// adds to the same gRPC conversation.
func bareConversation(b *testing.B, addr string) conversation {
	opts, err := grpcclient.DialOptions(&grpcclient.TLSConfig{}, 10<<20, 2*time.Second, time.Second, 5*time.Second, "bench")
	if err != nil {
		b.Fatal(err)
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cc.Close() })
	cli := extprocsvc.NewExternalProcessorClient(cc)
	hm := func(pseudo [][2]string, hs protocol.Headers) *corev3.HeaderMap {
		m := &corev3.HeaderMap{}
		for _, p := range pseudo {
			m.Headers = append(m.Headers, &corev3.HeaderValue{Key: p[0], RawValue: []byte(p[1])})
		}
		for _, h := range hs {
			m.Headers = append(m.Headers, &corev3.HeaderValue{Key: string(h.Name), RawValue: h.Value})
		}
		return m
	}
	rq, rs := conformance.TypicalRequestHeaders(), benchResponseHeaders()
	reqMsg := &extprocsvc.ProcessingRequest{Request: &extprocsvc.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocsvc.HttpHeaders{
		Headers:     hm([][2]string{{":method", "GET"}, {":path", string(rq.URI)}, {":authority", "example.com"}, {":scheme", "http"}}, rq.Headers),
		EndOfStream: true,
	}}}
	respMsg := &extprocsvc.ProcessingRequest{Request: &extprocsvc.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocsvc.HttpHeaders{
		Headers: hm([][2]string{{":status", "200"}}, rs.Headers),
	}}}
	return func() error {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		s, err := cli.Process(ctx)
		if err != nil {
			return err
		}
		for _, m := range []*extprocsvc.ProcessingRequest{reqMsg, respMsg} {
			if err := s.Send(m); err != nil {
				return err
			}
			if _, err := s.Recv(); err != nil {
				return err
			}
		}
		if err := s.CloseSend(); err != nil {
			return err
		}
		if _, err := s.Recv(); err != io.EOF {
			return fmt.Errorf("end of stream: %v", err)
		}
		return nil
	}
}

// runConversations runs n conversations and returns the process CPU
// time they took.
func runConversations(b *testing.B, conv conversation, n int) time.Duration {
	return runConcurrent(b, conv, n, 1)
}

// runConcurrent runs n conversations, c at a time, and returns the
// process CPU time they took.
func runConcurrent(b *testing.B, conv conversation, n, c int) time.Duration {
	cpu0 := conformance.ProcessCPU()
	if c == 1 {
		for i := 0; i < n; i++ {
			if err := conv(); err != nil {
				b.Fatal(err)
			}
		}
		return conformance.ProcessCPU() - cpu0
	}
	var left atomic.Int64
	left.Store(int64(n))
	errs := make(chan error, c)
	for range c {
		go func() {
			for left.Add(-1) >= 0 {
				if err := conv(); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range c {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	return conformance.ProcessCPU() - cpu0
}

// BenchmarkExtProcConversation measures one side per sub-benchmark:
// allocations and CPU time (cpu-µs/op) per request's conversation.
func BenchmarkExtProcConversation(b *testing.B) {
	addr := startBenchProcessor(b)
	for _, side := range []struct {
		name string
		make func(*testing.B, string) conversation
	}{{"sidecar", sidecarConversation}, {"bare", bareConversation}} {
		b.Run(side.name, func(b *testing.B) {
			conv := side.make(b, addr)
			runConversations(b, conv, 200) // warm the connection and pools
			b.ReportAllocs()
			b.ResetTimer()
			cpu := runConversations(b, conv, b.N)
			b.StopTimer()
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// BenchmarkExtProcCPURatio alternates the two sides in rounds within one
// run, so that both see the same load on a shared machine, and reports
// each side's CPU time per request and the ratio sidecar/bare: over the
// whole run (ratio) and its lowest and highest round.
func BenchmarkExtProcCPURatio(b *testing.B) { benchCPURatio(b, 1) }

// BenchmarkExtProcCPURatio64 is BenchmarkExtProcCPURatio with 64
// conversations at a time on each side (one connection), as a busy proxy
// holds them.
func BenchmarkExtProcCPURatio64(b *testing.B) { benchCPURatio(b, 64) }

func benchCPURatio(b *testing.B, conc int) {
	addr := startBenchProcessor(b)
	side, bare := sidecarConversation(b, addr), bareConversation(b, addr)
	runConcurrent(b, side, 200*conc, conc)
	runConcurrent(b, bare, 200*conc, conc)
	round := max(500, 100*conc)
	var cs, cb time.Duration
	lo, hi := math.Inf(1), 0.0
	b.ResetTimer()
	for left := b.N; left > 0; left -= round {
		n := min(left, round)
		s := runConcurrent(b, side, n, conc)
		r := runConcurrent(b, bare, n, conc)
		cs, cb = cs+s, cb+r
		if r > 0 && n == round {
			x := float64(s) / float64(r)
			lo, hi = min(lo, x), max(hi, x)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(cs.Microseconds())/float64(b.N), "sidecar-cpu-µs/req")
	b.ReportMetric(float64(cb.Microseconds())/float64(b.N), "bare-cpu-µs/req")
	if cb > 0 {
		b.ReportMetric(float64(cs)/float64(cb), "ratio")
	}
	if hi > 0 {
		b.ReportMetric(lo, "ratio-min")
		b.ReportMetric(hi, "ratio-max")
	}
}
