package extproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/protocol"
)

// Errors a request fails with (wrapped; the dataplane applies the agent's
// failure policy). Those delivered as a reply reach the dataplane as
// agentmux.ErrAgentProtocol.
var (
	// ErrWrongPhase: the processor answered with a response for another
	// phase than the one it was asked about.
	ErrWrongPhase = errors.New("extproc: response for the wrong phase")
	// ErrUnsolicited: the processor sent a response nothing was waiting for.
	ErrUnsolicited = errors.New("extproc: unsolicited response")
	// ErrStreamClosed: the processor's stream ended while the request
	// still expected an answer.
	ErrStreamClosed = errors.New("extproc: stream closed mid-request")
	// ErrUnsupported: the response uses a feature the proxy cannot apply
	// (see docs/transports.md).
	ErrUnsupported = errors.New("extproc: unsupported response")
	// ErrBufferLimit: a BUFFERED body is larger than buffer_limit.
	ErrBufferLimit = errors.New("extproc: body over buffer_limit")
)

// kind is the processor response an event waits for.
type kind uint8

const (
	kindNone kind = iota
	kindRequestHeaders
	kindRequestBody
	kindResponseHeaders
	kindResponseBody
)

func (k kind) String() string {
	return [...]string{"nothing", "request_headers", "request_body", "response_headers", "response_body"}[k]
}

// link is agentmux.Link over one HTTP/2 connection: each request id gets
// its own ExternalProcessor.Process stream, opened at its first event
// that goes to the processor and ended when the exchange finishes.
type link struct {
	c    *Client
	cli  extprocsvc.ExternalProcessorClient
	sess *agentmux.Session
	// keepFacts: the response attributes read the request, whose event
	// is copied for them.
	keepFacts bool

	mu      sync.Mutex
	streams map[uint64]*reqStream
	closed  bool
}

func newLink(c *Client, cli extprocsvc.ExternalProcessorClient) *link {
	return &link{c: c, cli: cli, streams: map[uint64]*reqStream{}, keepFacts: needsRequestFacts(c.cfg.ResponseAttrs)}
}

// get returns request id's state, creating it on its first event.
func (l *link) get(id uint64) (*reqStream, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, fmt.Errorf("%w: %s: closed", agentmux.ErrAgentConnLost, l.c.cfg.Name)
	}
	st := l.streams[id]
	if st == nil {
		st = &reqStream{l: l, id: id, mode: l.c.cfg.Mode}
		l.streams[id] = st
	}
	return st, nil
}

func (l *link) take(id uint64) *reqStream {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.streams[id]
	delete(l.streams, id)
	return st
}

// Send implements agentmux.Link: the event is mapped to a
// ProcessingRequest on its request's stream, or answered here when the
// request's processing mode does not send it to the processor.
func (l *link) Send(m protocol.Message, w agentmux.Wait) error {
	var id uint64
	switch m := m.(type) {
	case *protocol.RequestHeaders:
		id = m.RequestID
	case *protocol.ResponseHeaders:
		id = m.RequestID
	case *protocol.RequestBodyChunk:
		id = m.RequestID
	case *protocol.ResponseBodyChunk:
		id = m.RequestID
	default:
		return fmt.Errorf("%w: %s: cannot send %s", agentmux.ErrAgentConnLost, l.c.cfg.Name, m.MsgType())
	}
	st, err := l.get(id)
	if err != nil {
		return err
	}
	return st.event(m, w)
}

// SendControl implements agentmux.Link: a CancelRequest ends that
// request's stream, a CancelAll every stream. Nothing goes on the wire but
// the stream reset (ext_proc has no cancel message).
func (l *link) SendControl(m protocol.Message) error {
	switch m := m.(type) {
	case *protocol.CancelRequest:
		if st := l.take(m.RequestID); st != nil {
			st.abort()
		}
	case *protocol.CancelAll:
		l.abortAll(false)
	}
	return nil
}

// Finished implements agentmux.Finisher: the request is over, its stream
// is half-closed and given GraceTimeout to end.
func (l *link) Finished(id uint64) {
	if st := l.take(id); st != nil {
		st.finish()
	}
}

// Close implements agentmux.Link.
func (l *link) Close() error {
	l.abortAll(true)
	return nil
}

// abortAll aborts every stream; with closing, the link also takes no
// more.
func (l *link) abortAll(closing bool) {
	l.mu.Lock()
	if closing {
		l.closed = true
	}
	all := l.streams
	l.streams = map[uint64]*reqStream{}
	l.mu.Unlock()
	for _, st := range all {
		st.abort()
	}
}

