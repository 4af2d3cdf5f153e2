package authcall_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/authcall"
	"github.com/zentinelproxy/sidecar/protocol"
)

// blocking is a Checker whose calls wait for their context; it reports
// each call's start and its body.
type blocking struct {
	started chan []byte
}

func (b blocking) Check(ctx context.Context, _ *protocol.RequestHeaders, body []byte, d *protocol.Decision) error {
	b.started <- append([]byte(nil), body...)
	<-ctx.Done()
	return ctx.Err()
}

func session(chk authcall.Checker, withBody bool, timeout time.Duration) (*authcall.Link, *agentmux.Session) {
	l := authcall.NewLink("t", chk, withBody)
	s := agentmux.NewSession(l, protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: withBody},
		agentmux.SessionConfig{Name: "t", MaxInFlight: 8, MaxQueue: 8, MessageTimeout: timeout})
	l.SetSession(s)
	return l, s
}

// TestCancelAllEndsCalls: CancelAll (a drain) ends the calls in flight,
// and later calls still run.
func TestCancelAllEndsCalls(t *testing.T) {
	chk := blocking{started: make(chan []byte, 4)}
	_, s := session(chk, false, 30*time.Second)
	errc := make(chan error, 1)
	go func() {
		ex, err := s.Begin(agentmux.Wait{})
		if err != nil {
			errc <- err
			return
		}
		defer ex.Finish()
		_, err = ex.RequestHeaders(agentmux.Wait{}, &protocol.RequestHeaders{Method: []byte("GET"), URI: []byte("/")})
		errc <- err
	}()
	select {
	case <-chk.started:
	case <-time.After(5 * time.Second):
		t.Fatal("no call")
	}
	if err := s.SendCancelAll("drain"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, agentmux.ErrAgentConnLost) {
			t.Errorf("error %v, want a lost connection", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("CancelAll did not end the call")
	}
	// A call after the CancelAll runs (and times out on its own deadline).
	ex, err := s.Begin(agentmux.Wait{})
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Finish()
	_, err = ex.RequestHeaders(agentmux.Wait{Deadline: time.Now().Add(50 * time.Millisecond)}, &protocol.RequestHeaders{Method: []byte("GET"), URI: []byte("/")})
	if !errors.Is(err, agentmux.ErrAgentTimeout) {
		t.Errorf("after CancelAll: %v, want a timeout", err)
	}
}

// TestHeldBody: with the body, the call is made at the last chunk with
// the whole body; the chunks before it are answered "more".
func TestHeldBody(t *testing.T) {
	chk := blocking{started: make(chan []byte, 4)}
	_, s := session(chk, true, 30*time.Second)
	ex, err := s.Begin(agentmux.Wait{})
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Finish()
	r, err := ex.RequestHeaders(agentmux.Wait{}, &protocol.RequestHeaders{Method: []byte("POST"), URI: []byte("/"), HasBody: true})
	if err != nil || r.Decision.Kind != protocol.DecisionAllow {
		t.Fatalf("headers: %v", err)
	}
	r, err = ex.BodyChunk(agentmux.Wait{}, protocol.PhaseRequest, &protocol.BodyChunk{ChunkIndex: 0, Data: []byte("abc"), TotalSize: -1, Progress: -1})
	if err != nil || !r.Decision.NeedsMore {
		t.Fatalf("chunk 0: %v %+v", err, r)
	}
	_, err = ex.BodyChunk(agentmux.Wait{Deadline: time.Now().Add(100 * time.Millisecond)}, protocol.PhaseRequest,
		&protocol.BodyChunk{ChunkIndex: 1, Data: []byte("def"), IsLast: true, TotalSize: -1, Progress: -1})
	if !errors.Is(err, agentmux.ErrAgentTimeout) {
		t.Errorf("last chunk: %v, want the call's timeout", err)
	}
	select {
	case b := <-chk.started:
		if string(b) != "abcdef" {
			t.Errorf("call got body %q", b)
		}
	default:
		t.Error("no call at the last chunk")
	}
}
