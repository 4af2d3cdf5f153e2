package grpcwire

import (
	"fmt"
	"sync"
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
)

// Outbox is the send side of one stream. Put encodes a message in the
// caller's goroutine and queues it without touching the network; Run
// drains the queue in batches. Only one goroutine at a time calls the
// stream's SendMsg (it is not safe for concurrent use): Run, or a caller
// of SendEvent or PutDirect that finds nothing queued or being sent and
// sends its own message, which saves the hand-off to Run (a goroutine and
// often a thread wake-up) when one request is in flight. The queue is
// bounded: every request has at most one event outstanding, so a full
// queue means the peer stopped reading.
type Outbox struct {
	send  func(m any) error
	limit int // max message size
	depth int // max queued messages

	mu     sync.Mutex
	q      []Outgoing
	direct Outgoing // the message a direct sender sends (its address does not escape per call)
	busy   bool     // a batch or a direct message is being sent
	err    error    // set once closed
	wake   chan struct{}
	closed chan struct{}

	// The proof that sent bytes left (see SendEvent): enq counts the
	// bytes handed to the stream (or queued for it), in order, as gRPC
	// counts them against its per-stream write quota; proven is the
	// position up to which the peer has provably read them; ends holds
	// recent events' end positions by request id.
	enq    int64
	proven int64
	ends   [endsRing]idEnd
}

type idEnd struct {
	id  uint64
	end int64
}

const endsRing = 4096

// directQuota bounds the bytes that may be unproven for a direct send:
// grpc-go lets a stream have 64 KiB of messages handed to it and not yet
// written to the connection before SendMsg blocks, and bytes the peer has
// answered have certainly been written.
const directQuota = 48 << 10

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
func (o *Outbox) Put(msg protocol.Message) error { return o.put(msg, 0, false, false) }

// PutAgentError queues an agent error for request id.
func (o *Outbox) PutAgentError(id uint64, reason string) error {
	var m Outgoing
	m.EncodeAgentError(id, reason)
	return o.enqueue(m, 0, false, false)
}

// SendEvent is Put for the event of request id whose answer the caller
// reports with Answered: when nothing is queued or being sent, and the
// bytes not yet proven read by the peer are few enough that gRPC's
// per-stream write quota cannot be exhausted, it sends msg itself from
// the calling goroutine, which then cannot block in SendMsg; otherwise
// it queues msg for Run. Either way it never waits for the peer.
func (o *Outbox) SendEvent(id uint64, msg protocol.Message) error {
	return o.put(msg, id, true, false)
}

// Answered records that the peer answered the last event SendEvent sent
// for request id: it has read that event, so every byte sent before it
// has left. (The proxy sends the next event of a request only after the
// answer to the previous one, so an answer is to the last event; only a
// peer that answers an event twice, against the protocol, could make the
// proof run ahead of what it read.)
func (o *Outbox) Answered(id uint64) {
	e := &o.ends[id%endsRing]
	o.mu.Lock()
	if e.id == id && e.end > o.proven {
		o.proven = e.end
	}
	o.mu.Unlock()
}

// PutDirect is Put that sends msg from the calling goroutine when nothing
// is queued or being sent. SendMsg may then block the caller while the
// connection is backed up (gRPC's write quota for the stream, 64 KiB of
// messages not yet written, is used up: the peer has stopped reading
// behind a full flow-control window), so it is for senders that may wait
// as long as the stream lives, never for a read loop.
func (o *Outbox) PutDirect(msg protocol.Message) error { return o.put(msg, 0, false, true) }

// put encodes msg and hands it to enqueue.
func (o *Outbox) put(msg protocol.Message, id uint64, event, direct bool) error {
	var m Outgoing
	if err := m.Encode(msg, o.limit); err != nil {
		return err
	}
	return o.enqueue(m, id, event, direct)
}

// enqueue queues m, or sends it directly (see SendEvent, PutDirect).
func (o *Outbox) enqueue(m Outgoing, id uint64, event, direct bool) error {
	size := int64(m.Len()) + 5 // gRPC counts the message header too
	o.mu.Lock()
	if o.err != nil {
		err := o.err
		o.mu.Unlock()
		m.Free()
		return err
	}
	if !o.busy && len(o.q) == 0 && (direct || event && o.enq-o.proven < directQuota) {
		o.account(id, event, size)
		o.busy = true
		o.direct = m // only the busy holder touches it
		o.mu.Unlock()
		err := o.send(&o.direct)
		m = o.direct
		o.direct = Outgoing{}
		o.mu.Lock()
		o.busy = false
		more := len(o.q) > 0 && o.err == nil
		o.mu.Unlock()
		if err != nil {
			m.Free()
			err = fmt.Errorf("%w: send: %w", ErrGRPCClosed, err)
			o.Close(err)
			return err
		}
		if more {
			o.kick()
		}
		return nil
	}
	if len(o.q) >= o.depth {
		o.mu.Unlock()
		m.Free()
		return fmt.Errorf("%w: %d messages queued", ErrGRPCQueueFull, o.depth)
	}
	o.account(id, event, size)
	o.q = append(o.q, m)
	// Run sends what is queued while it is busy; a direct sender kicks it
	// when it is done.
	first := len(o.q) == 1 && !o.busy
	o.mu.Unlock()
	if first {
		o.kick()
	}
	return nil
}

// account counts size bytes handed on in order; called with o.mu held.
func (o *Outbox) account(id uint64, event bool, size int64) {
	o.enq += size
	if event {
		o.ends[id%endsRing] = idEnd{id: id, end: o.enq}
	}
}

func (o *Outbox) kick() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
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
		o.mu.Lock()
		// While a caller sends its own message (busy, not Run's), Run
		// leaves the queue alone: that caller kicks it when done.
		for !o.busy && len(o.q) > 0 {
			batch := o.q
			o.q = spare[:0]
			o.busy = true
			o.mu.Unlock()
			for i := range batch {
				if err := o.send(&batch[i]); err != nil {
					for j := i; j < len(batch); j++ {
						batch[j].Free()
					}
					err = fmt.Errorf("%w: send: %w", ErrGRPCClosed, err)
					o.Close(err)
					o.mu.Lock()
					o.busy = false
					o.mu.Unlock()
					return err
				}
				batch[i] = Outgoing{}
			}
			spare = batch
			o.mu.Lock()
			o.busy = false
		}
		o.mu.Unlock()
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
