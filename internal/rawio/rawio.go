// Package rawio reads and writes sockets with raw system calls, outside
// the Go scheduler's system-call state.
//
// A read or write through net.Conn enters the runtime's system-call state
// for its duration. On a loaded core shared with an agent process, the
// write that wakes the agent is often preempted before it returns; the
// runtime's monitor thread then finds the P "in a system call" for more
// than 20 µs, hands it to another thread, and keeps polling every 20 µs
// for the next millisecond. Each of those hand-offs and polls is a context
// switch. On a non-blocking socket, read(2) and write(2) never block, so
// they can run as raw calls: the P stays with its thread, the monitor
// stays asleep, and readiness is still waited for through the runtime's
// poller (syscall.RawConn), with the connection's deadlines. Measured on
// the peer benchmark (the sidecar and a UDS agent on one core): the
// monitor's wake-ups fell from 2 037/s to 94/s, the context switches of
// the two from 0.42 to 0.22 per request, their CPU from 47.2 to 41.5 µs
// per request (docs/performance.md).
//
// Conn does that for one connection without allocating per call: the
// callbacks are bound once, when the connection is wrapped. Built with
// -race, the calls go through package syscall instead, which is how the
// race detector learns that a socket's write happens before the read of
// its bytes.
package rawio

import (
	"errors"
	"io"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/zentinelproxy/sidecar/internal/yield"
)

// Conn is a net.Conn whose Read and Write are raw system calls on its
// socket. Its read deadline is its own (SetReadDeadline); its other
// methods (write deadlines, Close, addresses) are the wrapped
// connection's. Deadlines are set through Conn, not through the embedded
// net.Conn, whose read deadline Conn would not know about. Reads and
// Writes may run concurrently, as on any net.Conn, except from
// HoldWrites to the Read that sends what it held.
type Conn struct {
	net.Conn
	rc syscall.RawConn

	// rmu and wmu serialize Reads and Writes: the callbacks' state below
	// is per direction, not per call.
	rmu, wmu sync.Mutex

	readFn  func(uintptr) bool
	rbuf    []byte
	rn      int
	rerr    syscall.Errno
	writeFn func(uintptr) bool
	wbuf    []byte
	wn      int
	werr    syscall.Errno

	// Pending's callback and results (peek.go), under rmu.
	peekFn func(uintptr)
	pbuf   [1]byte
	peekN  int
	perr   syscall.Errno

	// Held writes (HoldWrites): pend[pn:] waits for the next Read.
	holding  bool
	sendHeld bool // the Read's first callback writes pend before reading
	pend     []byte
	pn       int
	herr     syscall.Errno

	// waits counts the reads that found nothing and waited for the
	// poller (see Waits).
	waits atomic.Uint32

	// The read deadline reaches the poller only when a Read is about to
	// wait (SetReadDeadline). Deadlines are kept as dlTime values, so
	// that setting one is two atomic stores. rdWaiting and rdDirty order
	// a setter against the reader: each stores its flag and then loads
	// the other's, so at least one of them sees both and hands the
	// deadline to the poller (giveDeadline, serialized by dmu).
	rdWant    atomic.Int64 // dlTime asked for
	rdDirty   atomic.Bool  // rdWant may differ from rdSet
	rdWaiting atomic.Bool  // a Read may be waiting in the poller
	dmu       sync.Mutex
	rdSet     int64         // dlTime the poller has (under dmu) ...
	rdKnown   bool          // ... once Conn has given it one (before, unknown)
	rdProgs   atomic.Uint32 // deadlines given to the poller (tests)
	rwaited   bool          // this Read set rdWaiting (the reader's, under rmu)

	// Yields after a wait (YieldOnWake); the reader's, under rmu.
	wakeYield bool
	wy        yield.Policy
	wyErr     syscall.Errno // met by a yield's second read, for the next Read
	wyYields  atomic.Uint64
	wyPaid    atomic.Uint64
	// wySince measures a yield from its start (nil: time.Since); tests
	// stand in for the clock, which a loaded machine can stretch past
	// maxPaidYield at any point.
	wySince func(time.Time) time.Duration
}

// A dlTime is a deadline as nanoseconds from epoch, shifted so that 0
// means none: d+1 for d >= 0, d itself before epoch.
var epoch = time.Now()

