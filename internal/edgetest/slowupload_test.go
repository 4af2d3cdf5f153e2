package edgetest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// Slow uploads hold neither an agent's in-flight slots nor a connection
// for ever: a body the agents buffer is read before any agent is asked,
// and a body that falls behind body_min_rate is answered 408.

// slotAgent takes two requests at a time and buffers request bodies; it
// counts the request headers it was shown.
type slotAgent struct {
	sdk.Base
	heads atomic.Int64
}

func (a *slotAgent) OnRequestHeaders(context.Context, *protocol.RequestHeaders, *protocol.Decision) error {
	a.heads.Add(1)
	return nil
}

func newSlotAgent(t *testing.T, dir string) (*slotAgent, string) {
	a := &slotAgent{Base: sdk.Base{Caps: protocol.Capabilities{
		HandlesRequestHeaders: true, HandlesRequestBody: true, MaxConcurrentRequests: 2,
	}}}
	path := agentSocket(dir, "slots")
	testagent.Serve(t, path, a)
	return a, "  - name: slots\n    transport: uds\n    address: " + path +
		"\n    failure_mode: closed\n    timeouts: {message: 2s, request: 5s}\n    request_body: {mode: buffered, limit: 1MiB}\n"
}

func okUpstream(t *testing.T) *scriptedUpstream {
	return startScripted(t, func(c net.Conn, _, _ string) bool {
		_, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return err == nil
	})
}

// trickle starts an upload of 256 KiB sent at once, then one byte every
// 500 ms (its Content-Length counts 64 more) until stop is closed; the
// status the sidecar answers comes on the returned channel (0: none).
func trickle(t *testing.T, addr string, stop <-chan struct{}) <-chan int {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(2 * longWait))
	const burst = 256 << 10
	head := fmt.Sprintf("POST /upload HTTP/1.1\r\nHost: public.example\r\nContent-Length: %d\r\n\r\n", burst+64)
	if _, err := io.WriteString(c, head+strings.Repeat("u", burst)); err != nil {
		t.Fatal(err)
	}
	go func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for i := 0; i < 64; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if _, err := c.Write([]byte("u")); err != nil {
				return
			}
		}
	}()
	status := make(chan int, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: "POST"})
		if err != nil {
			status <- 0
			return
		}
		resp.Body.Close()
		status <- resp.StatusCode
	}()
	return status
}

// TestSlowUploadsHoldNoAgentSlot: an agent takes two requests at a time
// and buffers bodies; two uploads trickle. A GET sent meanwhile is served:
// the uploads, still being read, hold none of the agent's slots.
func TestSlowUploadsHoldNoAgentSlot(t *testing.T) {
	dir := testutil.SocketDir(t)
	up := okUpstream(t)
	agent, agents := newSlotAgent(t, dir)
	sc := startSidecar(t, dir, plainConfig(up.addr, "", agents, "slots"), "")
	waitReady(t, sc)
	stop := make(chan struct{})
	defer close(stop)
	trickle(t, sc.addr, stop)
	trickle(t, sc.addr, stop)
	time.Sleep(700 * time.Millisecond) // both trickling
	start := time.Now()
	resp, err := (&http.Client{Timeout: longWait}).Get("http://" + sc.addr + "/page")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	t.Logf("GET during two trickling uploads: %d after %v", resp.StatusCode, time.Since(start).Round(time.Millisecond))
	if resp.StatusCode != 200 {
		t.Fatalf("GET during two slow uploads: %d, want 200", resp.StatusCode)
	}
	if n := agent.heads.Load(); n != 1 {
		t.Errorf("the agent saw %d request heads, want 1 (the GET): an upload still being read was shown", n)
	}
}

// TestSlowUploadBelowMinRate: a body that falls behind body_min_rate by
// more than body_timeout gets 408 (counted), through a buffering agent
// (read before the agent is asked) and straight to the upstream (no
// agent: the body streams to the upstream as it comes).
func TestSlowUploadBelowMinRate(t *testing.T) {
	for _, withAgent := range []bool{true, false} {
		t.Run(fmt.Sprintf("agent=%v", withAgent), func(t *testing.T) {
			dir := testutil.SocketDir(t)
			up := okUpstream(t)
			_, agents := newSlotAgent(t, dir)
			route := "slots"
			if !withAgent {
				agents, route = "", ""
			}
			// 256 KiB at once is 4 s of credit at 64 KiB/s, capped at
			// body_timeout (2 s); two bytes a second then earn ~nothing.
			lst := "    body_timeout: 2s\n    body_min_rate: 64KiB"
			sc := startSidecar(t, dir, plainConfig(up.addr, lst, agents, route), "")
			if withAgent {
				waitReady(t, sc)
			}
			stop := make(chan struct{})
			defer close(stop)
			select {
			case st := <-trickle(t, sc.addr, stop):
				if st != 408 {
					t.Fatalf("a body trickling below body_min_rate got %d, want 408", st)
				}
			case <-time.After(longWait):
				t.Fatal("a body trickling below body_min_rate was never answered")
			}
			if v := sc.counter(t, "request_body_too_slow"); v != 1 {
				t.Errorf("request_body_too_slow %v, want 1", v)
			}
		})
	}
}
