// Package authcall runs authorization services that answer one call per
// HTTP request (Envoy ext_authz's Check, an HTTP forward-auth endpoint)
// as agents: an agentmux.Link whose RequestHeaders event is the call and
// whose reply is the service's verdict, mapped onto a protocol.Decision
// by the transport's Checker.
//
// Unlike the transports that multiplex frames over one connection, the
// link makes the call in Send itself, on the request's goroutine, bounded
// by the event's Wait (the deadline agentmux folds the message timeout
// into, and the request's cancel channel). The request's goroutine would
// wait for the reply anyway; making the call here keeps its outcome
// typed: a call that timed out fails with agentmux.ErrAgentTimeout, one
// that could not reach the service with agentmux.ErrAgentConnLost (both
// count for the circuit breaker and may fail over to another member),
// and an answer that cannot be applied is delivered as the request's
// protocol error. Nothing is kept per request after Send returns.
//
// A Checker gets the call's bounds as a context, which costs a context
// and a goroutine per call (the request's cancel channel is not a
// context); a WaitChecker gets the Wait itself and keeps to it on its
// own, for a transport whose calls are cheap enough for that to matter.
package authcall

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/protocol"
)

// ErrBadAnswer marks an answer of the service that cannot be applied (a
// Checker wraps it): the request fails with agentmux.ErrAgentProtocol
// and its agent's failure policy decides.
var ErrBadAnswer = errors.New("authcall: answer cannot be applied")

// Checker asks the authorization service about one request.
type Checker interface {
	// Check calls the service about the request m, whose body is body
	// (nil: not sent to the service), and fills d (reset, its RequestID
	// set) with the verdict. ctx bounds the call. An error wrapping
	// ErrBadAnswer is the service's fault; any other error means no
	// verdict was had (unreachable, broken connection, timed out). m,
	// body and their buffers are the caller's: d must not alias them.
	Check(ctx context.Context, m *protocol.RequestHeaders, body []byte, d *protocol.Decision) error
}

// BodyChecker is a Checker that is told, with a request's body, whether
// the body is whole or was cut at the agent's limit (request_body
// over_limit prefix): Envoy's ext_authz tells its server so in the
// x-envoy-auth-partial-body header. A Link over a BodyChecker calls
// CheckBody for every call with a body, Check for the others.
type BodyChecker interface {
	Checker
	// CheckBody is Check with partial: body is the first bytes of a
	// longer request body.
	CheckBody(ctx context.Context, m *protocol.RequestHeaders, body []byte, partial bool, d *protocol.Decision) error
}

// WaitChecker is a Checker that keeps to the request's wait itself,
// without a context: its call ends by w.Deadline (an error wrapping
// context.DeadlineExceeded), soon after w.Cancel is closed, and when
// Abort is called. The link then spends no context and no goroutine per
// call; a Link over a plain Checker spends both (a context for the
// deadline, a goroutine relaying the cancel channel to it).
type WaitChecker interface {
	Checker
	// CheckWait is Check bounded by w.
	CheckWait(w agentmux.Wait, m *protocol.RequestHeaders, body []byte, d *protocol.Decision) error
	// Abort ends every call in flight (CancelAll, Close): they fail as
	// calls that lost their connection.
	Abort()
}

// Link is an agentmux.Link that makes one Check call per request.
//
// With WithBody, the call waits for the request body (the agent's
// capabilities then take buffered request bodies): a request without one
// is checked at its headers, one whose whole body rides inline in its
// headers event too; otherwise the headers event is answered "go on" and
// kept, the chunks are kept and answered "more", and the last chunk is
// the call, its verdict the answer to it. The dataplane holds a buffered
// body back from the upstream until that answer, within the agent's
// request_body limit (so the kept body is bounded by it).
type Link struct {
	name     string
	chk      Checker
	wchk     WaitChecker // chk, when it is one
	bchk     BodyChecker // chk, when it is one
	withBody bool
	sess     atomic.Pointer[agentmux.Session]

	// held are the requests waiting for their body, by request id.
	heldMu sync.Mutex
	held   map[uint64]*heldRequest

	// base is the parent of every call's context: CancelAll and Close
	// cancel it (and Close keeps it canceled).
	mu     sync.Mutex
	base   context.Context
	stop   context.CancelFunc
	closed bool

	spare sync.Pool // *agentmux.Reply
}

// heldRequest is a request waiting for its body: a copy of its headers
// event and the body so far.
type heldRequest struct {
	m    *protocol.RequestHeaders
	body []byte
}

// NewLink returns a link that asks chk, with the request body when
// withBody; name labels errors. SetSession must be called with the
// session over it before it carries a request.
func NewLink(name string, chk Checker, withBody bool) *Link {
	l := &Link{name: name, chk: chk, withBody: withBody, held: map[uint64]*heldRequest{}}
	l.wchk, _ = chk.(WaitChecker)
	l.bchk, _ = chk.(BodyChecker)
	l.base, l.stop = context.WithCancel(context.Background())
	return l
}

