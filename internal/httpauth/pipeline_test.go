package httpauth

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/yield"
	"github.com/zentinelproxy/sidecar/protocol"
)

// pipeService is a forward-auth service on a raw socket that answers
// every request it reads with answer(conn, k, uri) (k: the request's
// number on its connection, from 1; uri: its X-Forwarded-Uri, "" for a
// probe). It records the connections and the most requests one read
// brought.
type pipeService struct {
	answer  func(conn, k int, uri string) (reply string, close bool)
	hold    chan struct{} // non-nil: answers wait for it to close
	mu      sync.Mutex
	conns   int
	maxRead int // the most complete requests one read brought
}

func (s *pipeService) start(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns++
			conn := s.conns
			s.mu.Unlock()
			go s.serve(c, conn)
		}
	}()
	return "http://" + ln.Addr().String() + "/auth"
}

func (s *pipeService) serve(c net.Conn, conn int) {
	defer c.Close()
	buf := make([]byte, 64<<10)
	got, k := "", 0
	for {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		got += string(buf[:n])
		var out strings.Builder
		reqs, closing := 0, false
		for !closing && strings.Contains(got, "\r\n\r\n") {
			i := strings.Index(got, "\r\n\r\n")
			head := got[:i]
			got = got[i+4:]
			reqs++
			k++
			uri := ""
			for _, l := range strings.Split(head, "\r\n") {
				if v, ok := strings.CutPrefix(l, "X-Forwarded-Uri: "); ok {
					uri = v
				}
			}
			var reply string
			reply, closing = s.answer(conn, k, uri)
			out.WriteString(reply)
		}
		s.mu.Lock()
		s.maxRead = max(s.maxRead, reqs)
		s.mu.Unlock()
		if s.hold != nil && reqs > 0 && k > 1 {
			<-s.hold // not the probe's answer
		}
		if _, err := io.WriteString(c, out.String()); err != nil || closing {
			return
		}
	}
}

func (s *pipeService) stats() (conns, maxRead int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns, s.maxRead
}

// echo answers a URI under /deny 403 with the URI as its body, any
// other 200 with the URI in X-Auth-User, and a probe 401.
func echo(uri string) string {
	switch {
	case uri == "":
		return "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n"
	case strings.HasPrefix(uri, "/deny"):
		return fmt.Sprintf("HTTP/1.1 403 Forbidden\r\nContent-Length: %d\r\n\r\n%s", len(uri), uri)
	}
	return "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Auth-User: " + uri + "\r\n\r\n"
}

