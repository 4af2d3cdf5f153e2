package accesslog

import (
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of a Writer.
const (
	DefaultFlushInterval = 100 * time.Millisecond
	DefaultBufferSize    = 64 << 10
	DefaultMaxBuffered   = 4 << 20
)

// Writer batches log lines into few writes without ever blocking the
// caller: Write copies the line into a buffer; a goroutine writes the
// buffer out when it passes BufferSize and every FlushInterval. When the
// output stalls and MaxBuffered bytes are waiting, further lines are
// dropped and counted rather than holding up requests. Each Write must
// be one whole line (zerolog writes one call per event).
type Writer struct {
	out      io.Writer
	interval time.Duration
	flushAt  int
	max      int

	mu      sync.Mutex
	cur     []byte
	closed  bool
	dropped atomic.Uint64
	errs    atomic.Uint64

	kick chan struct{}
	// flushReq asks the writer goroutine for a synchronous flush.
	flushReq chan chan struct{}
	stop     chan struct{}
	done     chan struct{}
}

// NewWriter starts a Writer on out. Zero arguments take the defaults.
func NewWriter(out io.Writer, bufferSize, maxBuffered int, interval time.Duration) *Writer {
	if bufferSize <= 0 {
		bufferSize = DefaultBufferSize
	}
	if maxBuffered < bufferSize {
		maxBuffered = max(DefaultMaxBuffered, bufferSize)
	}
	if interval <= 0 {
		interval = DefaultFlushInterval
	}
	w := &Writer{
		out:      out,
		interval: interval,
		flushAt:  bufferSize,
		max:      maxBuffered,
		cur:      make([]byte, 0, bufferSize),
		kick:     make(chan struct{}, 1),
		flushReq: make(chan chan struct{}),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	go w.run()
	return w
}

// Write implements io.Writer. It never blocks on the output.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	if w.closed || len(w.cur)+len(p) > w.max {
		w.mu.Unlock()
		w.dropped.Add(1)
		return len(p), nil
	}
	w.cur = append(w.cur, p...)
	full := len(w.cur) >= w.flushAt
	w.mu.Unlock()
	if full {
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

// Dropped is the number of lines dropped because the output stalled (or
// the Writer was closed).
func (w *Writer) Dropped() uint64 { return w.dropped.Load() }

// WriteErrors is the number of failed writes to the output.
func (w *Writer) WriteErrors() uint64 { return w.errs.Load() }

// Flush writes out what is buffered and waits for it.
func (w *Writer) Flush() {
	ack := make(chan struct{})
	select {
	case w.flushReq <- ack:
		<-ack
	case <-w.done:
	}
}

// Close flushes and stops the Writer; later lines are dropped. It does not
// close the output.
func (w *Writer) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	w.mu.Unlock()
	close(w.stop)
	<-w.done
	return nil
}

func (w *Writer) run() {
	defer close(w.done)
	t := time.NewTicker(w.interval)
	defer t.Stop()
	// spare is owned by this goroutine: buffers alternate between
	// collecting lines and being written.
	spare := make([]byte, 0, w.flushAt)
	flush := func() {
		w.mu.Lock()
		buf := w.cur
		w.cur = spare[:0]
		w.mu.Unlock()
		if len(buf) > 0 {
			if _, err := w.out.Write(buf); err != nil {
				w.errs.Add(1)
			}
		}
		if cap(buf) > 4*w.flushAt {
			// A burst while the output stalled; do not keep its memory.
			buf = make([]byte, 0, w.flushAt)
		}
		spare = buf
	}
	for {
		select {
		case <-t.C:
			flush()
		case <-w.kick:
			flush()
		case ack := <-w.flushReq:
			flush()
			close(ack)
		case <-w.stop:
			flush()
			return
		}
	}
}
