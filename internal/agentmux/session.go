// Package agentmux multiplexes many HTTP requests over one agent connection.
//
// It is the transport-independent half of the proxy side of agent protocol
// v2: request ids, the in-flight limit with a bounded wait queue, per-event
// deadlines, cancellation, late-reply accounting and failing every waiter
// when the connection dies. A transport (udsclient, reverse, grpcclient,
// extproc) supplies a Link that puts events on the wire and feeds decoded
// replies back through Session.Deliver from its single read loop.
//
// Every event the proxy sends gets exactly one reply, so an Exchange has at
// most one event outstanding; the reply is delivered by swapping Reply
// buffers between the read loop and the waiter, which costs no allocation
// and no copy.
package agentmux

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
)

// Errors returned to callers of an Exchange. They are wrapped with the
// agent's name; test with errors.Is.
var (
	// ErrAgentUnavailable: no live connection to the agent.
	ErrAgentUnavailable = errors.New("agentmux: agent unavailable")
	// ErrAgentTimeout: the agent did not answer within the deadline.
	ErrAgentTimeout = errors.New("agentmux: agent timed out")
	// ErrAgentOverloaded: the in-flight limit is reached and the wait queue is full.
	ErrAgentOverloaded = errors.New("agentmux: agent overloaded")
	// ErrAgentConnLost: the connection died while the request was in flight.
	ErrAgentConnLost = errors.New("agentmux: agent connection lost")
	// ErrAgentProtocol: the agent answered with a reply that breaks the protocol.
	ErrAgentProtocol = errors.New("agentmux: agent protocol error")
	// ErrAgentCanceled: the caller's cancel channel was closed (client went away).
	ErrAgentCanceled = errors.New("agentmux: request canceled")
)

// Wait bounds how long one call (Begin, or one event of an Exchange) may
// wait: for an in-flight slot, for room to queue its frame and for the
// reply. It is a plain value, so passing one costs nothing.
type Wait struct {
	// Deadline ends the wait with ErrAgentTimeout (zero: none; the
	// session's MessageTimeout still bounds each reply).
	Deadline time.Time
	// Cancel, once closed, ends the wait with ErrAgentCanceled (nil:
	// never). A close at or after Deadline counts as the deadline.
	Cancel <-chan struct{}
	// Now is the caller's reading of the clock, taken just before the
	// call (zero: the call reads the clock itself). A caller that reads
	// the clock anyway to time the call passes it on: one clock read
	// fewer per event on the hot path. The message deadline is Now plus
	// MessageTimeout, so a reading older than the call shortens it by its
	// age: a Wait with Now is for one call, made at once (a retry takes a
	// fresh reading).
	Now time.Time
}

// WaitFor is the Wait of a context: its deadline and its Done channel. For
// callers that have a real context; the dataplane passes its own values.
func WaitFor(ctx context.Context) Wait {
	d, _ := ctx.Deadline()
	return Wait{Deadline: d, Cancel: ctx.Done()}
}

// expired reports whether w's deadline has passed at now.
func (w Wait) expired(now time.Time) bool {
	return !w.Deadline.IsZero() && !now.Before(w.Deadline)
}

// Link is the transport under a Session.
type Link interface {
	// Send queues one event for the agent. It must encode m before
	// returning (the caller reuses it) and must never write to or wait on
	// the network itself. When the connection's pending bytes are at their
	// cap it may wait for room until w's deadline or cancel, failing with
	// an error that wraps ErrAgentTimeout or ErrAgentCanceled.
	Send(m protocol.Message, w Wait) error
	// SendControl queues a control frame (CancelRequest, CancelAll). It
	// never waits; on a connection too backed up for it the frame may be
	// dropped with an error.
	SendControl(m protocol.Message) error
	// Close tears the connection down. The transport then calls Session.Fail.
	Close() error
}