// pipeClient is a ready client of u with pipeline n.
func pipeClient(t *testing.T, u string, n int) *Client {
	t.Helper()
	cfg := DefaultConfig("auth", u)
	cfg.ResponseHeaders = []string{"X-Auth-User"}
	cfg.Pipeline = n
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// formBatches makes the next leader of c wait, in its yield, until want
// subrequests have joined its batch (at most 5 s); later leaders go on
// at once. It makes the batch a test asks for whatever the scheduling.
func formBatches(t *testing.T, c *Client, want int) {
	var left atomic.Int32
	left.Store(int32(want))
	yield.SetHook(func(owner any) bool {
		if owner != &c.pool {
			return false
		}
		size, _ := LeaderBatch(owner)
		w := int(left.Swap(0))
		for end := time.Now().Add(5 * time.Second); w > 0 && size() < w && time.Now().Before(end); time.Sleep(time.Millisecond) {
		}
		return true
	})
	t.Cleanup(func() { yield.SetHook(nil) })
}

func check(c *Client, uri string, cancel <-chan struct{}) (*protocol.Decision, error) {
	m := &protocol.RequestHeaders{Method: []byte("GET"), URI: []byte(uri),
		Headers: protocol.Headers{{Name: []byte("host"), Value: []byte("shop.example")}}}
	d := &protocol.Decision{}
	err := checker{c}.CheckWait(agentmux.Wait{Deadline: time.Now().Add(10 * time.Second), Cancel: cancel}, m, nil, d)
	return d, err
}

// verdict is a decision in short: "allow <X-Auth-User>" or "block
// <status> <body>".
func verdict(d *protocol.Decision) string {
	if d.Kind == protocol.DecisionAllow {
		for _, op := range d.RequestHeaderOps {
			if op.Op == protocol.HeaderAdd {
				return "allow " + string(op.Value)
			}
		}
		return "allow"
	}
	return fmt.Sprintf("block %d %s", d.Status, d.Body)
}

func want(uri string) string {
	if strings.HasPrefix(uri, "/deny") {
		return "block 403 " + uri
	}
	return "allow " + uri
}

// checkAll runs a subrequest for each URI at once and checks that each
// got its own answer.
func checkAll(t *testing.T, c *Client, uris []string) {
	t.Helper()
	var wg sync.WaitGroup
	got := make([]string, len(uris))
	errs := make([]error, len(uris))
	for i, u := range uris {
		wg.Go(func() {
			d, err := check(c, u, nil)
			got[i], errs[i] = verdict(d), err
		})
	}
	wg.Wait()
	for i, u := range uris {
		if errs[i] != nil || got[i] != want(u) {
			t.Errorf("%s: got %q (error %v), want %q", u, got[i], errs[i], want(u))
		}
	}
}

// TestPipelineAnswersInOrder checks that concurrent GET subrequests go in
// one write on one connection and that each gets its own answer back.
func TestPipelineAnswersInOrder(t *testing.T) {
	s := &pipeService{answer: func(_, _ int, uri string) (string, bool) { return echo(uri), false }}
	c := pipeClient(t, s.start(t), 8)
	formBatches(t, c, 8)
	uris := []string{"/ok/0", "/deny/1", "/ok/2", "/ok/3", "/deny/4", "/ok/5", "/deny/6", "/ok/7"}
	checkAll(t, c, uris)
	conns, maxRead := s.stats()
	if conns != 1 || maxRead < 2 {
		t.Errorf("the service saw %d connections and at most %d requests in a read; want 1 and 8", conns, maxRead)
	}
	if n := c.Counts()["pipelined"]; n != 8 {
		t.Errorf("pipelined = %d, want 8", n)
	}
	// The connection is kept: a lone subrequest after the batch reuses it.
	checkAll(t, c, []string{"/ok/again"})
	if conns, _ := s.stats(); conns != 1 {
		t.Errorf("%d connections after the batch, want 1", conns)
	}
}

// TestPipelineOff checks the default (pipeline 1): concurrent
// subrequests go on connections of their own, and POST subrequests of
// the nginx style are never pipelined.
func TestPipelineOff(t *testing.T) {
	s := &pipeService{answer: func(_, _ int, uri string) (string, bool) { return echo(uri), false }}
	c := pipeClient(t, s.start(t), 1)
	checkAll(t, c, []string{"/ok/0", "/ok/1", "/deny/2", "/ok/3"})
	if _, maxRead := s.stats(); maxRead != 1 {
		t.Errorf("%d requests in one read without pipelining", maxRead)
	}
	if n := c.Counts()["pipelined"]; n != 0 {
		t.Errorf("pipelined = %d, want 0", n)
	}

	c = pipeClient(t, s.start(t), 8)
	c.cfg.Style = StyleNginx
	formBatches(t, c, 2)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			m := &protocol.RequestHeaders{Method: []byte("POST"), URI: []byte("/ok")}
			d := &protocol.Decision{}
			if err := (checker{c}).CheckWait(agentmux.Wait{Deadline: time.Now().Add(10 * time.Second)}, m, nil, d); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := c.Counts()["pipelined"]; n != 0 {
		t.Errorf("POST subrequests pipelined: %d", n)
	}
}

// TestPipelineConnectionClose checks a service that ends a connection
// (Connection: close) in the middle of a batch: the subrequests it did
// not answer go again on a new connection, and each still gets its own
// answer.
func TestPipelineConnectionClose(t *testing.T) {
	s := &pipeService{answer: func(_, k int, uri string) (string, bool) {
		a := echo(uri)
		if k == 4 { // the probe and three answers on each connection
			return strings.Replace(a, "\r\n\r\n", "\r\nConnection: close\r\n\r\n", 1), true
		}
		return a, false
	}}
	c := pipeClient(t, s.start(t), 8)
	formBatches(t, c, 8)
	checkAll(t, c, []string{"/ok/0", "/deny/1", "/ok/2", "/ok/3", "/deny/4", "/ok/5", "/deny/6", "/ok/7"})
	if conns, _ := s.stats(); conns < 2 {
		t.Errorf("the service saw %d connections, want a new one after the close", conns)
	}
}

// TestPipelineStrayAnswer checks bytes after the last answer of a batch
// (an answer nobody asked for, here an allow): the connection is not
// reused, and the stray answer is never anybody's verdict.
func TestPipelineStrayAnswer(t *testing.T) {
	s := &pipeService{answer: func(_, k int, uri string) (string, bool) {
		a := echo(uri)
		if k == 3 { // the probe and a batch of two: after the second answer
			a += "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Auth-User: mallory\r\n\r\n"
		}
		return a, false
	}}
	c := pipeClient(t, s.start(t), 8)
	formBatches(t, c, 2)
	checkAll(t, c, []string{"/deny/0", "/deny/1"})
	checkAll(t, c, []string{"/deny/2"})
	if conns, _ := s.stats(); conns != 2 {
		t.Errorf("the service saw %d connections, want 2 (the one with the stray answer closed)", conns)
	}
}

// TestPipelineFollowerGone checks a subrequest whose client goes away
// while it waits in a batch: it ends at once, the others get their
// answers, and its call is not reused before the leader is done with it
// (the race detector watches).
func TestPipelineFollowerGone(t *testing.T) {
	s := &pipeService{answer: func(_, _ int, uri string) (string, bool) { return echo(uri), false },
		hold: make(chan struct{})}
	c := pipeClient(t, s.start(t), 8)
	formBatches(t, c, 3)
	gone := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, 3)
	got := make([]string, 3)
	left := make(chan struct{}) // the second subrequest returned
	uris := []string{"/ok/0", "/deny/1", "/ok/2"}
	var led *batch // the first one's
	for i, u := range uris {
		var cancel <-chan struct{}
		if i == 1 {
			cancel = gone
		}
		wg.Go(func() {
			d, err := check(c, u, cancel)
			got[i], errs[i] = verdict(d), err
			if i == 1 {
				close(left)
			}
		})
		// In order: the first leads (the leader does not end when its
		// client goes away), the second follows. The batch is sent
		// once the third joins (formBatches), and held by the service.
		testutil.WaitFor(t, fmt.Sprintf("%s in the batch", u), func() bool {
			c.pool.mu.Lock()
			defer c.pool.mu.Unlock()
			if i == 0 {
				led = c.pool.forming
			}
			return led != nil && len(led.calls) == i+1
		})
	}
	// All three are in the batch, sent, and held by the service.
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, r := s.stats(); r == 3 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the batch did not reach the service")
		}
	}
	close(gone)
	select {
	case <-left:
	case <-time.After(5 * time.Second):
		t.Error("the subrequest whose client went away waited for the answers")
	}
	close(s.hold)
	wg.Wait()
	if !errors.Is(errs[1], errAborted) {
		t.Errorf("the subrequest whose client went away: %v, want an abort", errs[1])
	}
	for _, i := range []int{0, 2} {
		if errs[i] != nil || got[i] != want(uris[i]) {
			t.Errorf("%s: got %q (error %v)", uris[i], got[i], errs[i])
		}
	}
	// The pool is sound: more batches go through.
	formBatches(t, c, 4)
	checkAll(t, c, []string{"/ok/3", "/deny/4", "/ok/5", "/ok/6"})
}