// reqStream is one request's conversation with the processor.
type reqStream struct {
	l    *link
	id   uint64
	mode Mode // the configured mode, or the processor's honoured override

	// Set from the exchange's goroutine only (Send, Finished), in order.
	stream     extprocsvc.ExternalProcessor_ProcessClient
	readDone   chan struct{} // closed when the stream's reader is done
	sentFirst  bool
	halfClosed bool
	buf        []byte // a BUFFERED or BUFFERED_PARTIAL body being held
	// attrsSent: the attributes of each direction (0 request, 1
	// response) went with its first message.
	attrsSent [2]bool
	// hdrs is the memory of the request's header messages.
	hdrs headersMsg
	// timer cancels the stream when a send overruns its deadline
	// (timedOut says it did), and ends a finished request's stream after
	// GraceTimeout: one timer a request, reset for each.
	timer    *time.Timer
	timedOut atomic.Bool
	// facts and resp are copies of the request and response headers
	// events kept for attributes sent with a later message (nil when no
	// configured attribute needs them).
	facts *requestFacts
	resp  *protocol.ResponseHeaders

	mu sync.Mutex // guards what the reader goroutine shares
	// expect is the response the outstanding event waits for; chunk and
	// last describe it when it is a body.
	expect kind
	chunk  uint32
	last   bool
	// held is the body the outstanding body message carries when it was
	// held back (BUFFERED, BUFFERED_PARTIAL): it replaces the last chunk,
	// the earlier ones having been dropped. partial: BUFFERED_PARTIAL.
	held    []byte
	rest    []byte
	isHeld  bool
	partial bool
	cancel  context.CancelFunc
	// err, once set, fails every later event (a broken stream); ended
	// says the processor closed the stream cleanly with nothing
	// outstanding: later events pass without it, as Envoy does.
	err   error
	ended bool
	spare *agentmux.Reply
	done  bool // aborted or finished: a late response is dropped
}

// deliver hands d (or err) to the exchange as the reply to its event.
// Called with st.mu held.
func (st *reqStream) deliverLocked(fill func(d *protocol.Decision), err error) {
	r := st.spare
	st.spare = nil
	if r == nil {
		r = new(agentmux.Reply)
	}
	r.Type = protocol.TypeDecision
	r.Decision.Reset()
	r.Decision.RequestID = st.id
	r.Err = err
	if err == nil && fill != nil {
		fill(&r.Decision)
	}
	st.spare = st.l.sess.Deliver(r)
	st.spare.Err = nil
}

// answer replies to the event at once, without the processor.
func (st *reqStream) answer(fill func(d *protocol.Decision), err error) error {
	st.mu.Lock()
	st.expect = kindNone
	st.deliverLocked(fill, err)
	st.mu.Unlock()
	return nil
}

func allowFinal(d *protocol.Decision) { d.Kind = protocol.DecisionAllow }

// event handles one event of the request.
func (st *reqStream) event(m protocol.Message, w agentmux.Wait) error {
	st.mu.Lock()
	err, ended := st.err, st.ended
	st.mu.Unlock()
	if err != nil {
		return st.answer(nil, err)
	}
	var pr *extprocsvc.ProcessingRequest
	var k kind
	var chunk uint32
	var last bool
	var held heldBody
	switch m := m.(type) {
	case *protocol.RequestHeaders:
		sent := !ended && sends(st.mode.RequestHeader, true)
		if st.l.keepFacts || (!sent && len(st.l.c.cfg.RequestAttrs) > 0) {
			// Attributes sent with a later message read the request.
			st.facts = cloneFacts(m)
		}
		if !sent {
			return st.answer(allowFinal, nil)
		}
		pr, k = st.requestHeaders(m), kindRequestHeaders
	case *protocol.ResponseHeaders:
		if ended || !sends(st.mode.ResponseHeader, true) {
			if !ended && len(st.l.c.cfg.ResponseAttrs) > 0 {
				st.resp = cloneResponse(m)
			}
			return st.answer(allowFinal, nil)
		}
		pr, k = st.responseHeaders(m), kindResponseHeaders
	case *protocol.RequestBodyChunk:
		if ended {
			return st.answer(allowFinal, nil)
		}
		pr, held, err = st.body(protocol.PhaseRequest, (*protocol.BodyChunk)(m), st.mode.RequestBody)
		k, chunk, last = kindRequestBody, m.ChunkIndex, m.IsLast
	case *protocol.ResponseBodyChunk:
		if ended {
			return st.answer(allowFinal, nil)
		}
		pr, held, err = st.body(protocol.PhaseResponse, (*protocol.BodyChunk)(m), st.mode.ResponseBody)
		k, chunk, last = kindResponseBody, m.ChunkIndex, m.IsLast
	}
	if err != nil || pr == nil {
		return err // answered already (body held, mode NONE, limit)
	}
	st.mu.Lock()
	st.expect, st.chunk, st.last = k, chunk, last
	st.held, st.rest, st.isHeld, st.partial = held.data, held.rest, held.on, held.partial
	st.mu.Unlock()
	if err := st.send(pr, w); err != nil {
		st.mu.Lock()
		st.expect = kindNone
		if st.err == nil {
			st.err = err
		}
		st.mu.Unlock()
		return err
	}
	return nil
}

