// Package udswriter is the one writer of a framed agent connection (see
// package uds for the frames), shared by the proxy side and the SDK.
package udswriter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/zentinelproxy/sidecar/internal/rawio"
	"github.com/zentinelproxy/sidecar/internal/yield"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

// Errors of a Writer. A send that fails with ErrClosed fails because the
// connection is gone; the other errors leave the connection usable.
var (
	// ErrClosed: the connection is closed.
	ErrClosed = errors.New("uds: connection closed")
	// ErrBackedUp: the frame was not queued, and not sent. A control
	// frame (Send) found even the room reserved for control frames full
	// (the peer has stopped reading); a data frame offered to Queue found
	// senders waiting for room, or no room in the data frames' share.
	ErrBackedUp = errors.New("uds: connection backed up; frame not queued")
	// ErrWaitDeadline: a data frame waited for room until its deadline.
	ErrWaitDeadline = errors.New("uds: no room to queue the frame before the deadline")
	// ErrWaitCanceled: a data frame's wait for room was canceled.
	ErrWaitCanceled = errors.New("uds: wait for room to queue the frame canceled")
)

// Defaults of a framed connection's writer, on both sides (the proxy's
// links and the SDK's agents; internal/config's max_pending_bytes).
const (
	// DefaultMaxPendingBytes is the default cap on the bytes of one
	// connection that are queued or being written.
	DefaultMaxPendingBytes = 4 << 20
	// DefaultWriteTimeout bounds each batched write.
	DefaultWriteTimeout = 5 * time.Second
)

// Config tunes a Writer.
type Config struct {
	// WriteTimeout bounds each batch's write (0: none). A write that times
	// out fails the connection.
	WriteTimeout time.Duration
	// MaxPendingBytes caps the bytes queued or being written on the connection
	// (DefaultMaxPendingBytes when <= 0). Data frames (events, replies) may
	// fill it up to 7/8; the last eighth is reserved for control frames
	// (Ping, Pong, CancelRequest, CancelAll, agent errors), which never
	// wait. A data frame that does not fit waits for the writer to drain,
	// bounded by its own deadline or cancellation; a control frame that
	// does not fit is dropped. A single frame larger than the data room is
	// queued alone, once nothing else is pending.
	MaxPendingBytes int
	// Encoding is the payload encoding of the frames (uds.JSON by
	// default); SendRaw payloads are written as given.
	Encoding uds.Encoding
}

// Stats are a Writer's counters.
type Stats struct {
	// Pending is the number of bytes queued or being written now.
	Pending int
	// PendingHigh is the most Pending has ever been.
	PendingHigh int
	// Limit is the cap on Pending (MaxPendingBytes).
	Limit int
	// Waits counts data frames that had to wait for room.
	Waits uint64
	// Waiting is the number of data frames waiting for room now.
	Waiting int
	// ControlDropped counts control frames dropped on a backed-up connection.
	ControlDropped uint64
	// Batches and Frames count the writes and the frames they carried.
	Batches uint64
	Frames  uint64
}

