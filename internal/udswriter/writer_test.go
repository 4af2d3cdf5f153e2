package udswriter

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/yield"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

// hangGuard bounds waits for what must happen; a liveness bound, not a
// speed assertion.
const hangGuard = 10 * time.Second

// socketPair returns the two ends of a real Unix stream connection. The
// writing end's kernel send buffer is as small as the kernel allows, so a
// peer that does not read blocks it after a few KiB.
func socketPair(t *testing.T) (w, r net.Conn) {
	t.Helper()
	w, r = testutil.ConnPair(t, "unix")
	if err := w.(*net.UnixConn).SetWriteBuffer(4096); err != nil {
		t.Fatal(err)
	}
	return w, r
}

func chunk(i int) protocol.Message {
	return (&protocol.BodyChunk{RequestID: 1, ChunkIndex: uint32(i), Data: make([]byte, 2048), TotalSize: -1, Progress: -1}).As(protocol.PhaseRequest)
}

// TestPendingBytesCapped: with the peer not reading, data frames fill the
// connection up to the cap and the next one waits; waits end at their
// deadline or cancellation, control frames never wait (they are dropped
// once the reserve is full), pending bytes never pass the cap, and the
// waiting sender is released, every frame intact and in order, once the
// peer reads.
func TestPendingBytesCapped(t *testing.T) {
	const limit = 32 << 10
	const frames = 100
	nc, peer := socketPair(t)
	w := NewWriter(nc, Config{MaxPendingBytes: limit}, nil)
	defer w.Close()

	sent := make(chan error, 1)
	go func() {
		for i := 0; i < frames; i++ {
			if err := w.SendWait(chunk(i), time.Time{}, nil); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	testutil.WaitFor(t, "a data frame waiting for room", func() bool { return w.Stats().Waiting == 1 })

	if err := w.SendWait(chunk(-1), time.Now().Add(20*time.Millisecond), nil); !errors.Is(err, ErrWaitDeadline) {
		t.Fatalf("with a deadline: %v, want ErrWaitDeadline", err)
	}
	canceled := make(chan struct{})
	close(canceled)
	if err := w.SendWait(chunk(-1), time.Time{}, canceled); !errors.Is(err, ErrWaitCanceled) {
		t.Fatalf("canceled: %v, want ErrWaitCanceled", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := w.SendContext(ctx, chunk(-1)); !errors.Is(err, ErrWaitCanceled) {
		t.Fatalf("context canceled: %v, want ErrWaitCanceled", err)
	}
	// Control frames take the reserve and are then dropped, never waiting.
	pings := 0
	for {
		err := w.Send(&protocol.Ping{Sequence: uint64(pings)})
		if errors.Is(err, ErrBackedUp) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if pings++; pings > limit {
			t.Fatal("control frames never refused on a backed-up connection")
		}
	}
	st := w.Stats()
	if pings == 0 || st.ControlDropped != 1 || st.Pending > limit || st.PendingHigh > limit || st.Waits < 4 {
		t.Fatalf("%d pings queued; stats %+v", pings, st)
	}
	select {
	case err := <-sent:
		t.Fatalf("the sender finished while the peer did not read: %v", err)
	default:
	}

	// The peer reads: the waiting sender is released.
	got := make(chan []protocol.MsgType, 1)
	go func() {
		fr := uds.NewFrameReader(peer)
		var types []protocol.MsgType
		var next uint32
		for len(types) < frames+pings {
			typ, p, err := fr.Next()
			if err != nil {
				break
			}
			if typ == protocol.TypeRequestBodyChunk {
				var c protocol.BodyChunk
				if c.Decode(p) != nil || c.ChunkIndex != next || len(c.Data) != 2048 {
					break
				}
				next++
			}
			types = append(types, typ)
		}
		got <- types
	}()
	select {
	case err := <-sent:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(hangGuard):
		t.Fatal("the waiting sender was not released when the peer read")
	}
	types := <-got
	if len(types) != frames+pings {
		t.Fatalf("peer read %d whole frames in order, want %d", len(types), frames+pings)
	}
	if st := w.Stats(); st.PendingHigh > limit || st.Frames != uint64(frames+pings) {
		t.Fatalf("stats %+v", st)
	}
}

// TestCloseReleasesWaiters: a sender waiting for room fails with ErrClosed
// when the connection closes.
func TestCloseReleasesWaiters(t *testing.T) {
	nc, _ := socketPair(t)
	w := NewWriter(nc, Config{MaxPendingBytes: 8 << 10}, nil)
	errc := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			if err := w.SendWait(chunk(i), time.Time{}, nil); err != nil {
				errc <- err
				return
			}
		}
	}()
	testutil.WaitFor(t, "a data frame waiting for room", func() bool { return w.Stats().Waiting == 1 })
	w.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("err = %v, want ErrClosed", err)
		}
	case <-time.After(hangGuard):
		t.Fatal("waiter not released by Close")
	}
}