// heldBody describes a body message that carries a held-back body.
type heldBody struct {
	data        []byte
	rest        []byte // BUFFERED_PARTIAL: what follows data, not sent
	on, partial bool
}

// body maps one chunk under body mode bm. It returns nil (and has
// answered) when the chunk does not go to the processor now.
func (st *reqStream) body(p protocol.Phase, m *protocol.BodyChunk, bm BodyMode) (*extprocsvc.ProcessingRequest, heldBody, error) {
	cfg := &st.l.c.cfg
	switch bm {
	case extprocfilter.ProcessingMode_BUFFERED, extprocfilter.ProcessingMode_BUFFERED_PARTIAL:
		partial := bm == extprocfilter.ProcessingMode_BUFFERED_PARTIAL
		if !partial && len(st.buf)+len(m.Data) > cfg.BufferLimit {
			st.l.c.count(evBufferLimit)
			st.buf = nil
			return nil, heldBody{}, st.answer(nil, fmt.Errorf("%w: more than %d bytes", ErrBufferLimit, cfg.BufferLimit))
		}
		st.buf = append(st.buf, m.Data...)
		if !m.IsLast && (!partial || len(st.buf) < cfg.BufferLimit) {
			// Held back: forwarded, whole, in place of the last chunk.
			idx := m.ChunkIndex
			return nil, heldBody{}, st.answer(func(d *protocol.Decision) {
				d.Kind, d.NeedsMore = protocol.DecisionAllow, true
				setMutation(d, p, idx, protocol.MutationDrop, nil)
			}, nil)
		}
		h := heldBody{data: st.buf, on: true, partial: partial}
		st.buf = nil
		eos := m.IsLast
		if partial && len(h.data) > cfg.BufferLimit {
			// The processor gets buffer_limit bytes; the rest passes.
			h.data, h.rest = h.data[:cfg.BufferLimit], h.data[cfg.BufferLimit:]
			eos = false
		}
		return st.bodyRequest(p, h.data, eos), h, nil
	case extprocfilter.ProcessingMode_STREAMED:
		return st.bodyRequest(p, m.Data, m.IsLast), heldBody{}, nil
	}
	// NONE for this request (the agent handles bodies for other modes):
	// the processor's say over this body ends here.
	return nil, heldBody{}, st.answer(allowFinal, nil)
}

func setMutation(d *protocol.Decision, p protocol.Phase, idx uint32, a protocol.MutationAction, data []byte) {
	bm := protocol.BodyMutation{RequestID: d.RequestID, Phase: p, ChunkIndex: idx, Action: a, Data: data}
	if p == protocol.PhaseResponse {
		d.HasResponseBodyMutation, d.ResponseBodyMutation = true, bm
	} else {
		d.HasRequestBodyMutation, d.RequestBodyMutation = true, bm
	}
}

// send opens the stream on the first message and sends pr. A send that
// cannot finish by w's deadline (a connection not ready, a processor
// that stopped reading) has its stream canceled.
func (st *reqStream) send(pr *extprocsvc.ProcessingRequest, w agentmux.Wait) error {
	dl, _ := agentmux.MessageDeadline(w, time.Now(), st.l.c.cfg.MessageTimeout)
	if st.stream == nil {
		ctx, cancel := context.WithCancel(context.Background())
		st.mu.Lock()
		st.cancel = cancel
		aborted := st.done
		st.mu.Unlock()
		if aborted {
			cancel()
		}
		armed := st.arm(dl)
		s, err := st.l.cli.Process(ctx)
		if err != nil {
			st.disarm(armed)
			cancel()
			return st.sendError(err, st.timedOut.Load())
		}
		st.stream = s
		st.readDone = make(chan struct{})
		st.l.c.count(evStreams)
		go st.read(s, cancel, st.readDone)
	}
	armed := st.arm(dl)
	err := st.stream.Send(pr)
	st.disarm(armed)
	if errors.Is(err, io.EOF) && st.cleanEnd(dl) {
		// The processor had ended the stream cleanly before this event:
		// it is done with the request (see streamEnded).
		return st.answer(allowFinal, nil)
	}
	if err != nil {
		st.stopStream()
		return st.sendError(err, st.timedOut.Load())
	}
	return nil
}