func toDL(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	var d int64
	if t == t.Round(0) {
		// No monotonic reading (time.Unix, t.UTC()): t.Sub(epoch) would
		// measure it against the wall clock of the process's start. Its
		// distance from the wall clock now, from the monotonic one now.
		d = satAdd(int64(time.Until(t)), int64(time.Since(epoch)))
	} else {
		d = int64(t.Sub(epoch))
	}
	if d >= 0 && d < math.MaxInt64 {
		d++
	}
	return d
}

// satAdd is a+b, saturated at the int64 range.
func satAdd(a, b int64) int64 {
	switch {
	case b > 0 && a > math.MaxInt64-b:
		return math.MaxInt64
	case b < 0 && a < math.MinInt64-b:
		return math.MinInt64
	}
	return a + b
}

func fromDL(d int64) time.Time {
	switch {
	case d == 0:
		return time.Time{}
	case d > 0:
		d--
	}
	return epoch.Add(time.Duration(d))
}

// dlPassed reports whether deadline d (not 0) has passed. time.Since
// reads only the monotonic clock, half of time.Now.
func dlPassed(d int64) bool {
	if d > 0 {
		d--
	}
	return time.Duration(d) <= time.Since(epoch)
}

// maxHeld bounds the bytes HoldWrites keeps: a request head, not a body.
const maxHeld = 16 << 10

// Wrap returns c as a *Conn when c is a TCP or Unix socket, and c itself
// otherwise (TLS, pipes and other wrappers keep their own I/O).
func Wrap(c net.Conn) net.Conn {
	var sc syscall.Conn
	switch t := c.(type) {
	case *net.TCPConn:
		sc = t
	case *net.UnixConn:
		sc = t
	default:
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil || !nonblocking(rc) {
		return c
	}
	rw := &Conn{Conn: c, rc: rc}
	rw.readFn = rw.read
	rw.writeFn = rw.writeCB
	rw.peekFn = rw.peek
	return rw
}

// nonblocking reports whether the socket is in non-blocking mode, as Go
// sets every socket it creates. A raw read(2) on a blocking socket (one
// whose descriptor was taken with File and then Fd, which clears
// O_NONBLOCK on the open file they share) would
// block its thread without telling the runtime: such a socket keeps the
// runtime's calls.
func nonblocking(rc syscall.RawConn) bool {
	var flags uintptr
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		flags, _, errno = syscall.RawSyscall(syscall.SYS_FCNTL, fd, syscall.F_GETFL, 0)
	}); err != nil || errno != 0 {
		return false
	}
	return flags&syscall.O_NONBLOCK != 0
}

// Read implements net.Conn: one read(2) once the socket is readable.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.holding {
		c.holding = false
		if len(c.pend) > 0 {
			return c.readAfterHeld(p)
		}
	}
	return c.readRaw(p)
}

// readRaw is one read through the poller, with the read deadline in
// force (SetReadDeadline).
func (c *Conn) readRaw(p []byte) (int, error) {
	if c.rdDirty.Load() {
		c.deadlineDue()
	}
	for try := 0; ; try++ {
		c.rbuf, c.rn, c.rerr = p, 0, 0
		err := c.rc.Read(c.readFn)
		c.endWait()
		if err == nil || try == maxLapses || !c.lapsed(err) {
			return c.readDone(err)
		}
	}
}

// maxLapses bounds the retries of a Read after lapsed deadlines: one is
// the rule, more take a deadline set by another goroutine at that moment.
const maxLapses = 3

// lapsed reports whether a Read that failed with err is to be tried
// again: it failed on a deadline the poller had, and the deadline asked
// for now (handed over first, after any hand-over in flight) is none or
// still ahead. That is a deadline that lapsed while nobody read, or one
// replaced while a Read was starting to wait.
func (c *Conn) lapsed(err error) bool {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	_ = c.giveDeadline()
	d := c.rdWant.Load()
	return d == 0 || !dlPassed(d)
}

