package sdk

import (
	"context"
	"sync"
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
)

// Sender is how a Dispatcher answers: one per connection, owned by the
// transport. Both methods must encode before returning and never write to
// the network themselves (a transport has one writer per connection).
type Sender interface {
	// Send queues a reply (a Decision or a BodyMutation) of the request
	// whose handler context is ctx. When the connection is backed up it may
	// wait for room, at most until ctx ends.
	Send(ctx context.Context, m protocol.Message) error
	// SendError answers requestID with an agent error: a decision the proxy
	// cannot accept, so that its failure policy decides. It never waits
	// (a transport's read loop uses it).
	SendError(requestID uint64, reason string) error
}

// queuer is an optional interface of a Sender that can queue a reply
// without writing it: the read loop's own handler runs use it while more
// events are buffered, since the write that Send may make at once would
// carry that single reply, where queued replies leave together. It has
// Send's contract otherwise.
type queuer interface {
	queue(ctx context.Context, m protocol.Message) error
}

// Event is one decoded proxy → agent event. Transports acquire one from
// the Dispatcher, decode into the field matching Type, and Dispatch it.
type Event struct {
	Type            protocol.MsgType
	RequestHeaders  protocol.RequestHeaders
	Chunk           protocol.BodyChunk
	ResponseHeaders protocol.ResponseHeaders

	decision protocol.Decision
	body     BodyReply
	next     *Event
	buf      []byte // see Buffer
	// dl is when the proxy stops waiting for the answer (see mono): when
	// the event was dispatched plus its timeout_ms (0: unknown).
	dl time.Duration
}

// Deadlines are monotonic clock readings, as offsets from a process-wide
// epoch: time.Since reads the monotonic clock alone, half the cost of the
// wall and monotonic reading of time.Now, and an event's deadline costs a
// reading when it is read and one when its handler returns.
var epoch = time.Now()

// mono is the monotonic time since epoch; never 0 after it.
func mono() time.Duration { return time.Since(epoch) }

// Buffer is storage that stays with the Event through the pool: a
// transport whose decoded messages alias the bytes they were decoded from
// may receive the event's message into it, so that they stay valid while
// the event is handled without an allocation per event. It is the
// transport's to size; the SDK never reads it.
func (e *Event) Buffer() *[]byte { return &e.buf }

// RequestID of the event.
func (e *Event) RequestID() uint64 {
	switch e.Type {
	case protocol.TypeRequestHeaders:
		return e.RequestHeaders.RequestID
	case protocol.TypeResponseHeaders:
		return e.ResponseHeaders.RequestID
	}
	return e.Chunk.RequestID
}

// timeoutMs is the event's timeout_ms (0: unknown).
func (e *Event) timeoutMs() uint32 {
	switch e.Type {
	case protocol.TypeRequestHeaders:
		return e.RequestHeaders.TimeoutMs
	case protocol.TypeResponseHeaders:
		return e.ResponseHeaders.TimeoutMs
	}
	return e.Chunk.TimeoutMs
}

// Decode fills the event from a frame payload of type t.
func (e *Event) Decode(t protocol.MsgType, payload []byte) error {
	e.Type = t
	switch t {
	case protocol.TypeRequestHeaders:
		return e.RequestHeaders.Decode(payload)
	case protocol.TypeResponseHeaders:
		return e.ResponseHeaders.Decode(payload)
	default:
		return e.Chunk.Decode(payload)
	}
}

var eventPool = sync.Pool{New: func() any { return new(Event) }}

// AcquireEvent returns an empty Event from a pool.
func AcquireEvent() *Event { return eventPool.Get().(*Event) }

// ReleaseEvent returns ev to the pool.
func ReleaseEvent(ev *Event) {
	ev.next = nil
	if cap(ev.buf) > 64<<10 {
		ev.buf = nil // one big body should not stay pinned in the pool
	}
	eventPool.Put(ev)
}