// Writer is the one writer of a connection, in the manner of grpc-go's
// control buffer: a sender encodes its frame into the pending batch under
// a short lock (a data frame that finds the lock taken is encoded outside
// it and copied in, so that senders do not queue behind each other's
// encoding) and never waits on the socket; a dedicated goroutine writes
// whatever is pending with a single Write per batch (bounded by the write
// timeout), so frames that queue up while a write is in progress leave
// together. Pending bytes are capped (Config.MaxPendingBytes).
//
// Control frames (Send, SendRaw) only queue: a connection's read loop
// sends its Pongs with them and so never writes to the socket, whatever
// the peer does. Data frames (SendWait, SendContext) queue the same way;
// in addition, when the writer goroutine is idle and nothing is being
// written, the sender makes one non-blocking write(2) of the pending batch
// itself, which saves the hand-off to the writer goroutine (a goroutine
// wake-up and often a thread wake-up) when a lone request is in flight.
// Whatever the kernel does not take at once is left to the writer
// goroutine, so no sender ever blocks on the socket.
type Writer struct {
	nc      net.Conn
	timeout time.Duration
	onErr   func(error)
	limit   int // MaxPendingBytes
	data    int // room data frames may fill
	enc     uds.Encoding

	mu      sync.Mutex
	buf     []byte // queued frames
	spare   []byte // the other buffer, swapped in while buf is written
	pending int    // bytes in buf plus the batch being written
	idle    bool   // the writer goroutine waits for wake
	busy    bool   // a batch is being written (by the writer goroutine or a flushing sender)
	err     error
	room    chan struct{} // closed (and replaced) when room is freed and somebody waits
	waiting int
	stats   Stats
	yield   yield.Policy // flush's yield; guarded by mu

	wake chan struct{}
	done chan struct{} // closed on Close or failure

	// Opportunistic flush (see flush): nil when the connection has no
	// raw file descriptor (TLS).
	raw     syscall.RawConn
	flushFn func(fd uintptr) bool
	fb      []byte // the batch being flushed
	fn      int    // bytes of fb written
	ferr    error
}

// NewWriter starts the writer goroutine for nc. onErr is called once when a
// write fails (the connection is then unusable).
func NewWriter(nc net.Conn, cfg Config, onErr func(error)) *Writer {
	limit := cfg.MaxPendingBytes
	if limit <= 0 {
		limit = DefaultMaxPendingBytes
	}
	w := &Writer{
		nc:      nc,
		timeout: cfg.WriteTimeout,
		onErr:   onErr,
		limit:   limit,
		data:    limit - limit/8,
		enc:     cfg.Encoding,
		buf:     make([]byte, 0, 16<<10),
		spare:   make([]byte, 0, 16<<10),
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	w.stats.Limit = limit
	if sc, ok := nc.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			w.raw = raw
			w.flushFn = w.writeNow
		}
	}
	go w.loop()
	return w
}

// Send queues a control frame: Ping, Pong, CancelRequest, CancelAll. It
// never waits: it encodes m into the pending batch and returns. When the
// connection is so backed up that even the room reserved for control
// frames is full, m is dropped with ErrBackedUp.
func (w *Writer) Send(m protocol.Message) error { return w.sendControl(m, 0, nil) }

// SendRaw queues a control frame whose payload is already encoded, in the
// connection's encoding (an agent error); like Send it never waits.
func (w *Writer) SendRaw(t protocol.MsgType, payload []byte) error {
	return w.sendControl(nil, t, payload)
}

// sendControl encodes m, or when m is nil the raw frame (t, payload), into
// the pending batch and keeps it if it fits under the cap.
func (w *Writer) sendControl(m protocol.Message, t protocol.MsgType, payload []byte) error {
	w.mu.Lock()
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return err
	}
	start := len(w.buf)
	var err error
	if m != nil {
		w.buf, err = uds.AppendFrameAs(w.buf, m, w.enc)
	} else {
		w.buf, err = uds.AppendRawFrame(w.buf, t, payload)
	}
	if err != nil {
		w.mu.Unlock()
		return err
	}
	return w.commitControl(start)
}

// commitControl keeps the control frame encoded at buf[start:] if it fits
// under the cap; called with w.mu held, it releases it.
func (w *Writer) commitControl(start int) error {
	n := len(w.buf) - start
	if w.pending+n > w.limit && w.pending > 0 {
		w.buf = w.buf[:start]
		w.stats.ControlDropped++
		w.mu.Unlock()
		return ErrBackedUp
	}
	w.commit(n)
	return nil
}

// SendWait queues a data frame (an event or a reply). When the connection
// has no room for it, it waits for the writer to drain, until deadline
// (zero: none) or until cancel is closed (nil: never), failing with
// ErrWaitDeadline or ErrWaitCanceled; it also ends when the connection
// fails. It never blocks on the socket: at most it makes one non-blocking
// write when nothing else is being written (see Writer).
func (w *Writer) SendWait(m protocol.Message, deadline time.Time, cancel <-chan struct{}) error {
	return w.sendData(m, nil, deadline, cancel)
}

