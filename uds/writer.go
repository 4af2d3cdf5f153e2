package uds

import (
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
)

// Writer is the one writer of a connection. Senders encode their frame
// straight into the pending batch under a short lock; the writer goroutine
// swaps batches and writes each with a single Write, so frames that queue
// up while a write is in progress leave together. The pending batch is
// bounded by the callers: each in-flight request has at most one event
// outstanding.
type Writer struct {
	nc      net.Conn
	timeout time.Duration
	onErr   func(error)

	mu   sync.Mutex
	buf  []byte
	err  error
	wake chan struct{}
	done chan struct{}
}

// NewWriter starts the writer goroutine for nc. onErr is called once when a
// write fails (the connection is then unusable).
func NewWriter(nc net.Conn, writeTimeout time.Duration, onErr func(error)) *Writer {
	w := &Writer{
		nc:      nc,
		timeout: writeTimeout,
		onErr:   onErr,
		buf:     make([]byte, 0, 16<<10),
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	go w.loop()
	return w
}

// Send encodes msg (a pointer to a protocol message of type t) into the
// pending batch. It never blocks on the network.
func (w *Writer) Send(t protocol.MsgType, msg any) error {
	w.mu.Lock()
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return err
	}
	b, err := AppendFrame(w.buf, t, msg)
	w.buf = b
	w.mu.Unlock()
	if err != nil {
		return err
	}
	w.signal()
	return nil
}

// SendRaw queues a frame whose payload is already encoded JSON.
func (w *Writer) SendRaw(t protocol.MsgType, payload []byte) error {
	w.mu.Lock()
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return err
	}
	b, err := AppendRawFrame(w.buf, t, payload)
	w.buf = b
	w.mu.Unlock()
	if err != nil {
		return err
	}
	w.signal()
	return nil
}

func (w *Writer) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Close stops the writer after flushing what is pending (bounded by the
// write timeout). Later sends fail with ErrUDSClosed.
func (w *Writer) Close() {
	w.mu.Lock()
	if w.err == nil {
		w.err = ErrUDSClosed
		close(w.done)
	}
	w.mu.Unlock()
}

func (w *Writer) loop() {
	spare := make([]byte, 0, 16<<10)
	for {
		select {
		case <-w.wake:
		case <-w.done:
			w.flush(spare)
			return
		}
		var err error
		if spare, err = w.flush(spare); err != nil {
			w.mu.Lock()
			if w.err == nil {
				w.err = fmt.Errorf("%w: write: %v", ErrUDSClosed, err)
				close(w.done)
			}
			w.mu.Unlock()
			if w.onErr != nil {
				w.onErr(err)
			}
			return
		}
	}
}

// flush writes the pending batch and returns an empty buffer for the next swap.
func (w *Writer) flush(spare []byte) ([]byte, error) {
	w.mu.Lock()
	b := w.buf
	w.buf = spare[:0]
	w.mu.Unlock()
	if len(b) == 0 {
		return b, nil
	}
	if w.timeout > 0 {
		_ = w.nc.SetWriteDeadline(time.Now().Add(w.timeout))
	}
	_, err := w.nc.Write(b)
	if cap(b) > 1<<20 {
		// One burst of big bodies should not pin megabytes per connection.
		b = make([]byte, 0, 16<<10)
	}
	return b[:0], err
}