// SetSession sets the session the link delivers its verdicts to.
func (l *Link) SetSession(s *agentmux.Session) { l.sess.Store(s) }

func (l *Link) ctx() (context.Context, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, fmt.Errorf("%w: %s: closed", agentmux.ErrAgentConnLost, l.name)
	}
	return l.base, nil
}

func allow(d *protocol.Decision) error { d.Kind = protocol.DecisionAllow; return nil }

func more(d *protocol.Decision) error {
	d.Kind, d.NeedsMore = protocol.DecisionAllow, true
	return nil
}

// Send implements agentmux.Link: the request's call, made here within w,
// at its headers event or (WithBody) at the last chunk of its body; the
// other events are answered at once.
func (l *Link) Send(m protocol.Message, w agentmux.Wait) error {
	switch m := m.(type) {
	case *protocol.RequestHeaders:
		if !l.withBody || !m.HasBody {
			return l.call(m, nil, false, w)
		}
		if ib := &m.InlineBody; m.HasInlineBody && ib.IsLast {
			return l.call(m, ib.Data, cut(len(ib.Data), ib.TotalSize, ib.Progress), w)
		}
		h := &heldRequest{m: cloneHeaders(m)}
		if m.HasInlineBody {
			h.body = append(h.body, m.InlineBody.Data...)
		}
		l.heldMu.Lock()
		l.held[m.RequestID] = h
		l.heldMu.Unlock()
		if m.HasInlineBody {
			l.deliver(m.RequestID, more)
		} else {
			l.deliver(m.RequestID, allow)
		}
		return nil
	case *protocol.RequestBodyChunk:
		l.heldMu.Lock()
		h := l.held[m.RequestID]
		if h != nil && m.IsLast {
			delete(l.held, m.RequestID)
		}
		l.heldMu.Unlock()
		if h == nil {
			l.deliver(m.RequestID, allow) // checked at its headers
			return nil
		}
		h.body = append(h.body, m.Data...)
		if !m.IsLast {
			l.deliver(m.RequestID, more)
			return nil
		}
		return l.call(h.m, h.body, cut(len(h.body), m.TotalSize, m.Progress), w)
	case *protocol.ResponseHeaders:
		l.deliver(m.RequestID, allow)
	case *protocol.ResponseBodyChunk:
		l.deliver(m.RequestID, allow)
	default:
		return fmt.Errorf("%w: %s: cannot send %s", agentmux.ErrAgentConnLost, l.name, m.MsgType())
	}
	return nil
}

// cut reports whether a body of n bytes, given with its last chunk, is
// the prefix of a longer one: the client's body is longer (total, its
// Content-Length) or more of it was read (progress). The dataplane gives
// an agent the first limit bytes of a body over its limit (over_limit
// prefix) as a whole buffered body, its last chunk marked is_last.
func cut(n int, total, progress int64) bool {
	return total > int64(n) || progress > int64(n)
}

// Finished implements agentmux.Finisher: a request that ended before the
// last chunk of its body (refused, canceled) lets its copy go.
func (l *Link) Finished(id uint64) {
	if !l.withBody {
		return
	}
	l.heldMu.Lock()
	delete(l.held, id)
	l.heldMu.Unlock()
}

// call makes the call about rh (body: its body, or nil; partial: the
// body was cut at the limit) within w and delivers the verdict to rh's
// exchange.
func (l *Link) call(rh *protocol.RequestHeaders, body []byte, partial bool, w agentmux.Wait) error {
	base, err := l.ctx()
	if err != nil {
		return err
	}
	if l.wchk != nil {
		return l.callWait(rh, body, w)
	}
	var ctx context.Context
	var cancel context.CancelFunc
	if !w.Deadline.IsZero() {
		ctx, cancel = context.WithDeadline(base, w.Deadline)
	} else {
		ctx, cancel = context.WithCancel(base)
	}
	defer cancel()
	if w.Cancel != nil {
		// The request's cancel channel (the client went away) ends the
		// call: one goroutine while the call runs, the price of a
		// channel that is not a context. It ends with ctx, which the
		// deferred cancel ends when the call returns (the gRPC call
		// makes ctx's Done channel anyway: no channel of its own).
		done := ctx.Done()
		go func() {
			select {
			case <-w.Cancel:
				cancel()
			case <-done:
			}
		}()
	}
	var cerr error
	l.deliver(rh.RequestID, func(d *protocol.Decision) error {
		var err error
		if l.bchk != nil && body != nil {
			err = l.bchk.CheckBody(ctx, rh, body, partial, d)
		} else {
			err = l.chk.Check(ctx, rh, body, d)
		}
		if err == nil || errors.Is(err, ErrBadAnswer) {
			return err // delivered: a verdict, or the service's fault
		}
		cerr = err
		return errNoReply
	})
	if cerr == nil {
		return nil
	}
	switch {
	case ctx.Err() != nil && w.Cancel != nil && isClosed(w.Cancel):
		return fmt.Errorf("%w: %s: canceled", agentmux.ErrAgentCanceled, l.name)
	case errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(cerr, context.DeadlineExceeded):
		return fmt.Errorf("%w: %s: no answer in time: %v", agentmux.ErrAgentTimeout, l.name, cerr)
	}
	// agentmux wraps it as agentmux.ErrAgentConnLost, naming the agent.
	return cerr
}

