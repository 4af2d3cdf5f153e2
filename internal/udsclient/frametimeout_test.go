package udsclient_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

// stalledFrame is the start of a frame announcing 1 MiB: its header and
// 100 bytes of payload, after which the sender stalls.
func stalledFrame() []byte {
	b := binary.BigEndian.AppendUint32(nil, 1<<20)
	b = append(b, byte(protocol.TypeDecision))
	return append(b, bytes.Repeat([]byte(" "), 100)...)
}

// stallingAgent is a raw agent whose first connection, once it holds want
// requests, sends a stalled frame and then reads on without answering;
// later connections answer every request.
func stallingAgent(t testing.TB, path string, want int) (stalled <-chan struct{}) {
	ch := make(chan struct{})
	var conn atomic.Int64
	testagent.Raw(t, path, allCaps, func(nc net.Conn, fr *uds.FrameReader) {
		first := conn.Add(1) == 1
		held := 0
		for {
			p, ok := testagent.NextHeaders(fr)
			if !ok {
				return
			}
			if !first {
				id, _ := protocol.PeekRequestID(p)
				_ = uds.WriteFrame(nc, &protocol.Decision{RequestID: id})
				continue
			}
			if held++; held == want {
				if _, err := nc.Write(stalledFrame()); err != nil {
					return
				}
				close(ch)
			}
		}
	})
	return ch
}

