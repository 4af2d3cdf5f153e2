package rawio

import (
	"syscall"
	"time"

	"github.com/zentinelproxy/sidecar/internal/yield"
)

// Yielding after a wake-up, for an agent's end of its connection to the
// proxy (YieldOnWake).
//
// When the proxy and its agent share a core, each batch of events the
// proxy writes wakes the agent, which preempts the proxy at once: the
// proxy is still handling the requests of that burst, whose events would
// have joined the batch a moment later. So the agent answers batches of
// a few events, each costing it a wake-up (a wait, a read, a write) and
// the proxy a preemption. A Read that waited for data therefore reads
// what woke it and, when the buffer has room, gives the CPU away once
// (sched_yield(2)): a preempted proxy runs on until it blocks, its events
// queuing without waking anybody, and a second read takes them along.
// That is what SCHED_BATCH does for the agent (sdk.SetBatchScheduling),
// kept to the moments it helps. When nothing else is runnable on the
// core, sched_yield returns at once.
//
// A yield pays when the second read finds data. A yield.Policy keeps
// yielding while about one yield in nine pays and otherwise probes once
// in 16 wake-ups, so an agent under a load of a request at a time pays a
// yield and a read that finds nothing on about one wake-up in 16.
// Measured on the peer benchmark (sidecar and SDK agent on one core, 5
// rounds against the commit before): the agent's CPU per request fell
// from 2.2 to 1.2 µs, the context switches of the two from 0.19 to 0.09
// per request, their CPU to 0.97x and requests/s rose to 1.03x
// (docs/performance.md, "The agent yields after a wake-up").
//
// The SDK asks for it only when the agent may run on one CPU only. On
// several, a yield lets the kernel move threads between CPUs: with an
// agent in the proxy's process on two CPUs, yields on one wake-up in 16
// made a lone round trip 1.5x as long, though each lasted 7 µs.

// maxPaidYield: a yield that kept the reader from its CPU this long does
// not count as paid, whatever the second read finds. Yielding to the
// proxy it serves, the reader was back within a millisecond in 94-98% of
// the yields at saturation on a quiet machine (the peer benchmark's
// placement); yielding to unrelated busy work, it waits for the rest of
// a time slice, and under load events arrive meanwhile. Measured with a
// busy loop on the agent's CPU at 8 000 requests/s: without this bound
// the yields seemed to pay and the median latency went from 0.55 to
// 2.3-2.7 ms.
const maxPaidYield = time.Millisecond

// WakeStats counts what YieldOnWake did on one connection.
type WakeStats struct {
	// Yields: Reads that woke to data and gave the CPU away.
	Yields uint64
	// Paid: the yields after which the second read found more data.
	Paid uint64
}

// YieldOnWake makes the Reads of c that had to wait for data yield the CPU
// once after reading what woke them, and read again (see above). It does
// nothing on systems other than Linux. It waits for a Read in progress:
// call it before reading.
func (c *Conn) YieldOnWake() {
	c.rmu.Lock()
	c.wakeYield = yield.OSYields
	c.rmu.Unlock()
}

// WakeYields returns the counters of YieldOnWake.
func (c *Conn) WakeYields() WakeStats {
	return WakeStats{Yields: c.wyYields.Load(), Paid: c.wyPaid.Load()}
}

// moreAfterYield follows a Read's first read after a wait, which got
// c.rbuf[:n] with room left: when the policy allows, it yields the CPU
// once and reads again into the rest of the buffer. It returns the bytes
// read in all. What else the second read meets goes to the next Read: an
// end of stream, which a read meets again, and an error, which the
// kernel reports once (a reset) and so is kept in c.wyErr.
func (c *Conn) moreAfterYield(fd uintptr, n int) int {
	if !c.wy.Before() {
		return n
	}
	c.wyYields.Add(1)
	t0 := time.Now()
	yield.OS(c)
	var took time.Duration
	if c.wySince == nil {
		took = time.Since(t0)
	} else {
		took = c.wySince(t0)
	}
	long := took >= maxPaidYield
	m, errno := Read(int(fd), c.rbuf[n:])
	switch errno {
	case 0:
	case syscall.EAGAIN, syscall.EINTR:
		m = 0 // nothing more (a signal: the next Read reads on)
	default:
		m, c.wyErr = 0, errno
	}
	paid := m > 0 && !long
	c.wy.After(paid)
	if paid {
		c.wyPaid.Add(1)
	}
	return n + m
}