// reqState serializes the events of a request while its handler runs and
// is the context that handler sees. It is allocated fresh each time a
// handler starts for an event and never reused, so it keeps the
// context.Context contract for as long as anything holds it: Done returns
// the same channel on every call, and once done it stays done. That
// single small allocation (Done's channel, and the timer of a deadline,
// are made only when asked for) is the whole cost: context.WithCancel
// would allocate more and register with the connection's context on
// every request; here the Dispatcher cancels its requests itself.
//
// It is canceled when the handler returns, on a CancelRequest for its
// request, on CancelAll and when the connection ends; it is past its
// deadline (context.DeadlineExceeded) once the event's timeout_ms has
// passed since the event was read.
type reqState struct {
	d        *Dispatcher   // values come from its context
	deadline time.Duration // the event's, a mono reading (0: none of its own); fixed
	mu       sync.Mutex
	done     chan struct{} // made on first Done() or end
	err      error
	timer    *time.Timer // ends it at deadline once Done was asked for; guarded by mu
	head     *Event      // queued behind the running one (only with pipelining proxies); guarded by d.mu
	tail     *Event
	// Waiting for a Limiter slot (see Limiter): the request's id and
	// first event, and its place in the limiter's queue (guarded by the
	// limiter's mu).
	id           uint64
	first        *Event
	queued       bool
	qprev, qnext *reqState
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Deadline is the event's deadline, or the connection context's when
// that is earlier or the event has none.
func (r *reqState) Deadline() (time.Time, bool) {
	d, ok := r.d.base.Deadline()
	if r.deadline == 0 {
		return d, ok
	}
	if own := epoch.Add(r.deadline); !ok || own.Before(d) {
		return own, true
	}
	return d, true
}

// Value is the connection context's.
func (r *reqState) Value(key any) any { return r.d.base.Value(key) }

func (r *reqState) Done() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done == nil {
		if r.err == nil && r.deadline != 0 {
			// A channel that must close at the deadline: the one timer of
			// the context (Err alone reads the clock instead).
			if left := r.deadline - mono(); left > 0 {
				r.timer = time.AfterFunc(left, r.expire)
			} else {
				r.err = context.DeadlineExceeded
			}
		}
		if r.err != nil {
			r.done = closedChan
		} else {
			r.done = make(chan struct{})
		}
	}
	return r.done
}

func (r *reqState) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil && r.deadline != 0 && mono() >= r.deadline {
		r.endLocked(context.DeadlineExceeded)
	}
	return r.err
}

func (r *reqState) cancel() { r.end(context.Canceled) }
func (r *reqState) expire() { r.end(context.DeadlineExceeded) }

func (r *reqState) end(err error) {
	r.mu.Lock()
	r.endLocked(err)
	r.mu.Unlock()
}

func (r *reqState) endLocked(err error) {
	if r.err != nil {
		return
	}
	r.err = err
	if r.done != nil {
		close(r.done)
	}
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
}

// ended reports whether the context is known to have ended, without
// reading the clock: a deadline that passed unnoticed is not seen.
func (r *reqState) ended() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err != nil
}

// Dispatcher runs a Handler for one connection: a goroutine per request
// with events in flight (not per connection), cancellation by request id.
type Dispatcher struct {
	h      Handler
	out    Sender
	base   context.Context
	stop   context.CancelFunc
	unhook func() bool // stops the CancelAll registered on base
	// onCancel is h as a CancelObserver (cancel.go), or nil.
	onCancel CancelObserver
	// q is out as a queuer, or nil.
	q queuer

	// lim bounds the handler runs in progress (SetLimiter), or nil.
	lim *Limiter

	mu      sync.Mutex
	reqs    map[uint64]*reqState
	running int           // handler runs not finished, or waiting for a slot; guarded by mu
	drained chan struct{} // closed when running drops to 0 (Close waits); guarded by mu
	workers *workerPool
}

// SetLimiter makes d's handler runs take a slot of l (see Limiter); call
// it before the first event. The transports of this package and of
// grpcsdk call it with their options' Limiter.
func (d *Dispatcher) SetLimiter(l *Limiter) { d.lim = l }

// NewDispatcher serves h on one connection whose replies go to out.
func NewDispatcher(parent context.Context, h Handler, out Sender) *Dispatcher {
	ctx, cancel := context.WithCancel(parent)
	d := &Dispatcher{h: h, out: out, base: ctx, stop: cancel, reqs: make(map[uint64]*reqState), workers: sharedWorkers}
	d.onCancel, _ = h.(CancelObserver)
	d.q, _ = out.(queuer)
	// A request context is done when the connection's is.
	d.unhook = context.AfterFunc(ctx, d.CancelAll)
	return d
}