// Reply is an agent's answer to one event: a Decision or a BodyMutation.
type Reply struct {
	Type     protocol.MsgType
	Decision protocol.Decision
	Mutation protocol.BodyMutation
	// Err is set by a transport that could tell which request a malformed
	// reply belonged to, or by Deliver for a decision that breaks the
	// schema; the waiter gets ErrAgentProtocol.
	Err error
	// Buf is the transport's: bytes the decoded reply may alias. It
	// travels with the Reply (a transport that decodes into a spare Reply
	// may reuse the spare's Buf), so it stays valid exactly as long as the
	// reply does.
	Buf []byte
}

// RequestID returns the request id of the reply.
func (r *Reply) RequestID() uint64 {
	if r.Type == protocol.TypeBodyMutation {
		return r.Mutation.RequestID
	}
	return r.Decision.RequestID
}

// nextID is process-wide so request ids never repeat across connections.
var nextID atomic.Uint64

// NextRequestID returns a fresh request id, unique in this process.
func NextRequestID() uint64 { return nextID.Add(1) }

// Defaults of the session limits. Every transport's configuration
// (udsclient, grpcclient, extproc, reverse) and the configuration file
// (internal/config: max_in_flight, max_queue, timeouts.message) take
// them from here.
const (
	// DefaultMessageTimeout bounds the wait for each reply.
	DefaultMessageTimeout = time.Second
	// DefaultMaxInFlight is the proxy's in-flight limit per connection.
	DefaultMaxInFlight = 1024
	// DefaultMaxQueue is how many requests may wait for an in-flight slot
	// per connection.
	DefaultMaxQueue = 1024
)

// MessageDeadline is the deadline of one event sent at now: the earlier
// of w's deadline and the message timeout from now (zero: neither; a
// timeout <= 0 is none). byMsg says the message timeout is the earlier.
// Every transport bounds its events with it.
func MessageDeadline(w Wait, now time.Time, timeout time.Duration) (dl time.Time, byMsg bool) {
	dl = w.Deadline
	if timeout > 0 {
		if m := now.Add(timeout); dl.IsZero() || m.Before(dl) {
			return m, true
		}
	}
	return dl, false
}

// SessionConfig bounds one Session.
type SessionConfig struct {
	// Name labels errors and logs.
	Name string
	// MaxInFlight is the proxy's own limit; the agent's
	// max_concurrent_requests lowers it when smaller. Must be > 0.
	MaxInFlight int
	// MaxQueue is how many Begin calls may wait for a slot; more fail at once
	// with ErrAgentOverloaded.
	MaxQueue int
	// MessageTimeout bounds the wait for each reply (0: only the Wait of
	// the call).
	MessageTimeout time.Duration
}

// Stats are a Session's counters.
type Stats struct {
	InFlight  int64
	Waiting   int64
	Late      uint64 // replies for unknown, finished or timed-out requests
	Timeouts  uint64
	Cancels   uint64 // CancelRequest frames sent
	Protocol  uint64 // malformed replies
	Completed uint64 // events answered
	// SendWaits counts events that waited for room in the connection's
	// pending bytes; ControlDropped counts pings, pongs and cancels dropped
	// because even the room kept for them was full (links that report
	// them, see BackpressureReporter).
	SendWaits      uint64
	ControlDropped uint64
	// Writes counts the connection's writes and FramesWritten the frames
	// they carried (links that report them, see BatchReporter).
	Writes        uint64
	FramesWritten uint64
}

// BackpressureReporter is implemented by links with a bounded send queue.
type BackpressureReporter interface {
	Backpressure() (sendWaits, controlDropped uint64)
}

// BatchReporter is implemented by links that write their frames in
// batches.
type BatchReporter interface {
	Batching() (writes, frames uint64)
}

