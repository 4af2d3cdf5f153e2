package grpcwire

import (
	"fmt"
	"sync"
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
)

// Outbox is the send side of one stream. Put encodes a message in the
// caller's goroutine and queues it without touching the network; Run, the
// stream's only sender (gRPC streams' SendMsg is not safe for concurrent
// use), drains the queue in batches. The queue is bounded: every request
// has at most one event outstanding, so a full queue means the peer stopped
// reading.
type Outbox struct {
	send  func(m any) error
	limit int // max message size
	depth int // max queued messages

	mu     sync.Mutex
	q      []Outgoing
	busy   bool  // Run is sending a batch
	err    error // set once closed
	wake   chan struct{}
	closed chan struct{}
}

// NewOutbox returns an Outbox that sends through send (a stream's SendMsg),
// refuses messages larger than maxMsg bytes (MaxMessageSize when <= 0) and
// holds at most depth queued messages (4096 when <= 0).
func NewOutbox(send func(m any) error, maxMsg, depth int) *Outbox {
	if maxMsg <= 0 || maxMsg > MaxMessageSize {
		maxMsg = MaxMessageSize
	}
	if depth <= 0 {
		depth = 4096
	}
	return &Outbox{
		send:   send,
		limit:  maxMsg,
		depth:  depth,
		q:      make([]Outgoing, 0, 64),
		wake:   make(chan struct{}, 1),
		closed: make(chan struct{}),
	}
}

// Put encodes msg and queues it. It returns once msg is encoded: the
// caller may reuse it. It never waits (a full queue fails with
// ErrGRPCQueueFull), so a stream's read loop may answer a Ping with it.
func (o *Outbox) Put(msg protocol.Message) error {
	var m Outgoing
	if err := m.Encode(msg, o.limit); err != nil {
		return err
	}
	return o.enqueue(m)
}

// PutAgentError queues an agent error for request id.
func (o *Outbox) PutAgentError(id uint64, reason string) error {
	var m Outgoing
	m.EncodeAgentError(id, reason)
	return o.enqueue(m)
}

func (o *Outbox) enqueue(m Outgoing) error {
	o.mu.Lock()
	if o.err != nil {
		err := o.err
		o.mu.Unlock()
		m.Free()
		return err
	}
	if len(o.q) >= o.depth {
		o.mu.Unlock()
		m.Free()
		return fmt.Errorf("%w: %d messages queued", ErrGRPCQueueFull, o.depth)
	}
	o.q = append(o.q, m)
	first := len(o.q) == 1
	o.mu.Unlock()
	if first {
		select {
		case o.wake <- struct{}{}:
		default:
		}
	}
	return nil
}

// Run sends queued messages until Close or a send error, which it returns
// (after closing the Outbox with it).
func (o *Outbox) Run() error {
	spare := make([]Outgoing, 0, 64)
	for {
		select {
		case <-o.wake:
		case <-o.closed:
			return o.Err()
		}
		for {
			o.mu.Lock()
			batch := o.q
			o.q = spare[:0]
			o.busy = len(batch) > 0
			o.mu.Unlock()
			if len(batch) == 0 {
				spare = batch
				break
			}
			for i := range batch {
				if err := o.send(&batch[i]); err != nil {
					for j := i; j < len(batch); j++ {
						batch[j].Free()
					}
					err = fmt.Errorf("%w: send: %w", ErrGRPCClosed, err)
					o.Close(err)
					return err
				}
				batch[i] = Outgoing{}
			}
			spare = batch
		}
	}
}

// Drain waits up to d for the queue to be handed to the stream.
func (o *Outbox) Drain(d time.Duration) {
	deadline := time.Now().Add(d)
	for {
		o.mu.Lock()
		idle := (len(o.q) == 0 && !o.busy) || o.err != nil
		o.mu.Unlock()
		if idle || time.Now().After(deadline) {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// Close stops the Outbox: queued messages are dropped, later Puts fail
// with err (ErrGRPCClosed when nil). Only the first call counts.
func (o *Outbox) Close(err error) {
	if err == nil {
		err = ErrGRPCClosed
	}
	o.mu.Lock()
	if o.err != nil {
		o.mu.Unlock()
		return
	}
	o.err = err
	q := o.q
	o.q = nil
	o.mu.Unlock()
	for i := range q {
		q[i].Free()
	}
	close(o.closed)
}

// Err is why the Outbox closed, or nil.
func (o *Outbox) Err() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.err
}

// Closed is closed when the Outbox is.
func (o *Outbox) Closed() <-chan struct{} { return o.closed }