// Dispatch hands ev to the handler, on a worker goroutine. The dispatcher
// owns ev afterwards. (A read loop run by Serve may instead handle an
// event itself when the connection is otherwise idle; see Serve.)
func (d *Dispatcher) Dispatch(ev *Event) { d.dispatch(ev, nil) }

// dispatch is Dispatch; r is the Serve loop whose reading goroutine calls
// it, or nil. It reports false when it handled ev in the calling goroutine
// and another goroutine took over reading meanwhile (see Serve).
func (d *Dispatcher) dispatch(ev *Event, r *reader) (reading bool) {
	id := ev.RequestID()
	// The event's deadline counts from now, when it was read: the proxy
	// gives up timeout_ms after it sent it.
	ev.dl = 0
	if ms := ev.timeoutMs(); ms > 0 {
		ev.dl = mono() + time.Duration(ms)*time.Millisecond
	}
	d.mu.Lock()
	if st := d.reqs[id]; st != nil {
		// An event of this request is being handled: queue behind it.
		if st.tail == nil {
			st.head = ev
		} else {
			st.tail.next = ev
		}
		st.tail = ev
		d.mu.Unlock()
		return true
	}
	if d.base.Err() != nil {
		d.mu.Unlock()
		ReleaseEvent(ev)
		return true
	}
	st := &reqState{d: d, deadline: ev.dl} // the handler's context: fresh, never reused
	d.reqs[id] = st
	d.running++
	if d.lim != nil && !d.lim.acquireOrQueue(st, id, ev) {
		// No free slot: the run waits in the limiter's queue, where a
		// CancelRequest finds and drops it.
		d.mu.Unlock()
		return true
	}
	// Handling it right here saves the hand-off to a worker (a goroutine
	// wake-up, often a thread wake-up): when nothing else is in progress,
	// or, on a busy connection, when the handlers run here lately were
	// quick (see Serve).
	here := r != nil && r.mayHandle(len(d.reqs) == 1)
	d.mu.Unlock()
	if here {
		return r.handle(id, st, ev)
	}
	d.workers.run(task{d: d, id: id, st: st, ev: ev})
	return true
}

// run handles ev and the events of request id queued behind it, each with
// a context of its own, and then gives back its Limiter slot. queue: the
// replies may only be queued (see queuer). fresh: ev was read just now
// (the reading goroutine runs it), so its deadline is not checked.
func (d *Dispatcher) run(id uint64, st *reqState, ev *Event, queue, fresh bool) {
	for ev != nil {
		if d.live(id, st, fresh) {
			d.handle(st, ev, queue)
		}
		fresh = false
		ReleaseEvent(ev)
		d.mu.Lock()
		ev = st.head
		if ev != nil {
			next := &reqState{d: d, deadline: ev.dl, head: ev.next, tail: st.tail}
			if next.head == nil {
				next.tail = nil
			}
			ev.next = nil
			st.head, st.tail = nil, nil
			d.reqs[id] = next
			st.cancel() // this event's context is over
			st = next
		} else {
			delete(d.reqs, id)
			// Expired for good: whatever still holds the context (a
			// derived context, an AfterFunc, a goroutine the handler
			// started) sees it done. (Under d.mu, as in Cancel.)
			st.cancel()
			d.running--
			if d.running == 0 && d.drained != nil {
				close(d.drained)
				d.drained = nil
			}
		}
		d.mu.Unlock()
	}
	if d.lim != nil {
		d.lim.release()
	}
}

// live reports whether the event whose context is st is still wanted, so
// that the handler may start on it: its request was not canceled and its
// deadline has not passed (not checked when fresh). An event that is not
// is dropped without an answer (the proxy has given up on it; an answer
// would be discarded as late) and counted; for one past its deadline, a
// CancelObserver hears of its request, as for a CancelRequest.
func (d *Dispatcher) live(id uint64, st *reqState, fresh bool) bool {
	if st.ended() {
		dropped.canceled.Add(1)
		return false
	}
	if fresh || st.deadline == 0 || mono() < st.deadline {
		return true
	}
	st.expire()
	dropped.expired.Add(1)
	if d.onCancel != nil {
		d.onCancel.OnCancel(id)
	}
	return false
}