// Session multiplexes requests over one agent connection.
type Session struct {
	cfg  SessionConfig
	link Link
	caps protocol.Capabilities
	sem  chan struct{}

	mu      sync.Mutex
	pending map[uint64]*Exchange // the exchanges waiting for a reply, by request id
	err     error                // set once when the session fails
	done    chan struct{}
	// One timer per session bounds every waiting event (see arm and
	// expire): it is armed for the earliest deadline of a waiting event
	// and only moved when an event with an earlier one starts waiting, so
	// an event that is answered in time costs no timer operation at all.
	timer   *time.Timer // time.AfterFunc(s.expire); guarded by mu
	armedAt time.Time   // when timer fires; zero: not armed; guarded by mu

	inflight  atomic.Int64
	waiting   atomic.Int64
	late      atomic.Uint64
	timeouts  atomic.Uint64
	cancels   atomic.Uint64
	protoErrs atomic.Uint64
	completed atomic.Uint64
}

// NewSession wraps a connected, handshaken link.
func NewSession(link Link, caps protocol.Capabilities, cfg SessionConfig) *Session {
	limit := cfg.MaxInFlight
	if limit <= 0 {
		limit = 1024
	}
	if m := int(caps.MaxConcurrentRequests); m > 0 && m < limit {
		limit = m
	}
	return &Session{
		cfg:     cfg,
		link:    link,
		caps:    caps,
		sem:     make(chan struct{}, limit),
		pending: make(map[uint64]*Exchange, limit),
		done:    make(chan struct{}),
	}
}

// Capabilities returns what the agent declared.
func (s *Session) Capabilities() protocol.Capabilities { return s.caps }

// Limit is the effective in-flight limit.
func (s *Session) Limit() int { return cap(s.sem) }

// InFlight is the number of open exchanges.
func (s *Session) InFlight() int64 { return s.inflight.Load() }

// Done is closed when the session has failed or was closed.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err returns why the session ended, or nil while it is live.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Stats returns a snapshot of the counters.
func (s *Session) Stats() Stats {
	st := Stats{
		InFlight:  s.inflight.Load(),
		Waiting:   s.waiting.Load(),
		Late:      s.late.Load(),
		Timeouts:  s.timeouts.Load(),
		Cancels:   s.cancels.Load(),
		Protocol:  s.protoErrs.Load(),
		Completed: s.completed.Load(),
	}
	if br, ok := s.link.(BackpressureReporter); ok {
		st.SendWaits, st.ControlDropped = br.Backpressure()
	}
	if br, ok := s.link.(BatchReporter); ok {
		st.Writes, st.FramesWritten = br.Batching()
	}
	return st
}

// CountProtocolError records a malformed frame the transport could not
// attribute to a request.
func (s *Session) CountProtocolError() { s.protoErrs.Add(1) }

var exchangePool = sync.Pool{New: func() any {
	return &Exchange{ch: make(chan struct{}, 1), reply: new(Reply)}
}}

// Begin opens an exchange for one HTTP request: it waits for an in-flight
// slot (bounded by w, MessageTimeout and the queue limit) and assigns a
// request id. The caller must call Finish exactly once.
func (s *Session) Begin(w Wait) (*Exchange, error) {
	select {
	case s.sem <- struct{}{}:
	default:
		if s.waiting.Add(1) > int64(s.cfg.MaxQueue) {
			s.waiting.Add(-1)
			return nil, fmt.Errorf("%w: %s: %d in flight and %d waiting", ErrAgentOverloaded, s.cfg.Name, cap(s.sem), s.cfg.MaxQueue)
		}
		err := s.waitSlot(w)
		s.waiting.Add(-1)
		if err != nil {
			return nil, err
		}
	}
	select {
	case <-s.done:
		// The session failed (a failure after this check is found by the
		// exchange's first event, under the lock).
		<-s.sem
		return nil, s.Err()
	default:
	}
	e := exchangePool.Get().(*Exchange)
	e.s = s
	e.id = NextRequestID()
	e.state = stateIdle
	e.err = nil
	s.inflight.Add(1)
	return e, nil
}

