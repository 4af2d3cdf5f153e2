package grpcclient_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/mem"

	"github.com/zentinelproxy/sidecar/internal/conformance"
	"github.com/zentinelproxy/sidecar/internal/grpcclient"
	"github.com/zentinelproxy/sidecar/internal/grpcwire"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/sdk/grpcsdk"
)

// benchHeaders is the request of every transport's benchmarks.
func benchHeaders() *protocol.RequestHeaders { return conformance.TypicalRequestHeaders() }

var benchCaps = protocol.Capabilities{HandlesRequestHeaders: true, SupportsCancellation: true}

func benchClient(b *testing.B, conns int) *grpcclient.Client {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = grpcsdk.Serve(ctx, ln, &sdk.Base{Caps: benchCaps}, nil)
	}()
	cfg := grpcclient.DefaultConfig("bench", ln.Addr().String())
	cfg.Conns = conns
	c, err := grpcclient.NewClient(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = c.Close()
		cancel()
		<-done
	})
	if err := c.WaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	for c.Len() < conns {
		if err := c.WaitReady(ctx); err != nil {
			b.Fatal(err)
		}
	}
	return c
}

// BenchmarkGRPCRoundTrip1 is one request in flight over loopback TCP:
// RequestHeaders out, Decision back, through the proxy-side stack, gRPC
// and the Go SDK.
func BenchmarkGRPCRoundTrip1(b *testing.B) { conformance.BenchRoundTrips(b, benchClient(b, 1), 1) }

// BenchmarkGRPCRoundTrip64 keeps 64 requests in flight on one stream and
// reports decisions per second.
func BenchmarkGRPCRoundTrip64(b *testing.B) { conformance.BenchRoundTrips(b, benchClient(b, 1), 64) }

// BenchmarkGRPCRoundTrip64Conns2 spreads 64 in flight over two connections.
func BenchmarkGRPCRoundTrip64Conns2(b *testing.B) {
	conformance.BenchRoundTrips(b, benchClient(b, 2), 64)
}

// The proxy-side benchmarks run the agent (the Go SDK, as above) in a child
// process, the test binary started again with agentChildEnv set, so that
// allocs/op and B/op count the proxy's side alone: agentmux, grpcclient,
// grpcwire and grpc-go's client, including its transport's reader and
// writer goroutines; nothing of the agent or of grpc-go's server.
const agentChildEnv = "GRPCCLIENT_BENCH_AGENT_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(agentChildEnv) != "" {
		serveChildAgent()
		return
	}
	os.Exit(m.Run())
}

// serveChildAgent serves the benchmark agent on loopback, prints its
// address and serves until its standard input closes (the parent died or
// is done with it).
func serveChildAgent() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	fmt.Println(ln.Addr().String())
	_ = grpcsdk.Serve(ctx, ln, &sdk.Base{Caps: benchCaps}, nil)
}

// proxySideClient connects a client to an agent in a child process.
func proxySideClient(b *testing.B, conns int) *grpcclient.Client {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), agentChildEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatal(err)
	}
	cfg := grpcclient.DefaultConfig("bench", strings.TrimSpace(addr))
	cfg.Conns = conns
	c, err := grpcclient.NewClient(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for c.Len() < conns {
		if err := c.WaitReady(ctx); err != nil {
			b.Fatal(err)
		}
	}
	return c
}

// BenchmarkGRPCRoundTrip1ProxySide is BenchmarkGRPCRoundTrip1 with the
// agent in another process: its allocs/op are the proxy side's per
// decision.
func BenchmarkGRPCRoundTrip1ProxySide(b *testing.B) {
	conformance.BenchRoundTrips(b, proxySideClient(b, 1), 1)
}

// BenchmarkGRPCRoundTrip64ProxySide is BenchmarkGRPCRoundTrip64 with the
// agent in another process.
func BenchmarkGRPCRoundTrip64ProxySide(b *testing.B) {
	conformance.BenchRoundTrips(b, proxySideClient(b, 1), 64)
}

// BenchmarkWireRequestHeaders encodes and decodes the typical RequestHeaders
// with the stream codec (no gRPC): the per-event protobuf cost.
func BenchmarkWireRequestHeaders(b *testing.B) {
	m := benchHeaders()
	m.RequestID = 42
	var buf []byte
	var f grpcwire.Frame
	var out protocol.RequestHeaders
	codec := grpcwire.Codec()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		var err error
		buf, err = grpcwire.AppendMessage(buf[:0], m)
		if err != nil {
			b.Fatal(err)
		}
		// The codec copies the message once, as gRPC hands it over.
		if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(buf)}, &f); err != nil {
			b.Fatal(err)
		}
		if err := f.DecodeRequestHeaders(&out); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(buf)))
}
