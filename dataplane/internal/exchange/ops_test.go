package exchange

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/protocol"
)

// naiveApply applies ops one by one with the scanning functions.
func naiveApply(ex *Exchange, ops []protocol.HeaderOp) {
	for _, op := range ops {
		ex.reqOp(op.Op, op.Name, op.Value)
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

func testState(hdrs int, r *rand.Rand, names int) *Exchange {
	ex := testExchange()
	ex.rt = &route{}
	ex.slots[0].ra = &routeAgent{a: &agentEntry{name: "a"}}
	ex.nslots = 1
	for i := 0; i < hdrs; i++ {
		ex.hdr = append(ex.hdr, Field{Name: []byte(fmt.Sprintf("X-H%d", r.IntN(names))), Value: []byte("orig")})
	}
	return ex
}

// testExchange is an Exchange on a core that logs and observes nothing.
func testExchange() *Exchange {
	ex := new(Exchange)
	ex.Init(nil)
	ex.core = NewCore(nil, zerolog.Nop())
	return ex
}

func render(list []Field) string {
	var b strings.Builder
	for _, kv := range list {
		fmt.Fprintf(&b, "%s: %s\n", strings.ToLower(string(kv.Name)), kv.Value)
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
			ex := testState(20, rand.New(rand.NewPCG(1, 1)), 20)
			base := append([]Field(nil), ex.hdr...)
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				ex.hdr = append(ex.hdr[:0], base...)
				ex.hdrArena = ex.hdrArena[:0]
				ex.applyReqOps(0, ops)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/op-applied")
		})
		if n > 2560 {
			continue // one by one, 25,600 operations take seconds per reply
		}
		b.Run(fmt.Sprintf("scanned/%d", n), func(b *testing.B) {
			ex := testState(20, rand.New(rand.NewPCG(1, 1)), 20)
			base := append([]Field(nil), ex.hdr...)
			for i := 0; i < b.N; i++ {
				ex.hdr = append(ex.hdr[:0], base...)
				ex.hdrArena = ex.hdrArena[:0]
				naiveApply(ex, ops)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/op-applied")
		})
	}
}