func (s *Session) waitSlot(w Wait) error {
	// The slot wait is cold (the fast path above took no timer).
	now := time.Now()
	dl, byMsg := s.deadline(w, now)
	var tc <-chan time.Time
	if !dl.IsZero() {
		t := time.NewTimer(dl.Sub(now))
		defer t.Stop()
		tc = t.C
	}
	select {
	case s.sem <- struct{}{}:
		return nil
	case <-w.Cancel:
		if w.expired(time.Now()) {
			s.timeouts.Add(1)
			return fmt.Errorf("%w: %s: no free slot before the request deadline", ErrAgentTimeout, s.cfg.Name)
		}
		return fmt.Errorf("%w: %s: waiting for a slot", ErrAgentCanceled, s.cfg.Name)
	case <-tc:
		s.timeouts.Add(1)
		if byMsg {
			return fmt.Errorf("%w: %s: no free slot within %v", ErrAgentTimeout, s.cfg.Name, s.cfg.MessageTimeout)
		}
		return fmt.Errorf("%w: %s: no free slot before the request deadline", ErrAgentTimeout, s.cfg.Name)
	case <-s.done:
		return fmt.Errorf("%w: %s", ErrAgentConnLost, s.cfg.Name)
	}
}

// deadline is the earlier of w's deadline and MessageTimeout from now
// (MessageDeadline).
func (s *Session) deadline(w Wait, now time.Time) (dl time.Time, byMsg bool) {
	return MessageDeadline(w, now, s.cfg.MessageTimeout)
}

// Deliver hands a decoded reply to the exchange waiting for it and returns
// a Reply for the transport to decode the next frame into. A reply nobody
// waits for is counted as late and its buffer handed back.
//
// Every transport's decisions come through here, so this is where the
// protocol schema is applied to them, once (protocol.Decision.Normalize:
// the codecs are syntactic). A decision that breaks it fails its own
// request with ErrAgentProtocol, like an undecodable one; the connection
// and the other requests go on.
func (s *Session) Deliver(r *Reply) *Reply {
	if r.Err == nil && r.Type == protocol.TypeDecision {
		r.Err = r.Decision.Normalize()
	}
	id := r.RequestID()
	s.mu.Lock()
	e := s.pending[id]
	if e == nil {
		s.mu.Unlock()
		s.late.Add(1)
		return r
	}
	delete(s.pending, id)
	old := e.reply
	e.reply = r
	e.state = stateAnswered
	s.mu.Unlock()
	e.ch <- struct{}{}
	return old
}

// DeliverError fails request id's waiting exchange with err, a reply the
// transport could not decode (or an agent's error for that request): it
// is delivered as a Decision carrying err, which the exchange turns into
// ErrAgentProtocol. It returns the Reply to decode the next frame into,
// as Deliver does.
func (s *Session) DeliverError(r *Reply, id uint64, err error) *Reply {
	r.Type = protocol.TypeDecision
	r.Decision.Reset()
	r.Decision.RequestID = id
	r.Err = err
	next := s.Deliver(r)
	next.Err = nil
	return next
}

// Fail ends the session: every waiting exchange gets err (wrapped in
// ErrAgentConnLost) at once, and later Begin calls fail.
func (s *Session) Fail(err error) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	if err == nil {
		err = errors.New("closed")
	}
	s.err = fmt.Errorf("%w: %s: %v", ErrAgentConnLost, s.cfg.Name, err)
	close(s.done)
	if s.timer != nil {
		s.timer.Stop()
		s.armedAt = time.Time{}
	}
	for _, e := range s.pending {
		e.state = stateFailed
		e.ch <- struct{}{}
	}
	clear(s.pending)
	s.mu.Unlock()
}