// TestPipelineOption checks the option's values: 1–64, 1 by default.
func TestPipelineOption(t *testing.T) {
	c := DefaultConfig("auth", "http://auth.internal/")
	if c.Pipeline != 1 {
		t.Errorf("default pipeline %d, want 1", c.Pipeline)
	}
	if err := c.ApplyOptions(map[string]string{"pipeline": "16"}); err != nil || c.Pipeline != 16 || c.Validate() != nil {
		t.Errorf("pipeline 16: %v, %d", err, c.Pipeline)
	}
	for _, bad := range []string{"0", "65", "-1", "x", ""} {
		c := DefaultConfig("auth", "http://auth.internal/")
		var oe *OptionError
		if err := c.ApplyOptions(map[string]string{"pipeline": bad}); !errors.As(err, &oe) || oe.Key != "pipeline" {
			t.Errorf("pipeline %q: %v", bad, err)
		}
	}
	c.Pipeline = 0
	if err := c.Validate(); err == nil {
		t.Error("Validate accepted pipeline 0")
	}
}

// TestPipelineChunkedAnswers checks answers framed chunked, with a
// trailer section, and each behind a 100 Continue: every subrequest of
// the batch still gets its own answer (a trailer or an interim answer
// left on the connection would be read as the start of the next one).
func TestPipelineChunkedAnswers(t *testing.T) {
	s := &pipeService{answer: func(_, _ int, uri string) (string, bool) {
		a := echo(uri)
		if uri == "" {
			return a, false
		}
		head, body, _ := strings.Cut(a, "\r\n\r\n")
		head = strings.Replace(head, "Content-Length: "+fmt.Sprint(len(body)), "Transfer-Encoding: chunked", 1)
		var b strings.Builder
		b.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
		b.WriteString(head + "\r\n\r\n")
		if body != "" {
			fmt.Fprintf(&b, "%x\r\n%s\r\n", len(body), body)
		}
		b.WriteString("0\r\nX-Checked: " + uri + "\r\n\r\n")
		return b.String(), false
	}}
	c := pipeClient(t, s.start(t), 8)
	formBatches(t, c, 6)
	checkAll(t, c, []string{"/ok/0", "/deny/1", "/ok/2", "/deny/3", "/ok/4", "/ok/5"})
	checkAll(t, c, []string{"/deny/6"})
}