// TestFrameLargerThanCapGoesAlone: a frame bigger than the whole cap is
// queued once nothing else is pending, instead of waiting forever.
func TestFrameLargerThanCapGoesAlone(t *testing.T) {
	nc, peer := socketPair(t)
	w := NewWriter(nc, Config{MaxPendingBytes: 4 << 10}, nil)
	defer w.Close()
	big := (&protocol.BodyChunk{RequestID: 7, Data: make([]byte, 64<<10), TotalSize: -1, Progress: -1}).As(protocol.PhaseResponse)
	errc := make(chan error, 1)
	go func() { errc <- w.SendWait(big, time.Time{}, nil) }()
	fr := uds.NewFrameReader(peer)
	typ, p, err := fr.Next()
	if err != nil || typ != protocol.TypeResponseBodyChunk {
		t.Fatalf("frame %s: %v", typ, err)
	}
	var c protocol.BodyChunk
	if err := c.Decode(p); err != nil || c.RequestID != 7 || len(c.Data) != 64<<10 {
		t.Fatalf("decoded %d bytes for request %d: %v", len(c.Data), c.RequestID, err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestQueue: queued data frames never wait and are written by the writer
// goroutine, in order with the others; on a connection backed up past the
// data frames' share, or with a sender waiting for room, Queue refuses
// with ErrBackedUp without counting a dropped control frame, and the
// frames it took all arrive once the peer reads.
func TestQueue(t *testing.T) {
	const limit = 32 << 10
	nc, peer := socketPair(t)
	w := NewWriter(nc, Config{MaxPendingBytes: limit}, nil)
	defer w.Close()

	// The peer does not read yet: frames pile up to the data share.
	queued := 0
	for {
		err := w.Queue(chunk(queued))
		if errors.Is(err, ErrBackedUp) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if queued++; queued > limit {
			t.Fatal("Queue never refused on a backed-up connection")
		}
	}
	st := w.Stats()
	if queued == 0 || st.Pending > limit-limit/8 || st.ControlDropped != 0 || st.Waits != 0 {
		t.Fatalf("%d frames queued; stats %+v", queued, st)
	}
	// The reserve for control frames is still there.
	if err := w.Send(&protocol.Ping{Sequence: 1}); err != nil {
		t.Fatalf("a ping after Queue filled the data share: %v", err)
	}
	// A sender waiting for room: Queue does not overtake it. (The kernel
	// may still take some of what is pending, so the sender goes on until
	// one of its frames has to wait; sent is how many chunks there are.)
	waited := make(chan error, 1)
	var sent int
	go func() {
		for i := queued; ; i++ {
			before := w.Stats().Waits
			if err := w.SendWait(chunk(i), time.Time{}, nil); err != nil {
				waited <- err
				return
			}
			if w.Stats().Waits > before {
				sent = i + 1
				waited <- nil
				return
			}
		}
	}()
	testutil.WaitFor(t, "a data frame waiting for room", func() bool { return w.Stats().Waiting == 1 })
	if err := w.Queue(chunk(-1)); !errors.Is(err, ErrBackedUp) {
		t.Fatalf("Queue with a sender waiting: %v, want ErrBackedUp", err)
	}

	// The peer reads: everything queued arrives in order, the ping among
	// the chunks, then the sender's frames.
	type frame struct {
		typ protocol.MsgType
		idx uint32
		err error
	}
	frames := make(chan frame, 1024)
	go func() {
		fr := uds.NewFrameReader(peer)
		for {
			_ = peer.SetReadDeadline(time.Now().Add(hangGuard))
			typ, p, err := fr.Next()
			if err != nil {
				frames <- frame{err: err}
				return
			}
			var c protocol.BodyChunk
			if typ == protocol.TypeRequestBodyChunk {
				if err := c.Decode(p); err != nil {
					frames <- frame{err: err}
					return
				}
			}
			frames <- frame{typ: typ, idx: c.ChunkIndex}
		}
	}()
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(hangGuard):
		t.Fatal("the waiting sender was not released")
	}
	var next uint32
	pings := 0
	for int(next) < sent {
		f := <-frames
		switch {
		case f.err != nil:
			t.Fatalf("after %d chunks: %v", next, f.err)
		case f.typ == protocol.TypePing:
			pings++
		case f.typ == protocol.TypeRequestBodyChunk:
			if f.idx != next {
				t.Fatalf("chunk %d: index %d", next, f.idx)
			}
			next++
		default:
			t.Fatalf("unexpected frame %v", f.typ)
		}
	}
	if pings != 1 {
		t.Fatalf("%d pings arrived, want 1", pings)
	}
	if st := w.Stats(); st.ControlDropped != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestFlushYieldsWhileFramesJoin: a sender that writes its own frame
// yields first so that other runnable senders' frames join the write; it
// goes on yielding while frames do join, and mostly stops when none do.
func TestFlushYieldsWhileFramesJoin(t *testing.T) {
	nc, peer := testutil.ConnPair(t, "unix")
	go io.Copy(io.Discard, peer)
	w := NewWriter(nc, Config{}, nil)
	defer w.Close()
	var yields, joined atomic.Int64
	var join atomic.Bool
	yield.SetHook(func(owner any) bool {
		if owner != w {
			return false
		}
		yields.Add(1)
		if join.Load() {
			// Another sender, runnable, queues its frame meanwhile.
			if err := w.Queue(chunk(-1)); err != nil {
				t.Error(err)
			}
			joined.Add(1)
		}
		return true
	})
	defer yield.SetHook(nil)

	// send sends n frames one after the other, each flushed by its
	// sender (the writer goroutine is idle in between), and returns how
	// many of those flushes yielded.
	send := func(n int) int64 {
		y0 := yields.Load()
		for i := 0; i < n; i++ {
			if err := w.SendWait(chunk(i), time.Now().Add(hangGuard), nil); err != nil {
				t.Fatal(err)
			}
			testutil.WaitFor(t, "the frame written", func() bool { return w.Stats().Pending == 0 })
		}
		return yields.Load() - y0
	}
	const n = 320
	if got := send(n); got == 0 || got > n/yield.ProbeEvery+1 {
		t.Fatalf("alone: %d of %d flushes yielded, want about one in %d", got, n, yield.ProbeEvery)
	}
	join.Store(true)
	if got := send(n); got < n-yield.ProbeEvery {
		t.Fatalf("with frames joining: %d of %d flushes yielded", got, n)
	}
	if joined.Load() == 0 {
		t.Fatal("no frame joined")
	}
}
