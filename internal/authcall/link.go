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
package authcall

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/protocol"
)

// ErrBadAnswer marks an answer of the service that cannot be applied (a
// Checker wraps it): the request fails with agentmux.ErrAgentProtocol
// and its agent's failure policy decides.
var ErrBadAnswer = errors.New("authcall: answer cannot be applied")

// Checker asks the authorization service about one request.
type Checker interface {
	// Check calls the service about the request m and fills d (reset,
	// its RequestID set) with the verdict. ctx bounds the call. An error
	// wrapping ErrBadAnswer is the service's fault; any other error means
	// no verdict was had (unreachable, broken connection, timed out).
	// m and its buffers are the caller's: d must not alias them.
	Check(ctx context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error
}

// Link is an agentmux.Link that makes one Check call per request.
type Link struct {
	name string
	chk  Checker
	sess atomic.Pointer[agentmux.Session]

	// base is the parent of every call's context: CancelAll and Close
	// cancel it (and Close keeps it canceled).
	mu     sync.Mutex
	base   context.Context
	stop   context.CancelFunc
	closed bool

	spare sync.Pool // *agentmux.Reply
}

// NewLink returns a link that asks chk; name labels errors. SetSession
// must be called with the session over it before it carries a request.
func NewLink(name string, chk Checker) *Link {
	l := &Link{name: name, chk: chk}
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

// Send implements agentmux.Link: a RequestHeaders event is the call, made
// here within w; any other event (none is asked for: the capabilities
// only take request headers) is allowed at once.
func (l *Link) Send(m protocol.Message, w agentmux.Wait) error {
	rh, ok := m.(*protocol.RequestHeaders)
	if !ok {
		var id uint64
		switch m := m.(type) {
		case *protocol.ResponseHeaders:
			id = m.RequestID
		case *protocol.RequestBodyChunk:
			id = m.RequestID
		case *protocol.ResponseBodyChunk:
			id = m.RequestID
		default:
			return fmt.Errorf("%w: %s: cannot send %s", agentmux.ErrAgentConnLost, l.name, m.MsgType())
		}
		l.deliver(id, func(d *protocol.Decision) error { d.Kind = protocol.DecisionAllow; return nil })
		return nil
	}
	base, err := l.ctx()
	if err != nil {
		return err
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
		// channel that is not a context.
		done := make(chan struct{})
		defer close(done)
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
		err := l.chk.Check(ctx, rh, d)
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
	}
	return nil
}

// Close implements agentmux.Link: calls in flight end, and no more start.
func (l *Link) Close() error {
	l.mu.Lock()
	l.closed = true
	l.stop()
	l.mu.Unlock()
	return nil
}