// TestPipelineLateStrayAnswer checks an answer nobody asked for that
// comes a moment after the batch's last (not in the same read): the idle
// connection it arrives on is never used again, so it is nobody's
// verdict.
func TestPipelineLateStrayAnswer(t *testing.T) {
	// A service that, 50ms after answering the batch of two, sends an
	// allow for mallory on the same connection.
	stray := make(chan net.Conn, 1)
	var sent atomic.Bool // once: a stray answer that races the next request is HTTP/1.1's, not ours
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				br := make([]byte, 64<<10)
				got, k := "", 0
				for {
					_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
					n, err := nc.Read(br)
					if err != nil {
						return
					}
					got += string(br[:n])
					var out strings.Builder
					for strings.Contains(got, "\r\n\r\n") {
						i := strings.Index(got, "\r\n\r\n")
						head := got[:i]
						got = got[i+4:]
						k++
						uri := ""
						for _, l := range strings.Split(head, "\r\n") {
							if v, ok := strings.CutPrefix(l, "X-Forwarded-Uri: "); ok {
								uri = v
							}
						}
						out.WriteString(echo(uri))
					}
					if _, err := io.WriteString(nc, out.String()); err != nil {
						return
					}
					if k == 3 && sent.CompareAndSwap(false, true) { // the probe and the batch of two
						time.Sleep(50 * time.Millisecond)
						_, _ = io.WriteString(nc, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Auth-User: mallory\r\n\r\n")
						select {
						case stray <- nc:
						default:
						}
					}
				}
			}()
		}
	}()
	c := pipeClient(t, "http://"+ln.Addr().String()+"/auth", 8)
	formBatches(t, c, 2)
	checkAll(t, c, []string{"/deny/0", "/deny/1"})
	select {
	case <-stray:
	case <-time.After(5 * time.Second):
		t.Fatal("the stray answer was not sent")
	}
	time.Sleep(20 * time.Millisecond) // it reached the idle connection
	for i := range 4 {
		checkAll(t, c, []string{fmt.Sprintf("/deny/%d", 2+i)})
	}
}

