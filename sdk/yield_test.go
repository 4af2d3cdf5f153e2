package sdk_test

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/internal/rawio"
	"github.com/zentinelproxy/sidecar/internal/yield"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/uds"
)

// TestServeConnYieldsOnWake: an agent confined to one CPU yields when an
// event wakes a connection's reader (Options.NoYieldOnWake), and answers
// the event as before; with NoYieldOnWake, or free to run on several
// CPUs, it never does.
func TestServeConnYieldsOnWake(t *testing.T) {
	for _, tc := range []struct {
		name         string
		oneCPU, keep bool
		yields       bool
	}{
		{"one CPU", true, false, true},
		{"one CPU, NoYieldOnWake", true, true, false},
		{"several CPUs", false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer sdk.SetOneCPU(func() bool { return tc.oneCPU })()
			var yields atomic.Int64
			yield.SetHook(func(owner any) bool {
				_, agentConn := owner.(*rawio.Conn) // the agent's yields on wake-up
				if agentConn {
					yields.Add(1)
				}
				return agentConn
			})
			defer yield.SetHook(nil)
			serveEvents(t, &sdk.Options{NoYieldOnWake: tc.keep}, 4)
			want := tc.yields && runtime.GOOS == "linux" // elsewhere nothing yields
			if n := yields.Load(); (n > 0) != want {
				t.Fatalf("%d yields; want yields: %v", n, want)
			}
		})
	}
}

// serveEvents serves one connection with opts and sends it n events, each
// after the reply to the one before and a pause, so that the agent's
// reader waits for every one.
func serveEvents(t *testing.T, opts *sdk.Options, n int) {
	t.Helper()
	nc, fr := serveProtobuf(t, opts)
	for i := range n {
		time.Sleep(10 * time.Millisecond) // the agent's reader waits
		id := uint64(1 + i)
		body, _ := pbwire.AppendMessage(nil, &protocol.RequestHeaders{RequestID: id, Method: []byte("GET"), URI: []byte("/")})
		frame, _ := uds.AppendRawFrame(nil, protocol.TypeRequestHeaders, body)
		if _, err := nc.Write(frame); err != nil {
			t.Fatal(err)
		}
		if d, _, typ, ok := nextProtobufDecision(t, fr); !ok || d.RequestID != id {
			t.Fatalf("event %d: reply %s for %d; want its Decision", id, typ, d.RequestID)
		}
	}
}