// SendContext is SendWait bounded by ctx. ctx is consulted only when the
// frame has to wait.
func (w *Writer) SendContext(ctx context.Context, m protocol.Message) error {
	return w.sendData(m, ctx, time.Time{}, nil)
}

func (w *Writer) sendData(m protocol.Message, ctx context.Context, deadline time.Time, cancel <-chan struct{}) error {
	// Nobody else queueing: encode straight into the pending batch, as
	// long as nothing is waiting for room and it fits (nearly always).
	if w.mu.TryLock() {
		if w.err == nil && w.waiting == 0 {
			n, err := w.appendData(m)
			if err != nil {
				w.mu.Unlock()
				return err
			}
			if w.fitsData(n) {
				if w.raw != nil && w.idle && !w.busy {
					w.flush(n)
					return nil
				}
				w.commit(n)
				return nil
			}
			w.buf = w.buf[:len(w.buf)-n] // no room: the slow path below waits
		}
		w.mu.Unlock()
	}
	// Others are queueing: encode outside the lock (a microsecond for a
	// typical RequestHeaders, which serialized many senders when done
	// under it) and only copy the frame into the batch under it.
	sp := scratchPool.Get().(*[]byte)
	f, err := uds.AppendFrameAs((*sp)[:0], m, w.enc)
	if err != nil {
		putScratch(sp, f)
		return err
	}
	n := len(f)
	var timer *time.Timer
	w.mu.Lock()
	for waited := false; ; {
		if w.err != nil {
			err := w.err
			w.mu.Unlock()
			putScratch(sp, f)
			stopTimer(timer)
			return err
		}
		// Waiting senders go first: a new frame does not overtake them.
		if w.pending == 0 || (w.fitsData(n) && (w.waiting == 0 || waited)) {
			w.buf = append(w.buf, f...)
			putScratch(sp, f)
			stopTimer(timer)
			if w.raw != nil && w.idle && !w.busy {
				w.flush(n)
				return nil
			}
			w.commit(n)
			return nil
		}
		// The slow path: the connection is backed up.
		if !waited {
			w.stats.Waits++
			if ctx != nil {
				deadline, _ = ctx.Deadline()
				cancel = ctx.Done()
			}
			if !deadline.IsZero() {
				timer = time.NewTimer(time.Until(deadline))
			}
		}
		var tc <-chan time.Time
		if timer != nil {
			tc = timer.C
		}
		if w.room == nil {
			w.room = make(chan struct{})
		}
		room := w.room
		w.waiting++
		w.mu.Unlock()
		var why error
		select {
		case <-room:
		case <-w.done:
		case <-tc:
			why = ErrWaitDeadline
		case <-cancel:
			why = ErrWaitCanceled
		}
		w.mu.Lock()
		w.waiting--
		if why != nil {
			if w.waiting > 0 && w.room != nil {
				// Let the others recheck: one fewer waiter may let them in.
				close(w.room)
				w.room = nil
			}
			pending := w.pending
			w.mu.Unlock()
			putScratch(sp, f)
			stopTimer(timer)
			return fmt.Errorf("%w (%d bytes pending, limit %d)", why, pending, w.limit)
		}
		waited = true
	}
}

// Queue queues a data frame for the writer goroutine without ever waiting
// and without writing it itself: for a sender that has more frames coming
// at once (an agent answering a burst of events), so that they leave
// together. When senders wait for room, or the frame does not fit in the
// data frames' share of the cap, it is not queued and Queue fails with
// ErrBackedUp; the caller then sends it with SendContext or SendWait,
// which wait for room.
func (w *Writer) Queue(m protocol.Message) error {
	w.mu.Lock()
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return err
	}
	if w.waiting > 0 {
		w.mu.Unlock()
		return ErrBackedUp
	}
	n, err := w.appendData(m)
	if err != nil {
		w.mu.Unlock()
		return err
	}
	if !w.fitsData(n) {
		w.buf = w.buf[:len(w.buf)-n]
		w.mu.Unlock()
		return ErrBackedUp
	}
	w.commit(n)
	return nil
}

