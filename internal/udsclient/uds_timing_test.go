package udsclient_test

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/conformance"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/uds"
)

// benchHeaders is the request of every transport's benchmarks.
func benchHeaders() *protocol.RequestHeaders { return conformance.TypicalRequestHeaders() }

type allowHandler struct{ sdk.Base }

func benchClient(b *testing.B, conns int) *udsclient.Client {
	return benchClientJSON(b, conns, false)
}

// benchClientJSON is benchClient, keeping the connection on JSON
// payloads when jsonOnly (by default both ends take protobuf).
func benchClientJSON(b *testing.B, conns int, jsonOnly bool) *udsclient.Client {
	path := testutil.SocketPath(b)
	testagent.Serve(b, path, &allowHandler{sdk.Base{Caps: allCaps}})
	c := newClient(b, path, func(cfg *udsclient.Config) { cfg.Conns, cfg.JSONOnly = conns, jsonOnly })
	for c.Len() < conns {
		time.Sleep(time.Millisecond)
	}
	return c
}

// BenchmarkRoundTrip1 is one request in flight: RequestHeaders out, Decision
// back, through the whole proxy-side stack and the Go SDK.
func BenchmarkRoundTrip1(b *testing.B) { conformance.BenchRoundTrips(b, benchClient(b, 1), 1) }

// BenchmarkRoundTrip64 keeps 64 requests in flight on one connection and
// reports decisions per second.
func BenchmarkRoundTrip64(b *testing.B) { conformance.BenchRoundTrips(b, benchClient(b, 1), 64) }

// BenchmarkRoundTrip1JSON and BenchmarkRoundTrip64JSON are the same on JSON
// payloads (an agent without protobuf_payloads, or payload_encoding: json).
func BenchmarkRoundTrip1JSON(b *testing.B) {
	conformance.BenchRoundTrips(b, benchClientJSON(b, 1, true), 1)
}

func BenchmarkRoundTrip64JSON(b *testing.B) {
	conformance.BenchRoundTrips(b, benchClientJSON(b, 1, true), 64)
}

// BenchmarkRoundTrip64Conns2 spreads them over two connections (the
// measurement behind the default of one).
func BenchmarkRoundTrip64Conns2(b *testing.B) { conformance.BenchRoundTrips(b, benchClient(b, 2), 64) }

// BenchmarkRawPingPong moves the same bytes as BenchmarkRoundTrip1 (a
// RequestHeaders frame out, an allow Decision frame back, protobuf
// payloads) over a bare Unix socket with no framing logic: the floor the
// protocol stack is held to. BenchmarkRawPingPongJSON is the floor of
// BenchmarkRoundTrip1JSON.
func BenchmarkRawPingPong(b *testing.B) { rawPingPong(b, uds.Protobuf) }

func BenchmarkRawPingPongJSON(b *testing.B) { rawPingPong(b, uds.JSON) }

func rawPingPong(b *testing.B, enc uds.Encoding) {
	path := testutil.SocketPath(b)
	req, _ := uds.AppendFrameAs(nil, benchHeaders(), enc)
	resp, _ := uds.AppendFrameAs(nil, &protocol.Decision{RequestID: 1}, enc)
	ln, err := net.Listen("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		buf := make([]byte, len(req))
		for {
			if _, err := io.ReadFull(nc, buf); err != nil {
				return
			}
			if _, err := nc.Write(resp); err != nil {
				return
			}
		}
	}()
	nc, err := net.Dial("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	buf := make([]byte, len(resp))
	b.SetBytes(int64(len(req)))
	b.ReportAllocs()
	cpu0 := conformance.ProcessCPU()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := nc.Write(req); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(nc, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if cpu := conformance.ProcessCPU() - cpu0; cpu > 0 {
		b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
	}
}
