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
	wd        watchdog
	// The requests' streams by id, in shards: every event of every
	// request looks its stream up, and the requests of a connection run
	// on as many goroutines.
	shards [linkShards]linkShard
}

const linkShards = 8

type linkShard struct {
	mu      sync.Mutex
	streams map[uint64]*reqStream
	closed  bool
	_       [40]byte // a shard a cache line
}

func newLink(c *Client, cli extprocsvc.ExternalProcessorClient) *link {
	l := &link{c: c, cli: cli, keepFacts: needsRequestFacts(c.cfg.ResponseAttrs)}
	for i := range l.shards {
		l.shards[i].streams = map[uint64]*reqStream{}
	}
	return l
}

func (l *link) shard(id uint64) *linkShard { return &l.shards[id%linkShards] }

// get returns request id's state, creating it on its first event.
func (l *link) get(id uint64) (*reqStream, error) {
	sh := l.shard(id)
	sh.mu.Lock()
	if sh.closed {
		sh.mu.Unlock()
		return nil, fmt.Errorf("%w: %s: closed", agentmux.ErrAgentConnLost, l.c.cfg.Name)
	}
	st := sh.streams[id]
	if st == nil {
		st = newReqStream(l, id)
		sh.streams[id] = st
	}
	sh.mu.Unlock()
	return st, nil
}

func (l *link) take(id uint64) *reqStream {
	sh := l.shard(id)
	sh.mu.Lock()
	st := sh.streams[id]
	delete(sh.streams, id)
	sh.mu.Unlock()
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
	l.wd.stop()
	return nil
}

// abortAll aborts every stream; with closing, the link also takes no
// more.
func (l *link) abortAll(closing bool) {
	var all []*reqStream
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		if closing {
			sh.closed = true
		}
		for _, st := range sh.streams {
			all = append(all, st)
		}
		clear(sh.streams)
		sh.mu.Unlock()
	}
	for _, st := range all {
		st.abort()
	}
}

// reqStream is one request's conversation with the processor.
//
// Its memory is reused by a later request (streamPool) once both the
// exchange and the stream's reader are done with it: refs counts them.
// A stream taken out of the link by a cancel or a CancelAll is left to the
// garbage collector instead (whoever still holds it is not known).
type reqStream struct {
	l    *link
	id   uint64
	mode Mode // the configured mode, or the processor's honoured override
	refs atomic.Int32

	// Set from the exchange's goroutine only (Send, Finished), in order.
	stream     extprocsvc.ExternalProcessor_ProcessClient
	sentFirst  bool
	halfClosed bool
	buf        []byte // a BUFFERED or BUFFERED_PARTIAL body being held
	// attrsSent: the attributes of each direction (0 request, 1
	// response) went with its first message.
	attrsSent [2]bool
	// hdrs is the memory of the request's header messages (kept for the
	// next request that reuses this reqStream).
	hdrs headersMsg
	// timedOut: the watchdog canceled the stream (a send overran its
	// deadline, or a finished request's grace ran out).
	timedOut atomic.Bool
	// facts and resp are copies of the request and response headers
	// events kept for attributes sent with a later message (nil when no
	// configured attribute needs them).
	facts *requestFacts
	resp  *protocol.ResponseHeaders
	// exited gets a token when the stream's reader is done.
	exited chan struct{}

	// Guarded by the link's watchdog's mutex.
	wnext, wprev *reqStream
	wdl          time.Time
	watched      bool

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
	// cancel ends the stream (set once, when it is opened, before the
	// watchdog may see it).
	cancel context.CancelFunc
	// err, once set, fails every later event (a broken stream); ended
	// says the processor closed the stream cleanly with nothing
	// outstanding: later events pass without it, as Envoy does.
	err   error
	ended bool
	spare *agentmux.Reply
	done  bool // aborted or finished: a late response is dropped
	// readerDone: the stream's reader has seen its end.
	readerDone bool
}

var streamPool = sync.Pool{New: func() any { return &reqStream{exited: make(chan struct{}, 1)} }}

func newReqStream(l *link, id uint64) *reqStream {
	st := streamPool.Get().(*reqStream)
	st.l, st.id, st.mode = l, id, l.c.cfg.Mode
	st.refs.Store(1) // the exchange's; the reader takes one more
	return st
}

// release drops one reference; the last one puts the memory back.
func (st *reqStream) release() {
	if st.refs.Add(-1) != 0 {
		return
	}
	// Nobody else refers to st: the exchange is finished, the reader
	// gone, and the watchdog let it go (unwatch) before either returned.
	select {
	case <-st.exited:
	default:
	}
	st.l, st.id, st.mode = nil, 0, Mode{}
	st.stream, st.sentFirst, st.halfClosed, st.buf = nil, false, false, nil
	st.attrsSent = [2]bool{}
	st.timedOut.Store(false)
	st.facts, st.resp = nil, nil
	st.expect, st.chunk, st.last = kindNone, 0, false
	st.held, st.rest, st.isHeld, st.partial = nil, nil, false, false
	st.cancel, st.err, st.ended, st.done, st.readerDone = nil, nil, false, false, false
	st.hdrs.clear()
	streamPool.Put(st)
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
	// The session has folded MessageTimeout into w's deadline (it is
	// configured with the same one, see Client.maintain); a Wait without
	// one gets it here.
	dl := w.Deadline
	if dl.IsZero() && st.l.c.cfg.MessageTimeout > 0 {
		dl = time.Now().Add(st.l.c.cfg.MessageTimeout)
	}
	wd := &st.l.wd
	if st.stream == nil {
		ctx, cancel := context.WithCancel(context.Background())
		st.mu.Lock()
		st.cancel = cancel
		aborted := st.done
		st.mu.Unlock()
		if aborted {
			cancel()
		}
		if !dl.IsZero() {
			wd.watch(st, dl)
		}
		s, err := st.l.cli.Process(ctx)
		if err != nil {
			wd.unwatch(st)
			cancel()
			return st.sendError(err, st.timedOut.Load())
		}
		st.stream = s
		st.l.c.count(evStreams)
		st.refs.Add(1) // the reader's
		go st.read(s)
	} else if !dl.IsZero() {
		wd.watch(st, dl)
	}
	err := st.stream.Send(pr)
	if !dl.IsZero() {
		wd.unwatch(st)
	}
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
	case <-st.exited:
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
func (st *reqStream) read(s extprocsvc.ExternalProcessor_ProcessClient) {
	for {
		resp, err := s.Recv()
		if err != nil {
			st.streamEnded(err)
			break
		}
		st.response(resp)
	}
	// The stream is over (grpc-go has released it); this frees the
	// context.
	st.cancel()
	// A grace being watched (finish saw the reader running) ends here.
	st.l.wd.unwatch(st)
	st.exited <- struct{}{}
	st.release()
}

// streamEnded: the stream is over. An event still waiting fails; with
// nothing waiting, a clean end lets later events pass (Envoy's "processing
// complete") and an error fails them.
func (st *reqStream) streamEnded(err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.readerDone = true
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
// gets GraceTimeout to end it before it is canceled. It is the exchange's
// last use of st.
func (st *reqStream) finish() {
	st.mu.Lock()
	st.done = true
	st.mu.Unlock()
	if st.stream != nil && !st.halfClosed {
		st.halfClosed = true
		_ = st.stream.CloseSend()
	}
	st.mu.Lock()
	if st.stream != nil && !st.readerDone {
		// The reader unwatches when it sees the end, which it has not.
		st.l.wd.watch(st, time.Now().Add(st.l.c.cfg.GraceTimeout))
	}
	st.mu.Unlock()
	st.release()
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