// appendData encodes the data frame m at the end of the pending batch and
// returns its length (on an error the batch is left as it was); called
// with w.mu held.
func (w *Writer) appendData(m protocol.Message) (int, error) {
	start := len(w.buf)
	b, err := uds.AppendFrameAs(w.buf, m, w.enc)
	if err != nil {
		w.buf = b[:start]
		return 0, err
	}
	w.buf = b
	return len(b) - start, nil
}

// fitsData reports whether a data frame of n bytes may join the pending
// batch: it fits the data frames' share of the cap, or nothing is pending
// (a frame larger than the share then goes alone); called with w.mu held.
func (w *Writer) fitsData(n int) bool { return w.pending == 0 || w.pending+n <= w.data }

// scratchPool holds the buffers data frames are encoded into before they
// are copied into the pending batch.
var scratchPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// putScratch returns a scratch buffer (grown to f) to the pool, unless a
// big frame made it big: one burst of big bodies should not stay pinned.
func putScratch(sp *[]byte, f []byte) {
	if cap(f) <= 64<<10 {
		*sp = f[:0]
		scratchPool.Put(sp)
	}
}

func stopTimer(t *time.Timer) {
	if t != nil {
		t.Stop()
	}
}

// flush accounts n freshly queued bytes and, nobody writing, writes the
// pending batch with one non-blocking write: a data sender never waits on
// the socket, and whatever the kernel does not take at once is left, first
// in line, to the writer goroutine. A read loop never gets here (control
// frames only queue). Called with w.mu held, it releases it.
func (w *Writer) flush(n int) {
	w.pending += n
	w.stats.Frames++
	if w.pending > w.stats.PendingHigh {
		w.stats.PendingHigh = w.pending
	}
	w.busy = true
	// Let other runnable senders queue their frames first: they leave in
	// this write (measured: 64 in flight went from ~180k to ~300k
	// decisions/s); when nothing else is runnable this returns at once.
	// Below that load nobody joins, and with idle Ps the yield wakes a
	// thread for nothing: w.yield keeps it while frames do join.
	// Waiting longer, for the runtime's next network poll (an eventfd rung
	// and waited on, so that the requests that became ready meanwhile
	// join), was measured on a proxy sharing one core with its agent at
	// 25k requests/s: the agent woke less than half as often and the
	// kernel time fell by 2 µs per request, but the user time rose about
	// as much, and in two runs of five rounds the CPU per request moved
	// by -3.5% and +2.4%. Not kept.
	if w.yield.Before() {
		frames := w.stats.Frames
		w.mu.Unlock()
		yield.Gosched(w)
		w.mu.Lock()
		w.yield.After(w.stats.Frames != frames)
	}
	b := w.buf
	w.buf = w.spare[:0]
	w.stats.Batches++
	w.mu.Unlock()
	w.fb, w.fn, w.ferr = b, 0, nil
	err := w.raw.Write(w.flushFn)
	written, werr := w.fn, w.ferr
	w.fb = nil
	if err == nil {
		err = werr
	}
	w.mu.Lock()
	w.pending -= written
	if written < len(b) {
		// The rest of the batch (maybe part of a frame) goes first.
		rest := copy(b, b[written:])
		b = append(b[:rest], w.buf...)
		w.spare, w.buf = w.buf[:0], b
	} else {
		w.spare = b[:0]
	}
	w.busy = false
	if w.room != nil && written > 0 {
		close(w.room)
		w.room = nil
	}
	wake := len(w.buf) > 0 && w.idle && err == nil
	if wake {
		w.idle = false
	}
	w.mu.Unlock()
	if err != nil {
		w.fail(err)
		return
	}
	if wake {
		w.wake <- struct{}{}
	}
}