// SetReadDeadline implements net.Conn. The deadline reaches the poller
// only when a Read is about to wait for it: a read that finds its data
// already there (most of a busy connection's) never needed it. A
// keep-alive server sets two read deadlines per request (idle, then
// read timeout), and each costs the poller's lock and a runtime timer
// change: about 120 ns each here, against about 15 for this
// (BenchmarkKeepAliveDeadlines: 245 against 60 ns per request, with the
// check of the Read that finds its data). The contract is
// net.Conn's: a Read at or past the deadline fails, even with data
// waiting, and a deadline set while a Read waits (from another
// goroutine) ends or extends that wait. It returns an error only when it
// hands the deadline over at once; a closed connection is reported by
// the next Read (a keep-alive server ends the connection either way).
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.rdWant.Store(toDL(t))
	c.rdDirty.Store(true)
	if c.rdWaiting.Load() {
		return c.giveDeadline()
	}
	return nil
}

// SetDeadline implements net.Conn: the read deadline as SetReadDeadline,
// the write deadline at once.
func (c *Conn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetWriteDeadline(t)
}

// giveDeadline hands the poller the deadline last asked for, unless it
// has it.
func (c *Conn) giveDeadline() error {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	c.rdDirty.Store(false) // before the load: a later Set marks it again
	d := c.rdWant.Load()
	if c.rdKnown && d == c.rdSet {
		return nil
	}
	c.rdSet, c.rdKnown = d, true
	c.rdProgs.Add(1)
	return c.Conn.SetReadDeadline(fromDL(d))
}

// deadlineDue gives the poller a pending deadline that has already
// passed, before a Read that must then fail.
func (c *Conn) deadlineDue() {
	if d := c.rdWant.Load(); d != 0 && dlPassed(d) {
		_ = c.giveDeadline()
	}
}

// beginWait runs in the read callback before it returns false (wait):
// the deadline asked for goes to the poller now, and until the Read
// returns SetReadDeadline hands new ones straight to it.
func (c *Conn) beginWait() {
	c.rwaited = true
	c.rdWaiting.Store(true)
	if c.rdDirty.Load() {
		_ = c.giveDeadline() // a closed socket fails the wait itself
	}
}

func (c *Conn) endWait() {
	if c.rwaited {
		c.rwaited = false
		c.rdWaiting.Store(false)
	}
}

// Waits counts the read(2) calls that found nothing to read (EAGAIN), each
// followed by a wait for the poller; it wraps around. A caller compares
// two counts around its own Read to learn whether the data was already
// there.
func (c *Conn) Waits() uint32 { return c.waits.Load() }