// arm sets the timer to cancel the stream at dl (none when dl is zero);
// it reports whether it did.
func (st *reqStream) arm(dl time.Time) bool {
	if dl.IsZero() {
		return false
	}
	if st.timer == nil {
		st.timer = time.AfterFunc(time.Until(dl), st.expired)
	} else {
		st.timer.Reset(time.Until(dl))
	}
	return true
}

func (st *reqStream) disarm(armed bool) {
	if armed {
		st.timer.Stop()
	}
}

// expired is the timer's: the send (or the finished request's grace) is
// over; the stream is canceled.
func (st *reqStream) expired() {
	st.timedOut.Store(true)
	st.stopStream()
}

// cleanEnd waits (until dl at most) for the reader to learn how the
// stream ended and reports whether the processor ended it cleanly.
func (st *reqStream) cleanEnd(dl time.Time) bool {
	var tc <-chan time.Time
	if !dl.IsZero() {
		t := time.NewTimer(time.Until(dl))
		defer t.Stop()
		tc = t.C
	}
	select {
	case <-st.readDone:
	case <-tc:
		return false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended {
		st.err = nil
		st.expect = kindNone
		return true
	}
	return false
}

func (st *reqStream) sendError(err error, timedOut bool) error {
	name := st.l.c.cfg.Name
	if timedOut {
		return fmt.Errorf("%w: %s: could not send to the processor in time", agentmux.ErrAgentTimeout, name)
	}
	if err == io.EOF {
		err = ErrStreamClosed
	}
	return fmt.Errorf("%w: %s: send: %v", agentmux.ErrAgentConnLost, name, rpcError(err))
}

// read receives the processor's responses until the stream ends.
func (st *reqStream) read(s extprocsvc.ExternalProcessor_ProcessClient, cancel context.CancelFunc, done chan struct{}) {
	defer close(done)
	defer cancel()
	for {
		resp, err := s.Recv()
		if err != nil {
			st.streamEnded(err)
			return
		}
		st.response(resp)
	}
}

// streamEnded: the stream is over. An event still waiting fails; with
// nothing waiting, a clean end lets later events pass (Envoy's "processing
// complete") and an error fails them.
func (st *reqStream) streamEnded(err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.done {
		return
	}
	var why error
	if err == io.EOF {
		why = fmt.Errorf("%w: the processor ended the stream", ErrStreamClosed)
	} else {
		why = fmt.Errorf("%w: %v", ErrStreamClosed, rpcError(err))
	}
	if st.expect != kindNone {
		st.l.c.count(evStreamClosed)
		st.expect = kindNone
		st.err = why
		st.deliverLocked(nil, why)
		return
	}
	if err == io.EOF {
		st.ended = true
		st.l.c.count(evProcessorDone)
		return
	}
	if st.err == nil {
		st.err = why
	}
}

// response maps one ProcessingResponse onto the reply the outstanding
// event waits for.
func (st *reqStream) response(resp *extprocsvc.ProcessingResponse) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.done {
		return
	}
	c := st.l.c
	want := st.expect
	if want == kindNone {
		c.count(evUnsolicited)
		st.err = fmt.Errorf("%w: %s", ErrUnsolicited, responseKind(resp))
		st.sess().CountProtocolError()
		if st.cancel != nil {
			st.cancel()
		}
		return
	}
	st.expect = kindNone
	fill, err := st.mapResponse(want, resp)
	if err != nil {
		st.err = err
		if errors.Is(err, ErrWrongPhase) {
			c.count(evWrongPhase)
		}
		if st.cancel != nil {
			st.cancel()
		}
	}
	st.deliverLocked(fill, err)
}

func (st *reqStream) sess() *agentmux.Session { return st.l.sess }

// abort ends the stream now (a cancel, or the connection closing).
func (st *reqStream) abort() {
	st.mu.Lock()
	st.done = true
	st.mu.Unlock()
	st.stopStream()
}

// stopStream cancels the stream, if one was opened.
func (st *reqStream) stopStream() {
	st.mu.Lock()
	cancel := st.cancel
	st.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// finish half-closes the stream of a request that is over; the processor
// gets GraceTimeout to end it before it is canceled.
func (st *reqStream) finish() {
	st.mu.Lock()
	st.done = true
	st.mu.Unlock()
	if st.stream == nil {
		return
	}
	if !st.halfClosed {
		st.halfClosed = true
		_ = st.stream.CloseSend()
	}
	if st.timer == nil {
		st.timer = time.AfterFunc(st.l.c.cfg.GraceTimeout, st.expired)
	} else {
		st.timer.Reset(st.l.c.cfg.GraceTimeout)
	}
}

// rpcError shortens a gRPC status error for logs and replies.
func rpcError(err error) error {
	if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
		msg := s.Message()
		if len(msg) > 256 {
			msg = msg[:256] + "…"
		}
		return fmt.Errorf("%s: %s", s.Code(), msg)
	}
	return err
}
