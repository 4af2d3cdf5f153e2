package extproc_test

import (
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/extproc"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/protocol"
)

// heapObjects is the number of live heap objects after a full collection.
func heapObjects() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapObjects
}

// TestEndedStreamReleased: a request whose stream the processor ended
// leaves nothing behind once finished, however long the grace for a
// processor to end a stream is: its state is not held until the grace
// would have run out.
func TestEndedStreamReleased(t *testing.T) {
	p, addr, _ := startProcessor(t, continueAll, nil)
	p.quiet = true
	c := newClient(t, addr, func(cfg *extproc.Config) { cfg.GraceTimeout = time.Hour })
	run := func(n int) {
		for range n {
			ex := begin(t, c)
			if _, err := ex.RequestHeaders(wait(), reqHeaders(false, "accept", "*/*", "user-agent", "test")); err != nil {
				t.Fatal(err)
			}
			if _, err := ex.ResponseHeaders(wait(), &protocol.ResponseHeaders{StatusCode: 200}); err != nil {
				t.Fatal(err)
			}
			ex.Finish()
		}
	}
	run(50) // the connection's and the pools' memory
	testutil.WaitFor(t, "the warm-up streams to end", func() bool { return p.ended.Load() == 50 })
	before := heapObjects()
	const n = 1000
	run(n)
	testutil.WaitFor(t, "every stream to end", func() bool { return p.ended.Load() == 50+n })
	// The reader unwatches a stream after the processor's end reached
	// the processor's handler (ended counts it there): let it finish.
	var grown int64
	testutil.WaitFor(t, "the finished requests' memory to go", func() bool {
		grown = int64(heapObjects()) - int64(before)
		return grown < n*5
	})
	t.Logf("%d heap objects more after %d requests", grown, n)
}

// holdingProcessor answers the request headers with CONTINUE and then
// holds the stream: with readAfter, it reads on until the client's
// half-close and keeps the stream open after it; without, it reads
// nothing more. It ends when the client resets the stream.
type holdingProcessor struct {
	extprocsvc.UnimplementedExternalProcessorServer
	readAfter bool
	halfEOF   atomic.Int64
	ended     atomic.Int64
	why       atomic.Pointer[error] // how the last stream ended
}

func (p *holdingProcessor) Process(s extprocsvc.ExternalProcessor_ProcessServer) error {
	req, err := s.Recv()
	if err != nil {
		return err // the client's probe
	}
	defer p.ended.Add(1)
	if err := s.Send(cont(req, nil)); err != nil {
		return err
	}
	for p.readAfter {
		if _, err := s.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				p.halfEOF.Add(1)
				break
			}
			return err
		}
	}
	<-s.Context().Done()
	err = s.Context().Err()
	p.why.Store(&err)
	return err
}

func startHolding(t *testing.T, p *holdingProcessor, opts ...grpc.ServerOption) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	extprocsvc.RegisterExternalProcessorServer(srv, p)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return ln.Addr().String()
}

// TestGraceEndsStream: a finished request's stream that the processor
// keeps open after the half-close is reset when the grace runs out.
func TestGraceEndsStream(t *testing.T) {
	p := &holdingProcessor{readAfter: true}
	c := newClient(t, startHolding(t, p), func(cfg *extproc.Config) { cfg.GraceTimeout = 100 * time.Millisecond })
	ex := begin(t, c)
	if _, err := ex.RequestHeaders(wait(), reqHeaders(false)); err != nil {
		t.Fatal(err)
	}
	ex.Finish()
	testutil.WaitFor(t, "the half-close", func() bool { return p.halfEOF.Load() == 1 })
	testutil.WaitFor(t, "the stream to be reset", func() bool { return p.ended.Load() == 1 })
	if why := p.why.Load(); why == nil || !errors.Is(*why, context.Canceled) {
		t.Errorf("the stream ended with %v, want a reset", why)
	}
}

// TestSendTimeout: a send that cannot go out by its deadline (here a
// stream that cannot open: the server takes one at a time and holds the
// one it has) fails as a timeout, and the request's stream is given up;
// the connection serves the next request once the server takes streams
// again.
func TestSendTimeout(t *testing.T) {
	p := &holdingProcessor{}
	c := newClient(t, startHolding(t, p, grpc.MaxConcurrentStreams(1)), func(cfg *extproc.Config) {
		cfg.MessageTimeout = 300 * time.Millisecond
		cfg.GraceTimeout = 100 * time.Millisecond
	})
	held := begin(t, c)
	if _, err := held.RequestHeaders(wait(), reqHeaders(false)); err != nil {
		t.Fatal(err)
	}
	ex := begin(t, c)
	done := make(chan error, 1)
	go func() {
		_, err := ex.RequestHeaders(wait(), reqHeaders(false))
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, agentmux.ErrAgentTimeout) || !strings.Contains(err.Error(), "could not send") {
			t.Fatalf("err %v, want a send timeout", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the send outlived its deadline")
	}
	ex.Finish()
	held.Finish() // reset after its grace, which frees the server's stream
	testutil.WaitFor(t, "the held stream to be reset", func() bool { return p.ended.Load() == 1 })
	next := begin(t, c)
	defer next.Finish()
	if _, err := next.RequestHeaders(wait(), reqHeaders(false)); err != nil {
		t.Fatalf("the next request: %v", err)
	}
}

// TestClientGoneWhileWaiting: the request's cancel channel closing (the
// client went away) ends an event waiting for a processor that does not
// answer, as a cancel and long before the deadline, and resets the
// stream; so it does when the event waits with another channel than the
// request's first event, and for the next event of a request whose
// client went away between events.
func TestClientGoneWhileWaiting(t *testing.T) {
	p := &holdingProcessor{}
	c := newClient(t, startHolding(t, p), func(cfg *extproc.Config) { cfg.MessageTimeout = time.Minute })
	for _, tc := range []struct {
		name    string
		other   bool // the waiting event's channel is not the first event's
		between bool // the client goes before the waiting event
	}{{"waiting", false, false}, {"another channel", true, false}, {"between events", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			ended := p.ended.Load()
			ex := begin(t, c)
			first, ch := make(chan struct{}), make(chan struct{})
			defer func() {
				select {
				case <-first:
				default:
					close(first)
				}
			}()
			if !tc.other {
				ch = first
			}
			if _, err := ex.RequestHeaders(agentmux.Wait{Deadline: time.Now().Add(time.Minute), Cancel: first}, reqHeaders(false)); err != nil {
				t.Fatal(err)
			}
			if tc.between {
				close(ch)
			}
			done := make(chan error, 1)
			go func() {
				// The processor holds the stream: no answer comes.
				_, err := ex.ResponseHeaders(agentmux.Wait{Deadline: time.Now().Add(time.Minute), Cancel: ch}, &protocol.ResponseHeaders{StatusCode: 200})
				done <- err
			}()
			if !tc.between {
				time.AfterFunc(50*time.Millisecond, func() { close(ch) })
			}
			select {
			case err := <-done:
				if !errors.Is(err, agentmux.ErrAgentCanceled) {
					t.Fatalf("err %v, want a cancel", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the wait outlived the cancel")
			}
			ex.Finish()
			testutil.WaitFor(t, "the stream to be reset", func() bool { return p.ended.Load() == ended+1 })
			if why := p.why.Load(); why == nil || !errors.Is(*why, context.Canceled) {
				t.Errorf("the stream ended with %v, want a reset", why)
			}
		})
	}
}
