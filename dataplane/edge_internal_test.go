package dataplane

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/protocol"
)

// TestPeekIgnoresReadDeadline: a client connection whose header-read
// deadline has passed is still connected; the disconnect check must say
// so (it said "gone" and cut slow responses off at read_timeout).
func TestPeekIgnoresReadDeadline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	_ = server.SetReadDeadline(time.Now().Add(-time.Second))
	if peekClosed(server) {
		t.Fatal("a connected client with an expired read deadline was taken for gone")
	}
	client.Close()
	deadline := time.Now().Add(10 * time.Second)
	for !peekClosed(server) {
		if time.Now().After(deadline) {
			t.Fatal("a closed client was not noticed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// flakyListener fails Accept with an error n times before passing on.
type flakyListener struct {
	net.Listener
	fails atomic.Int32
	err   error
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, l.err
	}
	return l.Listener.Accept()
}

// TestAcceptBacksOffOnExhaustion: EMFILE and friends are waited out, not
// taken for a dead listener; a closed listener still ends Accept.
func TestAcceptBacksOffOnExhaustion(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	var st counters
	fl := &flakyListener{Listener: inner, err: &net.OpError{Op: "accept", Err: syscall.EMFILE}}
	fl.fails.Store(4)
	ln := &eofListener{Listener: fl, log: zerolog.New(&logs), stats: &st}
	go func() {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err == nil {
			defer c.Close()
			time.Sleep(time.Second)
		}
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatalf("accept gave up on EMFILE: %v", err)
	}
	c.Close()
	if n := st.acceptErrors.Load(); n != 4 {
		t.Errorf("accept errors counted %d, want 4", n)
	}
	if n := strings.Count(logs.String(), "accept failed"); n != 1 {
		t.Errorf("%d log lines for 4 failures, want 1 (rate-limited)", n)
	}
	_ = ln.Close()
	if _, err := ln.Accept(); err == nil {
		t.Fatal("accept on a closed listener succeeded")
	}
	// A permanent error is returned at once.
	fl2 := &flakyListener{Listener: inner, err: &net.OpError{Op: "accept", Err: syscall.EINVAL}}
	fl2.fails.Store(1)
	if _, err := (&eofListener{Listener: fl2, log: zerolog.Nop(), stats: &st}).Accept(); err == nil {
		t.Fatal("EINVAL retried")
	}
}

// TestRequestLineTooLong: the 414/431 tell-apart.
func TestRequestLineTooLong(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	c := &eofConn{Conn: a, hdrBuf: 16}
	go func() {
		_, _ = b.Write([]byte("GET /aaaaaaaaaaaaaaaaaaaaaaaaaaa"))
		_, _ = b.Write([]byte("GET / HTTP/1.1\r\nX: aaaaaaaaaaaaaaaaaaaaaaaa"))
	}()
	buf := make([]byte, 16)
	for n := 0; n < 32; {
		m, _ := c.Read(buf)
		n += m
	}
	if !c.requestLineTooLong() {
		t.Error("32 bytes without a line feed: not too long")
	}
	for n := 0; n < 16; {
		m, _ := c.Read(buf)
		n += m
	}
	if c.requestLineTooLong() {
		t.Error("a line feed was read: the request line ended")
	}
}

// naiveApply applies ops one by one with the scanning functions.
func naiveApply(rs *reqState, ops []protocol.HeaderOp) {
	for _, op := range ops {
		rs.reqOp(op.Op, op.Name, op.Value)
	}
}

func randomOps(r *rand.Rand, n, names int) []protocol.HeaderOp {
	ops := make([]protocol.HeaderOp, n)
	for i := range ops {
		name := fmt.Sprintf("X-H%d", r.IntN(names))
		if r.IntN(2) == 0 {
			name = strings.ToLower(name)
		}
		ops[i] = protocol.HeaderOp{Op: protocol.HeaderOpKind(r.IntN(3)), Name: []byte(name), Value: []byte(fmt.Sprint(i))}
		if ops[i].Op == protocol.HeaderRemove {
			ops[i].Value = nil
		}
	}
	return ops
}

func testState(hdrs int, r *rand.Rand, names int) *reqState {
	rs := newReqState()
	rs.srv = &Server{log: zerolog.Nop(), obs: NopObserver{}}
	rs.rt = &route{}
	rs.slots[0].ra = &routeAgent{a: &agentEntry{name: "a"}}
	rs.nslots = 1
	for i := 0; i < hdrs; i++ {
		rs.hdr = append(rs.hdr, hkv{name: []byte(fmt.Sprintf("X-H%d", r.IntN(names))), value: []byte("orig")})
	}
	return rs
}

func render(list []hkv) string {
	var b strings.Builder
	for _, kv := range list {
		fmt.Fprintf(&b, "%s: %s\n", strings.ToLower(string(kv.name)), kv.value)
	}
	return b.String()
}

// TestIndexedOpsMatchScans: the indexed batch gives exactly what applying
// the operations one by one gives (order included), over random lists.
func TestIndexedOpsMatchScans(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 300; round++ {
		names := 1 + r.IntN(12)
		hdrs := r.IntN(20)
		ops := randomOps(r, smallBatch+1+r.IntN(60), names)
		seed := r.Uint64()
		a := testState(hdrs, rand.New(rand.NewPCG(seed, 1)), names)
		b := testState(hdrs, rand.New(rand.NewPCG(seed, 1)), names)
		naiveApply(a, ops)
		b.applyReqOps(0, ops)
		if got, want := render(b.hdr), render(a.hdr); got != want {
			t.Fatalf("round %d: indexed\n%s\nscanned\n%s\nops %v", round, got, want, ops)
		}
	}
}

// BenchmarkRequestHeaderOps: a reply of n set operations on distinct
// names, applied to a 20-header request. ns/op divided by n stays flat as
// n grows (linear); applied one by one it grew with n (quadratic).
func BenchmarkRequestHeaderOps(b *testing.B) {
	for _, n := range []int{8, 64, 256, 2560, 25600} {
		ops := make([]protocol.HeaderOp, n)
		for i := range ops {
			ops[i] = protocol.HeaderOp{Op: protocol.HeaderSet, Name: []byte(fmt.Sprintf("x-op-%d", i)), Value: []byte("v")}
		}
		b.Run(fmt.Sprintf("indexed/%d", n), func(b *testing.B) {
			rs := testState(20, rand.New(rand.NewPCG(1, 1)), 20)
			base := append([]hkv(nil), rs.hdr...)
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				rs.hdr = append(rs.hdr[:0], base...)
				rs.hdrArena = rs.hdrArena[:0]
				rs.applyReqOps(0, ops)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/op-applied")
		})
		if n > 2560 {
			continue // one by one, 25,600 operations take seconds per reply
		}
		b.Run(fmt.Sprintf("scanned/%d", n), func(b *testing.B) {
			rs := testState(20, rand.New(rand.NewPCG(1, 1)), 20)
			base := append([]hkv(nil), rs.hdr...)
			for i := 0; i < b.N; i++ {
				rs.hdr = append(rs.hdr[:0], base...)
				rs.hdrArena = rs.hdrArena[:0]
				naiveApply(rs, ops)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/op-applied")
		})
	}
}