// callWait is call for a WaitChecker: w goes to the checker as it is.
func (l *Link) callWait(rh *protocol.RequestHeaders, body []byte, w agentmux.Wait) error {
	var cerr error
	l.deliver(rh.RequestID, func(d *protocol.Decision) error {
		err := l.wchk.CheckWait(w, rh, body, d)
		if err == nil || errors.Is(err, ErrBadAnswer) {
			return err
		}
		cerr = err
		return errNoReply
	})
	if cerr == nil {
		return nil
	}
	// A cancel at or after the deadline counts as the deadline (as
	// agentmux.Wait has it).
	late := !w.Deadline.IsZero() && !time.Now().Before(w.Deadline)
	switch {
	case late || errors.Is(cerr, context.DeadlineExceeded):
		return fmt.Errorf("%w: %s: no answer in time: %v", agentmux.ErrAgentTimeout, l.name, cerr)
	case w.Cancel != nil && isClosed(w.Cancel):
		return fmt.Errorf("%w: %s: canceled", agentmux.ErrAgentCanceled, l.name)
	}
	return cerr
}

// errNoReply: the call failed before a verdict; Send returns its error
// instead of delivering one.
var errNoReply = errors.New("no reply")

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// deliver fills a reply with fill and hands it to the session; a fill
// that fails with errNoReply delivers nothing.
func (l *Link) deliver(id uint64, fill func(d *protocol.Decision) error) {
	r, _ := l.spare.Get().(*agentmux.Reply)
	if r == nil {
		r = new(agentmux.Reply)
	}
	r.Type = protocol.TypeDecision
	r.Decision.Reset()
	r.Decision.RequestID = id
	r.Err = nil
	err := fill(&r.Decision)
	if errors.Is(err, errNoReply) {
		l.spare.Put(r)
		return
	}
	if err != nil {
		r.Decision.Reset()
		r.Decision.RequestID = id
		r.Err = err
	}
	sess := l.sess.Load()
	if sess == nil {
		l.spare.Put(r)
		return
	}
	old := sess.Deliver(r)
	old.Err = nil
	l.spare.Put(old)
}

// SendControl implements agentmux.Link: CancelAll ends every call in
// flight. A CancelRequest has nothing to end: a request's call is over
// when its Send returns.
func (l *Link) SendControl(m protocol.Message) error {
	if _, ok := m.(*protocol.CancelAll); ok {
		l.mu.Lock()
		l.stop()
		if !l.closed {
			l.base, l.stop = context.WithCancel(context.Background())
		}
		l.mu.Unlock()
		if l.wchk != nil {
			l.wchk.Abort()
		}
	}
	return nil
}

// Close implements agentmux.Link: calls in flight end, and no more start.
func (l *Link) Close() error {
	l.mu.Lock()
	l.closed = true
	l.stop()
	l.mu.Unlock()
	if l.wchk != nil {
		l.wchk.Abort()
	}
	return nil
}

// cloneHeaders copies a headers event (its buffers are the dataplane's,
// reused once the event is answered), for the call at its last chunk.
func cloneHeaders(m *protocol.RequestHeaders) *protocol.RequestHeaders {
	cp := func(b []byte) []byte {
		if b == nil {
			return nil
		}
		return append([]byte(nil), b...)
	}
	c := &protocol.RequestHeaders{
		RequestID: m.RequestID, Method: cp(m.Method), URI: cp(m.URI), RequestTarget: cp(m.RequestTarget),
		HasBody: m.HasBody, Headers: make(protocol.Headers, len(m.Headers)),
	}
	for i := range m.Headers {
		c.Headers[i] = protocol.Header{Name: cp(m.Headers[i].Name), Value: cp(m.Headers[i].Value)}
	}
	md := &m.Metadata
	c.Metadata = protocol.Metadata{
		CorrelationID: cp(md.CorrelationID), ClientIP: cp(md.ClientIP), ClientPort: md.ClientPort,
		Protocol: cp(md.Protocol), ServerName: cp(md.ServerName), RouteID: cp(md.RouteID),
		UpstreamID: cp(md.UpstreamID), Traceparent: cp(md.Traceparent), Timestamp: cp(md.Timestamp),
		TLSVersion: cp(md.TLSVersion), TLSCipher: cp(md.TLSCipher), TLSServerName: cp(md.TLSServerName),
		TLSClientSubject: cp(md.TLSClientSubject), TLSClientSAN: cp(md.TLSClientSAN),
		ServerIP: cp(md.ServerIP), ServerPort: md.ServerPort, ListenerID: cp(md.ListenerID),
		UpstreamHost: cp(md.UpstreamHost), ForwardedFor: cp(md.ForwardedFor),
		ForwardedProto: cp(md.ForwardedProto), ForwardedHost: cp(md.ForwardedHost),
	}
	return c
}
