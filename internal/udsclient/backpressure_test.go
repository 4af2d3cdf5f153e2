package udsclient_test

import (
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

// dialLink connects a bare link and session to the agent at path (no
// reconnects) over a socket whose kernel send buffer is as small as the
// kernel allows (a few KiB), serving it until the test ends.
func dialLink(t *testing.T, path string, cfg udsclient.LinkConfig, messageTimeout time.Duration) (*udsclient.Link, *agentmux.Session) {
	t.Helper()
	nc, err := net.DialTimeout("unix", path, hangGuard)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.(*net.UnixConn).SetWriteBuffer(4096); err != nil {
		t.Fatal(err)
	}
	fr, caps, err := udsclient.ClientHandshake(nc, "test", hangGuard)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Reader = fr
	link := udsclient.NewLink(nc, cfg)
	sess := agentmux.NewSession(link, caps, agentmux.SessionConfig{Name: "test-agent", MaxInFlight: 64, MaxQueue: 64, MessageTimeout: messageTimeout})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = link.Serve(sess)
	}()
	t.Cleanup(func() {
		_ = link.Close()
		<-done
	})
	return link, sess
}

// TestReadLoopNeverWritesToBackedUpAgent: an agent that stops reading
// while it floods the proxy with Pings (every one of which wants a Pong:
// some 700 KiB of them, against a socket buffer of a few KiB and a cap of
// 64 KiB) fills the proxy's socket buffer and then the link's pending
// bytes. The
// read loop must go on reading regardless: Pongs that find no room are
// dropped, replies to requests in flight are still delivered, pending
// bytes never pass the cap, an event that finds no room waits and fails
// at its own deadline, and one without a deadline is released once the
// agent reads again.
func TestReadLoopNeverWritesToBackedUpAgent(t *testing.T) {
	path := testutil.SocketPath(t)
	const inFlight = 8
	const limit = 64 << 10
	const floodBatches = 64 // of 256 Pings
	ids := make(chan uint64, inFlight)
	resume := make(chan struct{})
	var pingsSent atomic.Int64
	floodErr := make(chan error, 1)
	quit := make(chan struct{})
	testagent.Raw(t, path, allCaps, func(nc net.Conn, fr *uds.FrameReader) {
		for n := 0; n < inFlight; {
			typ, p, err := fr.Next()
			if err != nil {
				return
			}
			if typ == protocol.TypeRequestHeaders {
				id, _ := protocol.PeekRequestID(p)
				ids <- id // buffered for inFlight
				n++
			}
		}
		// Stop reading; flood Pings.
		var batch []byte
		for i := 0; i < 256; i++ {
			batch, _ = uds.AppendFrame(batch, &protocol.Ping{Sequence: uint64(i), TimestampMs: 1})
		}
		_ = nc.SetWriteDeadline(time.Now().Add(hangGuard))
		for i := 0; i < floodBatches; i++ {
			if _, err := nc.Write(batch); err != nil {
				floodErr <- err // the proxy stopped reading
				return
			}
			pingsSent.Add(256)
		}
		// The replies, still without reading anything.
		var replies []byte
		for i := 0; i < inFlight; i++ {
			replies, _ = uds.AppendFrame(replies, &protocol.Decision{RequestID: <-ids})
		}
		if _, err := nc.Write(replies); err != nil {
			floodErr <- err
			return
		}
		select {
		case <-resume:
		case <-quit:
			return
		}
		_ = nc.SetWriteDeadline(time.Time{})
		for {
			typ, p, err := fr.Next()
			if err != nil {
				return
			}
			if typ == protocol.TypeRequestHeaders {
				id, _ := protocol.PeekRequestID(p)
				if uds.WriteFrame(nc, &protocol.Decision{RequestID: id}) != nil {
					return
				}
			}
		}
	})
	t.Cleanup(func() { close(quit) }) // before rawAgent's: lets the agent return
	link, sess := dialLink(t, path, udsclient.LinkConfig{
		Name:            "test-agent",
		MaxPendingBytes: limit,
		WriteTimeout:    time.Minute, // only the cap may bound the writer here
	}, time.Minute)

	results := make(chan error, inFlight)
	for i := 0; i < inFlight; i++ {
		go func() {
			ex, err := sess.Begin(agentmux.Wait{})
			if err != nil {
				results <- err
				return
			}
			defer ex.Finish()
			_, err = ex.RequestHeaders(agentmux.Wait{}, headers())
			results <- err
		}()
	}
	for i := 0; i < inFlight; i++ {
		select {
		case err := <-results:
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
		case err := <-floodErr:
			t.Fatalf("the agent could not write (the proxy stopped reading): %v", err)
		case <-time.After(hangGuard):
			t.Fatalf("only %d of %d replies delivered: the read loop stopped reading", i, inFlight)
		}
	}
	st := link.Stats()
	if pings := uint64(pingsSent.Load()); pings != floodBatches*256 || st.FramesIn < pings+inFlight {
		t.Fatalf("frames in %d, want %d pings + %d replies", st.FramesIn, floodBatches*256, inFlight)
	}
	if st.Writer.ControlDropped == 0 {
		t.Fatalf("no Pong dropped: the connection never backed up (%+v)", st.Writer)
	}
	if st.Writer.PendingHigh > limit || st.Writer.Limit != limit {
		t.Fatalf("pending peaked at %d bytes, cap %d (limit %d)", st.Writer.PendingHigh, limit, st.Writer.Limit)
	}

	// An event that finds no room waits for it, and gives up at its deadline.
	ex, err := sess.Begin(agentmux.Wait{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = ex.RequestHeaders(agentmux.Wait{Deadline: time.Now().Add(50 * time.Millisecond)}, headers())
	ex.Finish()
	if !errors.Is(err, agentmux.ErrAgentTimeout) {
		t.Fatalf("event on a backed-up connection: %v, want ErrAgentTimeout", err)
	}
	if w := link.Stats().Writer; w.Waits == 0 {
		t.Fatalf("the event did not wait for room: %+v", w)
	}
	// One without a deadline waits until the agent reads again.
	waits := link.Stats().Writer.Waits
	released := make(chan error, 1)
	go func() {
		ex, err := sess.Begin(agentmux.Wait{})
		if err != nil {
			released <- err
			return
		}
		defer ex.Finish()
		_, err = ex.RequestHeaders(agentmux.Wait{}, headers())
		released <- err
	}()
	testutil.WaitFor(t, "the event waiting for room", func() bool { return link.Stats().Writer.Waits > waits })
	select {
	case err := <-released:
		t.Fatalf("event on a backed-up connection returned before the agent read: %v", err)
	default:
	}
	close(resume)
	select {
	case err := <-released:
		if err != nil {
			t.Fatalf("event released by the drain: %v", err)
		}
	case <-time.After(hangGuard):
		t.Fatal("event not released after the agent read again")
	}
	if w := link.Stats().Writer; w.PendingHigh > limit {
		t.Fatalf("pending peaked at %d bytes, cap %d", w.PendingHigh, limit)
	}
	if sess.Err() != nil {
		t.Fatalf("session failed: %v", sess.Err())
	}
	// The waits reach the session's (and so the agent's) counters.
	if ss := sess.Stats(); ss.SendWaits == 0 || ss.SendWaits != link.Stats().Writer.Waits || ss.ControlDropped != link.Stats().Writer.ControlDropped {
		t.Fatalf("session stats %+v, writer %+v", ss, link.Stats().Writer)
	}
	// So do the writes and the frames they carried (the flood above
	// queued many Pongs per write).
	if ss, w := sess.Stats(), link.Stats().Writer; ss.Writes == 0 || ss.Writes != w.Batches || ss.FramesWritten != w.Frames || ss.FramesWritten <= ss.Writes {
		t.Fatalf("session writes %d frames %d, writer batches %d frames %d", ss.Writes, ss.FramesWritten, w.Batches, w.Frames)
	}
	st = link.Stats()
	t.Logf("pings %d, frames in %d, pongs sent %d, writer %+v", pingsSent.Load(), st.FramesIn, st.PongsSent, st.Writer)
}