// TestStalledFrameFailsRequestsPromptly: an agent that starts a frame and
// stalls loses its connection after the frame timeout, not the ping
// timeout; every request waiting on it fails with a lost connection, the
// stall is counted and the client reconnects.
func TestStalledFrameFailsRequestsPromptly(t *testing.T) {
	path := testutil.SocketPath(t)
	const n = 10
	stalled := stallingAgent(t, path, n)
	var logs testutil.LogBuffer
	c := newClient(t, path, func(cfg *udsclient.Config) {
		cfg.Logger = zerolog.New(&logs).With().Str("agent", cfg.Name).Logger()
		cfg.MessageTimeout = time.Minute
		cfg.FrameTimeout = 300 * time.Millisecond
		cfg.PingInterval = 10 * time.Second
		cfg.PingTimeout = 30 * time.Second
	})
	errc := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			_, err := roundTrip(context.Background(), c, headers())
			errc <- err
		}()
	}
	select {
	case <-stalled:
	case <-time.After(hangGuard):
		t.Fatal("the agent never saw all requests")
	}
	// hangGuard is a third of the ping timeout: only the frame timeout can
	// end these requests in time.
	timeout := time.After(hangGuard)
	for i := 0; i < n; i++ {
		select {
		case err := <-errc:
			if !errors.Is(err, agentmux.ErrAgentConnLost) || !strings.Contains(err.Error(), "stalled mid-frame") {
				t.Fatalf("err = %v, want ErrAgentConnLost naming the stalled frame", err)
			}
		case <-timeout:
			t.Fatalf("%d requests still waiting on a connection stalled mid-frame", n-i)
		}
	}
	// The read loop counts the protocol error before the connection's
	// loss reaches the reconnect loop, which records it as LastError.
	waitCond(t, "the stall counted as a protocol error and recorded", func() bool {
		st := c.Snapshot()
		return st.Protocol == 1 && st.LastError != ""
	})
	if le := c.Snapshot().LastError; !strings.Contains(le, "105 of 1048580 bytes") {
		t.Errorf("last error %q does not say how much of the frame arrived", le)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	for {
		if _, err := roundTrip(ctx, c, headers()); err == nil {
			break
		} else if ctx.Err() != nil {
			t.Fatalf("no reconnect after the stall: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if p := c.Snapshot().Protocol; p != 1 {
		t.Fatalf("protocol errors = %d, want 1", p)
	}
	c.Close()
	if n := strings.Count(logs.String(), "stalled mid-frame; closing connection"); n != 1 {
		t.Errorf("%d warnings about the stalled frame, want 1:\n%s", n, logs.String())
	}
	checkLogKeys(t, logs.String(), "test-agent")
}

// TestStalledFrameLinkStats: the link's own counter and error.
func TestStalledFrameLinkStats(t *testing.T) {
	path := testutil.SocketPath(t)
	stalled := stallingAgent(t, path, 1)
	cfg := udsclient.DefaultConfig("stall", path)
	cfg.FrameTimeout = 300 * time.Millisecond
	cfg.PingInterval = 10 * time.Second
	cfg.PingTimeout = 30 * time.Second
	link, caps, err := udsclient.Dial(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	sess := agentmux.NewSession(link, caps, agentmux.SessionConfig{Name: "stall", MaxInFlight: 8})
	served := make(chan error, 1)
	go func() { served <- link.Serve(sess) }()
	go func() {
		ex, err := sess.Begin(agentmux.Wait{})
		if err == nil {
			_, _ = ex.RequestHeaders(agentmux.Wait{}, headers())
			ex.Finish()
		}
	}()
	<-stalled
	select {
	case err := <-served:
		if !errors.Is(err, uds.ErrUDSFrameTimeout) {
			t.Fatalf("Serve: %v, want ErrUDSFrameTimeout", err)
		}
	case <-time.After(hangGuard):
		_ = link.Close()
		<-served
		t.Fatal("link still serving a connection stalled mid-frame")
	}
	if st := link.Stats(); st.FrameTimeouts != 1 {
		t.Fatalf("stats %+v, want one frame timeout", st)
	}
}

func waitCond(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// connPair is both ends of a real Unix socket connection.
func connPair(t testing.TB) (a, b net.Conn) { return testutil.ConnPair(t, "unix") }

// nextAsync runs fr.Next in a goroutine, so that a reader that never
// returns fails the test instead of hanging it.
func nextAsync(fr *uds.FrameReader) <-chan frameResult {
	ch := make(chan frameResult, 1)
	go func() {
		t, p, err := fr.Next()
		ch <- frameResult{t, append([]byte(nil), p...), err}
	}()
	return ch
}

type frameResult struct {
	t   protocol.MsgType
	p   []byte
	err error
}

func bigPayload(n int) []byte {
	p := bytes.Repeat([]byte("x"), n)
	p[0], p[n-1] = '"', '"'
	return p
}

// TestFrameReaderStallMidFrame: wherever a frame stalls, Next fails with
// ErrUDSFrameTimeout saying how much of it arrived.
func TestFrameReaderStallMidFrame(t *testing.T) {
	small, _ := uds.AppendRawFrame(nil, protocol.TypeDecision, bigPayload(1000))
	big, _ := uds.AppendRawFrame(nil, protocol.TypeDecision, bigPayload(200<<10))
	cases := []struct {
		name  string
		sent  []byte
		where string
	}{
		{"inside the header", small[:3], "3 of 5 header bytes"},
		{"after the header", small[:5], "5 of 1005 bytes"},
		{"inside a small frame", small[:105], "105 of 1005 bytes"},
		{"inside a frame larger than the read buffer", big[:100<<10], "102400 of 204805 bytes"},
		{"after a whole frame, inside the next", append(append([]byte(nil), small...), small[:50]...), "50 of 1005 bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w, r := connPair(t)
			fr := uds.NewFrameReader(r)
			fr.SetFrameTimeout(100 * time.Millisecond)
			if _, err := w.Write(tc.sent); err != nil {
				t.Fatal(err)
			}
			if len(tc.sent) > len(small) && bytes.Equal(tc.sent[:len(small)], small) {
				if _, _, err := fr.Next(); err != nil {
					t.Fatalf("whole frame: %v", err)
				}
			}
			select {
			case res := <-nextAsync(fr):
				if !errors.Is(res.err, uds.ErrUDSFrameTimeout) || !strings.Contains(res.err.Error(), tc.where) {
					t.Fatalf("err = %v, want ErrUDSFrameTimeout with %q", res.err, tc.where)
				}
			case <-time.After(hangGuard):
				r.Close()
				t.Fatal("Next still blocked on a frame stalled mid-way")
			}
		})
	}
}

// TestFrameReaderSlowButInTime: a frame trickling in within the frame
// timeout is read whole (no false positive), and the wait between frames
// has no deadline at all.
func TestFrameReaderSlowButInTime(t *testing.T) {
	for _, tc := range []struct {
		name string
		size int
	}{{"small", 300}, {"larger than the read buffer", 200 << 10}} {
		size := tc.size
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w, r := connPair(t)
			fr := uds.NewFrameReader(r)
			const timeout = time.Second
			fr.SetFrameTimeout(timeout)
			frame, _ := uds.AppendRawFrame(nil, protocol.TypeDecision, bigPayload(size))
			next, _ := uds.AppendRawFrame(nil, protocol.TypePong, []byte(`{"sequence":1}`))
			got := nextAsync(fr)
			// Three parts 100ms apart, the first ending inside the header.
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				parts := [][]byte{frame[:3], frame[3 : len(frame)/2], frame[len(frame)/2:]}
				for i, p := range parts {
					if i > 0 {
						time.Sleep(100 * time.Millisecond)
					}
					if _, err := w.Write(p); err != nil {
						return
					}
				}
			}()
			res := <-got
			wg.Wait()
			if res.err != nil || res.t != protocol.TypeDecision || !bytes.Equal(res.p, frame[5:]) {
				t.Fatalf("trickled frame: type %v, %d bytes, err %v", res.t, len(res.p), res.err)
			}
			// Idle for longer than the frame timeout: no deadline may be
			// left over from the trickled frame.
			got = nextAsync(fr)
			time.Sleep(timeout + timeout/4)
			if _, err := w.Write(next); err != nil {
				t.Fatal(err)
			}
			select {
			case res := <-got:
				if res.err != nil || res.t != protocol.TypePong {
					t.Fatalf("frame after idle time: type %v, err %v", res.t, res.err)
				}
			case <-time.After(hangGuard):
				t.Fatal("frame after idle time never read")
			}
			w.Close()
			if _, _, err := fr.Next(); err != io.EOF {
				t.Fatalf("after close: %v, want io.EOF", err)
			}
		})
	}
}