// send sends a reply, queued only if queue and out can.
func (d *Dispatcher) send(ctx context.Context, m protocol.Message, queue bool) error {
	if queue && d.q != nil {
		return d.q.queue(ctx, m)
	}
	return d.out.Send(ctx, m)
}

func (d *Dispatcher) handle(ctx context.Context, ev *Event, queue bool) {
	id := ev.RequestID()
	var err error
	switch ev.Type {
	case protocol.TypeRequestHeaders, protocol.TypeResponseHeaders:
		ev.decision.Reset()
		ev.decision.RequestID = id
		if ev.Type == protocol.TypeRequestHeaders {
			err = d.h.OnRequestHeaders(ctx, &ev.RequestHeaders, &ev.decision)
			if err == nil && ev.RequestHeaders.HasInlineBody && ctx.Err() == nil {
				err = d.inlineBody(ctx, ev) // inline.go
			}
		} else {
			err = d.h.OnResponseHeaders(ctx, &ev.ResponseHeaders, &ev.decision)
		}
		if err == nil && ctx.Err() == nil {
			ev.decision.RequestID = id
			err = d.send(ctx, &ev.decision, queue)
		}
	case protocol.TypeRequestBodyChunk, protocol.TypeResponseBodyChunk:
		r := &ev.body
		r.Decision.Reset()
		r.Mutation.Reset()
		r.UseMutation = false
		if ev.Type == protocol.TypeRequestBodyChunk {
			err = d.h.OnRequestBody(ctx, &ev.Chunk, r)
		} else {
			err = d.h.OnResponseBody(ctx, &ev.Chunk, r)
		}
		if err == nil && ctx.Err() == nil {
			if r.UseMutation {
				r.Mutation.RequestID = id
				r.Mutation.ChunkIndex = ev.Chunk.ChunkIndex
				r.Mutation.Phase = protocol.PhaseRequest
				if ev.Type == protocol.TypeResponseBodyChunk {
					r.Mutation.Phase = protocol.PhaseResponse
				}
				err = d.send(ctx, &r.Mutation, queue)
			} else {
				r.Decision.RequestID = id
				err = d.send(ctx, &r.Decision, queue)
			}
		}
	}
	if err != nil && ctx.Err() == nil {
		// The proxy's failure policy decides what an agent error means.
		_ = d.out.SendError(id, "handler error")
	}
}

// Cancel cancels the context of request id's running handler, if any,
// then tells a handler that is a CancelObserver.
func (d *Dispatcher) Cancel(id uint64) {
	d.mu.Lock()
	st := d.reqs[id]
	if st != nil {
		st.cancel()
		// Events queued behind a canceled one are dropped with it.
		for ev := st.head; ev != nil; {
			n := ev.next
			ReleaseEvent(ev)
			dropped.canceled.Add(1)
			ev = n
		}
		st.head, st.tail = nil, nil
		if d.lim != nil && d.lim.unqueue(st) {
			// It was waiting for a slot: it never runs.
			ReleaseEvent(st.first)
			st.first = nil
			dropped.canceled.Add(1)
			delete(d.reqs, id)
			d.running--
			if d.running == 0 && d.drained != nil {
				close(d.drained)
				d.drained = nil
			}
		}
	}
	d.mu.Unlock()
	if d.onCancel != nil {
		d.onCancel.OnCancel(id)
	}
}

// CancelAll cancels every running handler.
func (d *Dispatcher) CancelAll() {
	d.mu.Lock()
	ids := make([]uint64, 0, len(d.reqs))
	for id := range d.reqs {
		ids = append(ids, id)
	}
	d.mu.Unlock()
	for _, id := range ids {
		d.Cancel(id)
	}
}

// Close cancels everything and waits for running handlers to return.
func (d *Dispatcher) Close() {
	d.mu.Lock()
	d.stop()
	d.mu.Unlock()
	d.unhook()
	d.CancelAll()
	d.mu.Lock()
	for d.running > 0 {
		if d.drained == nil {
			d.drained = make(chan struct{})
		}
		ch := d.drained
		d.mu.Unlock()
		<-ch
		d.mu.Lock()
	}
	d.mu.Unlock()
}