// arm makes sure the session's timer fires no later than dl; called with
// s.mu held when an event with deadline dl starts waiting. The timer is
// set from the clock read here, not from the caller's reading (which
// may be a little old, see Wait.Now): armedAt must be when it fires.
// Most events return early: their deadline is later than the one armed.
func (s *Session) arm(dl time.Time) {
	if !s.armedAt.IsZero() && !dl.Before(s.armedAt) {
		return // it fires earlier already; expire re-arms for the rest
	}
	s.armedAt = dl
	if s.timer == nil {
		s.timer = time.AfterFunc(time.Until(dl), s.expire)
		return
	}
	s.timer.Reset(time.Until(dl))
}

// expire runs when the session's timer fires: it wakes every waiting
// event whose deadline has passed (they fail with ErrAgentTimeout) and
// re-arms the timer for the earliest deadline left. Most of the time the
// event it was armed for was answered long ago and it only re-arms: with
// a message timeout of 1s, that is about once a second per busy session,
// and it walks the session's pending exchanges (at most its in-flight
// limit) under the lock. A timeout is noticed when the timer fires, as
// precisely as a timer per event would.
func (s *Session) expire() {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.armedAt = time.Time{}
	if s.err != nil {
		return
	}
	var next time.Time
	for id, e := range s.pending {
		if e.dl.IsZero() {
			continue
		}
		if !now.Before(e.dl) {
			delete(s.pending, id)
			e.state = stateExpired
			e.ch <- struct{}{}
			continue
		}
		if next.IsZero() || e.dl.Before(next) {
			next = e.dl
		}
	}
	if !next.IsZero() {
		s.arm(next)
	}
}

// Close closes the link (which fails the session).
func (s *Session) Close() error {
	err := s.link.Close()
	s.Fail(errors.New("closed by proxy"))
	return err
}

// SendCancelAll tells the agent to stop all work (on shutdown or drain).
func (s *Session) SendCancelAll(reason string) error {
	return s.link.SendControl(&protocol.CancelAll{Reason: []byte(reason)})
}

type exchangeState uint8

const (
	stateIdle exchangeState = iota
	stateWaiting
	stateAnswered // also between events, until the next one waits
	stateFailed
	stateExpired // the session's timer found the deadline passed; as dead
	stateDead    // timed out or canceled: no further events
)

// Exchange is one HTTP request's conversation with one agent.
// It is not safe for concurrent use; another goroutine ends a waiting
// event only through the Wait passed to it (closing its Cancel channel).
type Exchange struct {
	s     *Session
	id    uint64
	state exchangeState // written under s.mu; see settle for reads
	reply *Reply
	ch    chan struct{} // one token per wake-up: answered, failed or expired
	err   error
	// The deadline of the waiting event and whether it is MessageTimeout's
	// (rather than the caller's); guarded by s.mu, read by expire.
	dl    time.Time
	byMsg bool

	cancelMsg protocol.CancelRequest
}

// RequestID is the id this request has on the wire.
func (e *Exchange) RequestID() uint64 { return e.id }

// Capabilities of the agent behind this exchange.
func (e *Exchange) Capabilities() protocol.Capabilities { return e.s.caps }

// RequestHeaders sends m (its RequestID is set here) and waits for the
// Decision, bounded by w and MessageTimeout.
func (e *Exchange) RequestHeaders(w Wait, m *protocol.RequestHeaders) (*Reply, error) {
	m.RequestID = e.id
	return e.call(w, m, &m.TimeoutMs, false, 0)
}

// ResponseHeaders sends m and waits for the Decision, bounded by w and
// MessageTimeout.
func (e *Exchange) ResponseHeaders(w Wait, m *protocol.ResponseHeaders) (*Reply, error) {
	m.RequestID = e.id
	return e.call(w, m, &m.TimeoutMs, false, 0)
}

// BodyChunk sends one body chunk of the given phase and waits for the
// Decision or the BodyMutation for it, bounded by w and MessageTimeout.
func (e *Exchange) BodyChunk(w Wait, phase protocol.Phase, m *protocol.BodyChunk) (*Reply, error) {
	m.RequestID = e.id
	return e.call(w, m.As(phase), &m.TimeoutMs, true, m.ChunkIndex)
}