// TestPipelineServiceClosesMidBatch checks a service that closes the
// connection after some answers of a batch without saying so
// (no Connection: close), and one that cuts an answer's head short: the
// subrequests it did not answer go again or fail, and none gets an
// answer that is not its own.
func TestPipelineServiceClosesMidBatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		cut  func(a string) string
	}{
		{"after an answer", func(a string) string { return a }},
		{"mid-head", func(a string) string { return a[:len(a)/2] }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &pipeService{answer: func(_, k int, uri string) (string, bool) {
				if k == 4 { // the probe and three answers on each connection
					return tc.cut(echo(uri)), true
				}
				return echo(uri), false
			}}
			c := pipeClient(t, s.start(t), 8)
			formBatches(t, c, 8)
			uris := []string{"/ok/0", "/deny/1", "/ok/2", "/ok/3", "/deny/4", "/ok/5", "/deny/6", "/ok/7"}
			var wg sync.WaitGroup
			got := make([]string, len(uris))
			errs := make([]error, len(uris))
			for i, u := range uris {
				wg.Go(func() {
					d, err := check(c, u, nil)
					got[i], errs[i] = verdict(d), err
				})
			}
			wg.Wait()
			ok := 0
			for i, u := range uris {
				if errs[i] != nil {
					continue // a failure is the failure mode's
				}
				ok++
				if got[i] != want(u) {
					t.Errorf("%s: got %q, want %q", u, got[i], want(u))
				}
			}
			if ok < len(uris)/2 {
				t.Errorf("only %d of %d subrequests answered: %v", ok, len(uris), errs)
			}
		})
	}
}

// TestPipelineMisframedAnswer checks a service whose answer declares a
// Content-Length that takes in the next answer whole (its framing is
// wrong, the connection kept open): the answers read after it belong to
// other subrequests than those they would be handed to, so none is
// handed over; the batch fails (the failure mode's) when the answer that
// never comes is waited for, instead of giving a deny's subrequest
// another's allow.
func TestPipelineMisframedAnswer(t *testing.T) {
	s := &pipeService{answer: func(_, k int, uri string) (string, bool) {
		switch k {
		case 2: // the batch's first: its body swallows the second's answer
			next := echo("/deny/1")
			return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Auth-User: %s\r\n\r\n", len(next), uri), false
		case 3:
			return echo("/deny/1"), false
		}
		return echo(uri), false
	}}
	c := pipeClient(t, s.start(t), 8)
	formBatches(t, c, 3)
	uris := []string{"/ok/0", "/deny/1", "/ok/2"}
	var wg sync.WaitGroup
	got := make([]string, len(uris))
	errs := make([]error, len(uris))
	for i, u := range uris {
		wg.Go(func() {
			m := &protocol.RequestHeaders{Method: []byte("GET"), URI: []byte(u),
				Headers: protocol.Headers{{Name: []byte("host"), Value: []byte("shop.example")}}}
			d := &protocol.Decision{}
			errs[i] = checker{c}.CheckWait(agentmux.Wait{Deadline: time.Now().Add(time.Second)}, m, nil, d)
			got[i] = verdict(d)
		})
		time.Sleep(5 * time.Millisecond) // in this order
	}
	wg.Wait()
	for i, u := range uris {
		if errs[i] == nil && got[i] != want(u) {
			t.Errorf("%s: got %q, another subrequest's answer", u, got[i])
		}
	}
}