// readDone turns a RawConn.Read's outcome into Read's results.
func (c *Conn) readDone(err error) (int, error) {
	n, errno := c.rn, c.rerr
	c.rbuf = nil
	if err != nil {
		return n, opName(err, "read")
	}
	if errno != 0 {
		return n, c.opError("read", errno)
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// readAfterHeld is Read with held bytes: the callback's first call
// writes them and waits, the next one reads the answer.
func (c *Conn) readAfterHeld(p []byte) (int, error) {
	if c.rdDirty.Load() {
		c.deadlineDue()
	}
	pend := c.pend
	for try := 0; ; try++ {
		c.pend = pend
		c.sendHeld, c.pn, c.herr = true, 0, 0
		c.rbuf, c.rn, c.rerr = p, 0, 0
		err := c.rc.Read(c.readFn)
		c.endWait()
		sent, herr := c.pn, c.herr
		c.sendHeld = false
		c.pend, c.pn = pend[:0], 0
		switch {
		case err != nil && sent == 0 && try < maxLapses && c.lapsed(err):
			// Nothing went out (the poller refused the wait at once): send
			// the held bytes under the deadline asked for.
			continue
		case err != nil && sent == 0:
			// Closed, or the deadline passed, before anything went out.
			c.rbuf = nil
			return 0, opName(err, "read")
		case herr != 0:
			c.rbuf = nil
			return 0, c.opError("write", herr)
		case err != nil && sent == len(pend) && c.lapsed(err):
			// Sent, and the wait for the answer ended on a deadline
			// replaced as it began: wait again under the one asked for.
			return c.readRaw(p)
		case err == nil && sent < len(pend):
			// The socket had no room for all of it: the rest the usual
			// way, then an ordinary read.
			c.rbuf = nil
			if _, werr := c.write(pend[sent:]); werr != nil {
				return 0, werr
			}
			return c.readRaw(p)
		}
		return c.readDone(err)
	}
}

// read is the RawConn.Read callback: false asks the poller to wait for
// readability.
func (c *Conn) read(fd uintptr) bool {
	if c.sendHeld {
		// The poller is armed (RawConn.Read reset its readiness before
		// this first call): whatever the peer sends in answer to these
		// bytes wakes the wait below, so there is no point reading
		// before it.
		c.sendHeld = false
		switch errno := WriteFrom(int(fd), c.pend, &c.pn); errno {
		case 0:
			c.beginWait()
			return false
		case syscall.EAGAIN:
			return true // no room: the rest goes out through Write
		default:
			c.herr = errno
			return true
		}
	}
	if c.wyErr != 0 {
		// The error a yield's second read met (see moreAfterYield).
		c.rerr, c.wyErr = c.wyErr, 0
		return true
	}
	for {
		n, errno := Read(int(fd), c.rbuf)
		switch errno {
		case 0:
			if c.rwaited && c.wakeYield && n > 0 && n < len(c.rbuf) {
				n = c.moreAfterYield(fd, n)
			}
			c.rn = n
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			c.waits.Add(1)
			c.beginWait()
			return false
		}
		c.rerr = errno
		return true
	}
}

// Write implements net.Conn: all of p, waiting for writability whenever
// the socket's buffer is full. While holding (HoldWrites), p is kept for
// the next Read instead, as long as the held bytes fit maxHeld.
func (c *Conn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.holding {
		if len(c.pend)+len(p) <= maxHeld {
			c.pend = append(c.pend, p...)
			return len(p), nil
		}
		// Too much to hold: what was held goes first, then p, now.
		c.holding = false
		pend := c.pend
		c.pend = c.pend[:0]
		if len(pend) > 0 {
			if _, err := c.write(pend); err != nil {
				return 0, err
			}
		}
	}
	return c.write(p)
}

func (c *Conn) write(p []byte) (int, error) {
	c.wbuf, c.wn, c.werr = p, 0, 0
	err := c.rc.Write(c.writeFn)
	n, errno := c.wn, c.werr
	c.wbuf = nil
	if err != nil {
		return n, opName(err, "write")
	}
	if errno != 0 {
		return n, c.opError("write", errno)
	}
	return n, nil
}

// writeCB is the RawConn.Write callback.
func (c *Conn) writeCB(fd uintptr) bool {
	switch errno := WriteFrom(int(fd), c.wbuf, &c.wn); errno {
	case 0:
		return true
	case syscall.EAGAIN:
		return false
	default:
		c.werr = errno
		return true
	}
}

// WriteFrom writes b[*off:] to the non-blocking descriptor fd, advancing
// *off, until all of it is written (0), the socket's buffer is full
// (EAGAIN) or the write fails (its errno).
func WriteFrom(fd int, b []byte, off *int) syscall.Errno {
	for *off < len(b) {
		n, errno := Write(fd, b[*off:])
		switch errno {
		case 0:
			if n == 0 {
				return syscall.EAGAIN // nothing taken: wait for room
			}
			*off += n
		case syscall.EINTR:
		default:
			return errno
		}
	}
	return 0
}

// HoldWrites makes the Writes that follow, up to the next Read, keep
// their bytes (at most maxHeld, copied) instead of writing them. That Read
// writes them once the poller is armed for the answer, and then waits
// for it without first reading a socket that cannot hold it yet: a
// request and its answer cost one read(2) instead of two, of which the
// first would find nothing (EAGAIN).
//
// Only for a peer that speaks only when spoken to, such as an HTTP
// server: bytes it sent before the held ones would not wake the Read
// (its readiness was reported before the Read armed the poller), and
// the Read would wait for the answer to the held bytes, or its deadline.
// The Read reports a failed held write as its own error, with the
// write's errno. Close discards held bytes: Read, Write and HoldWrites
// belong to one goroutine at a time.
func (c *Conn) HoldWrites() { c.holding = true }

// opError is the error of a failed call, shaped as package net shapes it.
func (c *Conn) opError(op string, errno syscall.Errno) error {
	return &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError(op, errno)}
}

// opName names the RawConn's error (a closed connection, an expired
// deadline) as the plain read or write that it is for the caller: logs
// say "read tcp …: i/o timeout", as with any net.Conn.
func opName(err error, op string) error {
	if oe, ok := err.(*net.OpError); ok {
		oe.Op = op
	}
	return err
}

// SyscallConn implements syscall.Conn with the wrapped socket's.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.rc, nil }