// call sends msg and waits for its reply. timeout is msg's timeout_ms
// field, set here to the wait the event gets: the agent learns when the
// proxy gives up on it.
func (e *Exchange) call(w Wait, msg protocol.Message, timeout *uint32, chunk bool, index uint32) (*Reply, error) {
	s := e.s
	if e.err != nil {
		return nil, e.err
	}
	t := msg.MsgType()
	// One deadline covers the wait for room to send and for the reply:
	// the earlier of the caller's and MessageTimeout from now.
	var dl, now time.Time
	byMsg := false
	if s.cfg.MessageTimeout > 0 || !w.Deadline.IsZero() {
		if now = w.Now; now.IsZero() {
			now = time.Now()
		}
		dl, byMsg = s.deadline(w, now)
	}
	*timeout = timeoutMs(dl, now)
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		e.err = err
		return nil, err
	}
	e.state = stateWaiting
	e.dl, e.byMsg = dl, byMsg
	s.pending[e.id] = e
	if !dl.IsZero() {
		s.arm(dl)
	}
	s.mu.Unlock()
	if err := s.link.Send(msg, Wait{Deadline: dl, Cancel: w.Cancel}); err != nil {
		woken := exchangeState(stateWaiting)
		if !e.abandon() {
			<-e.ch // Fail or the timer already woke us: consume the token
			woken = e.settle()
		}
		if woken != stateFailed && (errors.Is(err, ErrAgentTimeout) || errors.Is(err, ErrAgentCanceled)) {
			// No room to queue the event in time: the same as no reply
			// in time (the connection is backed up, not lost).
			return nil, e.abandoned(err)
		}
		e.err = fmt.Errorf("%w: %s: send %s: %v", ErrAgentConnLost, s.cfg.Name, t, err)
		return nil, e.err
	}
	if w.Cancel == nil {
		<-e.ch
	} else {
		select {
		case <-e.ch:
		case <-w.Cancel:
			if e.abandon() {
				var why error
				if w.expired(time.Now()) {
					why = fmt.Errorf("%w: %s: request deadline exceeded", ErrAgentTimeout, s.cfg.Name)
				} else {
					why = fmt.Errorf("%w: %s: canceled", ErrAgentCanceled, s.cfg.Name)
				}
				return nil, e.abandoned(why)
			}
			// The reply (or the end of the session, or the deadline) won
			// the race with the cancel; take it.
			<-e.ch
		}
	}
	switch e.settle() {
	case stateFailed:
		s.mu.Lock()
		err := s.err
		s.mu.Unlock()
		e.err = err
		return nil, err
	case stateExpired:
		var why error
		if e.byMsg {
			why = fmt.Errorf("%w: %s: no reply to %s within %v", ErrAgentTimeout, s.cfg.Name, t, s.cfg.MessageTimeout)
		} else {
			why = fmt.Errorf("%w: %s: request deadline exceeded", ErrAgentTimeout, s.cfg.Name)
		}
		return nil, e.abandoned(why)
	}
	r := e.reply
	if r.Err != nil {
		s.protoErrs.Add(1)
		e.err = fmt.Errorf("%w: %s: %v", ErrAgentProtocol, s.cfg.Name, r.Err)
		e.kill()
		return nil, e.err
	}
	switch {
	case r.Type == protocol.TypeDecision:
	case r.Type == protocol.TypeBodyMutation && chunk && r.Mutation.ChunkIndex == index &&
		(r.Mutation.Phase == protocol.PhaseResponse) == (t == protocol.TypeResponseBodyChunk):
	default:
		s.protoErrs.Add(1)
		e.err = fmt.Errorf("%w: %s: %s is not a valid reply to %s", ErrAgentProtocol, s.cfg.Name, r.Type, t)
		e.kill()
		return nil, e.err
	}
	s.completed.Add(1)
	return r, nil
}