// writeNow writes w.fb without waiting (the RawConn.Write callback).
func (w *Writer) writeNow(fd uintptr) bool {
	if errno := rawio.WriteFrom(int(fd), w.fb, &w.fn); errno != 0 && errno != syscall.EAGAIN {
		w.ferr = errno
	}
	return true // never wait for writability: the writer goroutine does
}

// commit accounts n freshly queued bytes and wakes the writer goroutine if
// it is idle; called with w.mu held, it releases it.
func (w *Writer) commit(n int) {
	w.pending += n
	w.stats.Frames++
	if w.pending > w.stats.PendingHigh {
		w.stats.PendingHigh = w.pending
	}
	wake := w.idle && !w.busy // a flushing sender hands on what it leaves
	if wake {
		w.idle = false
	}
	w.mu.Unlock()
	if wake {
		w.wake <- struct{}{} // buffered; one token per idle period
	}
}

// Stats returns the writer's counters.
func (w *Writer) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.stats
	st.Pending = w.pending
	st.Waiting = w.waiting
	return st
}

// Drain waits up to timeout for everything pending to be written; used
// before a deliberate close so that a CancelAll queued behind other frames
// still leaves.
func (w *Writer) Drain(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for {
		w.mu.Lock()
		idle := w.err != nil || w.pending == 0
		w.mu.Unlock()
		if idle || time.Now().After(deadline) {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// Close stops the writer; frames not yet written are dropped (their
// requests fail with the connection). Later sends fail with ErrClosed, and
// senders waiting for room are released with it.
func (w *Writer) Close() {
	w.mu.Lock()
	if w.err == nil {
		w.err = ErrClosed
		close(w.done)
	}
	w.mu.Unlock()
}

// smallBatch is the batch size below which the writer yields once before
// writing, so that senders already runnable join the batch (as grpc-go's
// loopy writer does); when nothing else is runnable the yield returns at
// once.
const smallBatch = 16 << 10

func (w *Writer) loop() {
	yielded := false
	for {
		w.mu.Lock()
		for (len(w.buf) == 0 || w.busy) && w.err == nil {
			w.idle = true
			w.mu.Unlock()
			select {
			case <-w.wake:
			case <-w.done:
				return
			}
			yielded = false
			w.mu.Lock()
		}
		if w.err != nil {
			w.mu.Unlock()
			return
		}
		if !yielded && len(w.buf) < smallBatch {
			w.mu.Unlock()
			yielded = true
			runtime.Gosched()
			continue
		}
		b := w.buf
		w.buf = w.spare[:0]
		w.busy = true
		w.stats.Batches++
		w.mu.Unlock()
		n := len(b)
		b, err := w.write(b)
		w.mu.Lock()
		w.busy = false
		w.spare = b
		w.pending -= n
		if w.room != nil {
			close(w.room) // room was freed: waiters recheck
			w.room = nil
		}
		w.mu.Unlock()
		if err != nil {
			w.fail(err)
			return
		}
	}
}

func (w *Writer) fail(err error) {
	w.mu.Lock()
	first := w.err == nil
	if first {
		w.err = fmt.Errorf("%w: write: %v", ErrClosed, err)
		close(w.done)
	}
	w.mu.Unlock()
	if first && w.onErr != nil {
		w.onErr(err)
	}
}

// write writes one batch and returns its buffer, emptied, for reuse.
func (w *Writer) write(b []byte) ([]byte, error) {
	if w.timeout > 0 {
		_ = w.nc.SetWriteDeadline(time.Now().Add(w.timeout))
	}
	_, err := w.nc.Write(b)
	if w.timeout > 0 && w.raw != nil {
		// A flushing sender's write must not find this deadline.
		_ = w.nc.SetWriteDeadline(time.Time{})
	}
	if cap(b) > 1<<20 {
		// One burst of big bodies should not pin megabytes per connection.
		b = make([]byte, 0, 16<<10)
	}
	return b[:0], err
}