// timeoutMs is an event's timeout_ms: the wait from now to dl in whole
// milliseconds, rounded up, at least 1 and at most the field's range; 0
// when there is no deadline (unknown to the agent). Rounded up, and
// counted by the agent from when it reads the event (later than now), the
// agent's deadline is never earlier than the proxy's: it never gives up on
// an event whose answer would still be taken.
func timeoutMs(dl, now time.Time) uint32 {
	if dl.IsZero() {
		return 0
	}
	ms := (dl.Sub(now) + time.Millisecond - 1) / time.Millisecond
	switch {
	case ms < 1:
		return 1
	case ms > math.MaxUint32:
		return math.MaxUint32
	}
	return uint32(ms)
}

// settle reads how a waiting event ended, once its token was taken. No
// lock is needed: whoever ended the wait (Deliver, Fail, expire) set the
// state under s.mu before sending the token, and nobody changes a state
// that is no longer waiting except this exchange's own goroutine. An
// answered state stays until the next event (it is not waiting, so a
// second reply is late), an expired one for good (e.err is set).
func (e *Exchange) settle() exchangeState { return e.state }

// abandoned ends an exchange whose event timed out or was canceled (why
// wraps ErrAgentTimeout or ErrAgentCanceled) and tells the agent.
func (e *Exchange) abandoned(why error) error {
	if errors.Is(why, ErrAgentTimeout) {
		e.s.timeouts.Add(1)
	}
	e.err = why
	reason := "timeout"
	if errors.Is(why, ErrAgentCanceled) {
		// Canceled before the deadline: the client went away.
		reason = "client_disconnect"
	}
	e.sendCancel(reason)
	return why
}

// abandon stops waiting; it reports false when the reply already arrived.
func (e *Exchange) abandon() bool {
	s := e.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.state != stateWaiting {
		return false
	}
	delete(s.pending, e.id)
	e.state = stateDead
	return true
}

func (e *Exchange) kill() {
	s := e.s
	s.mu.Lock()
	e.state = stateDead
	s.mu.Unlock()
	e.sendCancel("protocol_error")
}

func (e *Exchange) sendCancel(reason string) {
	s := e.s
	if !s.caps.SupportsCancellation {
		return
	}
	m := &e.cancelMsg // encoded before SendControl returns
	m.RequestID = e.id
	m.Reason = reasonBytes(reason)
	if s.link.SendControl(m) == nil {
		s.cancels.Add(1)
	}
}

var reasons = map[string][]byte{}

func init() {
	for _, r := range []string{"timeout", "protocol_error", "client_disconnect", "decided", "shutdown"} {
		reasons[r] = []byte(r)
	}
}

func reasonBytes(r string) []byte {
	if b, ok := reasons[r]; ok {
		return b
	}
	return []byte(r)
}

// Cancel tells the agent to stop work on this request (client went away,
// an earlier agent decided) and ends the exchange's conversation. Replies
// that arrive afterwards are discarded and counted as late.
func (e *Exchange) Cancel(reason string) {
	if e.err != nil {
		return // already dead, and a CancelRequest went out if it could
	}
	e.err = fmt.Errorf("%w: %s: %s", ErrAgentCanceled, e.s.cfg.Name, reason)
	e.s.mu.Lock()
	e.state = stateDead
	e.s.mu.Unlock()
	e.sendCancel(reason)
}

// Finish releases the exchange's slot. The Exchange and any Reply it
// returned must not be used afterwards.
func (e *Exchange) Finish() {
	s := e.s
	// Nothing of it is left in s.pending: an event's wait always ends
	// with its entry removed (by Deliver, Fail, expire or abandon).
	if f, ok := s.link.(Finisher); ok {
		f.Finished(e.id)
	}
	<-s.sem
	s.inflight.Add(-1)
	e.s = nil
	e.err = nil
	exchangePool.Put(e)
}
