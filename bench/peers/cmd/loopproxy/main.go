// Command loopproxy is a floor, not a product: the least a reverse proxy
// written in Go can cost on the benchmark's job when it is built the way
// HAProxy is — one thread, one epoll loop, every socket non-blocking and
// read only once epoll says it is readable, so no read ever meets EAGAIN
// — and, with -agent, when it consults the Go SDK agent over the real
// UDS protocol (protobuf payloads), every event of one loop iteration
// leaving in one write.
//
// It handles what the benchmark sends and nothing else: GET requests
// without a body, an upstream that answers with Content-Length. No
// timeouts, no limits beyond a head size, no TLS: it is not safe to put in
// front of anything. It exists to measure how far below the fasthttp floor
// an event-loop engine could take the sidecar.
package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"time"
	"unsafe"

	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

const maxHead = 16 << 10

// maxPolls bounds how many non-blocking polls may find more work while
// events for the agent wait to be written.
const maxPolls = 8

type kind uint8

const (
	kListener kind = iota
	kClient
	kUpstream
	kAgent
)

type conn struct {
	fd   int
	kind kind
	in   []byte // read, not yet consumed
	out  []byte // to write once the socket takes it
	// client
	busy bool   // a request is with the agent or the upstream
	req  []byte // its head
	// upstream
	cl *conn // the client it answers
}

type loop struct {
	ep       int
	conns    map[int]*conn
	idle     []*conn // upstream connections with no request
	upstream syscall.SockaddrInet4

	agent    *conn
	enc      uds.Encoding
	pending  map[uint64]*conn
	nextID   uint64
	ev       protocol.RequestHeaders
	dec      protocol.Decision
	frame    pbwire.Frame
	writable []*conn // connections with output left, retried after each iteration
	scratch  []byte
	block    []byte
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "TCP `address` to listen on")
	upstream := flag.String("upstream", "127.0.0.1:9000", "upstream `host:port` (IPv4)")
	agent := flag.String("agent", "", "the agent's Unix socket `path` (empty: no agent)")
	flag.Parse()
	runtime.LockOSThread()
	if err := run(*listen, *upstream, *agent); err != nil {
		fmt.Fprintln(os.Stderr, "loopproxy:", err)
		os.Exit(1)
	}
}

func sockaddr(s string) (syscall.SockaddrInet4, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil || !ap.Addr().Is4() {
		return syscall.SockaddrInet4{}, fmt.Errorf("%q: want an IPv4 host:port", s)
	}
	return syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}, nil
}

func run(listen, upstream, agentPath string) error {
	la, err := sockaddr(listen)
	if err != nil {
		return err
	}
	l := &loop{conns: map[int]*conn{}, pending: map[uint64]*conn{}}
	if l.upstream, err = sockaddr(upstream); err != nil {
		return err
	}
	if l.ep, err = syscall.EpollCreate1(syscall.EPOLL_CLOEXEC); err != nil {
		return err
	}
	lfd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	_ = syscall.SetsockoptInt(lfd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	if err := syscall.Bind(lfd, &la); err != nil {
		return err
	}
	if err := syscall.Listen(lfd, 1024); err != nil {
		return err
	}
	l.add(&conn{fd: lfd, kind: kListener})
	if agentPath != "" {
		if err := l.dialAgent(agentPath); err != nil {
			return err
		}
	}
	events := make([]syscall.EpollEvent, 256)
	for polls := 0; ; {
		var n int
		var err error
		if l.agent != nil && len(l.agent.out) > 0 {
			// Events for the agent are waiting: first take whatever else
			// is ready without blocking, so that they leave together —
			// when a poll finds nothing more, or after maxPolls.
			n, err = epollPoll(l.ep, events)
			if err == nil && (n == 0 || polls >= maxPolls) {
				polls = 0
				if !l.flush(l.agent) {
					return errors.New("agent connection lost")
				}
				if n == 0 {
					continue
				}
			} else {
				polls++
			}
		} else {
			n, err = epollWait(l.ep, events)
		}
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			c := l.conns[int(events[i].Fd)]
			if c == nil {
				continue
			}
			switch c.kind {
			case kListener:
				l.accept(c)
			case kClient:
				l.clientReadable(c)
			case kUpstream:
				l.upstreamReadable(c)
			case kAgent:
				if err := l.agentReadable(c); err != nil {
					return err
				}
			}
		}
		// Everything asked of the agent while events were ready leaves in
		// one write, once a poll finds nothing more (above), or now when
		// the batch is big.
		if l.agent != nil && len(l.agent.out) >= 64<<10 {
			if !l.flush(l.agent) {
				return errors.New("agent connection lost")
			}
		}
		if len(l.writable) > 0 {
			w := l.writable
			l.writable = nil
			for _, c := range w {
				if c.fd >= 0 && len(c.out) > 0 && !l.flush(c) {
					l.close(c)
				}
			}
		}
	}
}

func (l *loop) add(c *conn) {
	l.conns[c.fd] = c
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(c.fd)}
	_ = syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_ADD, c.fd, &ev)
}

func (l *loop) close(c *conn) {
	if c.fd < 0 {
		return
	}
	delete(l.conns, c.fd)
	_ = syscall.Close(c.fd) // also leaves the epoll set
	c.fd = -1
	switch c.kind {
	case kClient:
		if c.busy {
			// Its upstream (if any) is mid-response: drop it too.
			for _, u := range l.conns {
				if u.kind == kUpstream && u.cl == c {
					l.close(u)
				}
			}
		}
	case kUpstream:
		for i, u := range l.idle {
			if u == c {
				l.idle = append(l.idle[:i], l.idle[i+1:]...)
				break
			}
		}
		if c.cl != nil {
			l.close(c.cl)
		}
	}
}

// write writes as much of b as the socket takes now: n bytes, and ok
// false when the connection failed.
func write(fd int, b []byte) (n int, ok bool) {
	for n < len(b) {
		m, err := syscall.Write(fd, b[n:])
		if err == syscall.EINTR {
			continue
		}
		if err == syscall.EAGAIN {
			return n, true
		}
		if err != nil || m <= 0 {
			return n, false
		}
		n += m
	}
	return n, true
}

// flush writes c.out; false when the connection failed. What the socket
// does not take now is retried after the next iteration.
func (l *loop) flush(c *conn) bool {
	n, ok := write(c.fd, c.out)
	c.out = c.out[:copy(c.out, c.out[n:])]
	if ok && len(c.out) > 0 {
		l.writable = append(l.writable, c)
	}
	return ok
}

// send writes b to c. With nothing queued it writes b itself and copies
// only what the socket did not take; behind queued output it queues.
func (l *loop) send(c *conn, b []byte) {
	if len(c.out) > 0 {
		c.out = append(c.out, b...) // c is in l.writable already
		return
	}
	n, ok := write(c.fd, b)
	if !ok {
		l.close(c)
		return
	}
	if n < len(b) {
		c.out = append(c.out, b[n:]...)
		l.writable = append(l.writable, c)
	}
}

// fill reads what c's socket has (it is readable); false on EOF or error.
func fill(c *conn) bool {
	if cap(c.in)-len(c.in) < 4096 {
		c.in = append(make([]byte, 0, 2*cap(c.in)+8192), c.in...)
	}
	for {
		n, err := syscall.Read(c.fd, c.in[len(c.in):cap(c.in)])
		if err == syscall.EINTR {
			continue
		}
		if err == syscall.EAGAIN {
			return true
		}
		if err != nil || n <= 0 {
			return false
		}
		c.in = c.in[:len(c.in)+n]
		return true
	}
}

func (l *loop) accept(ln *conn) {
	for {
		fd, _, err := syscall.Accept4(ln.fd, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
		if err == syscall.EINTR || err == syscall.ECONNABORTED {
			continue
		}
		if err != nil {
			return
		}
		_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
		l.add(&conn{fd: fd, kind: kClient, in: make([]byte, 0, 4096)})
	}
}

func (l *loop) clientReadable(c *conn) {
	if !fill(c) {
		l.close(c)
		return
	}
	l.nextRequest(c)
}

var (
	crlf2       = []byte("\r\n\r\n")
	hdrCL       = []byte("content-length")
	hdrTE       = []byte("transfer-encoding")
	notHandled  = []byte("HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	agentFailed = []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
)

// headEnd is where the head buffered on c ends (before its blank line),
// or -1 when it is not complete yet; c is closed when it has buffered
// more than maxHead without one.
func (l *loop) headEnd(c *conn) int {
	i := bytes.Index(c.in, crlf2)
	if i < 0 && len(c.in) > maxHead {
		l.close(c)
	}
	return i
}

// nextRequest starts the next request buffered on c, if c is free.
func (l *loop) nextRequest(c *conn) {
	if c.busy || c.fd < 0 {
		return
	}
	i := l.headEnd(c)
	if i < 0 {
		return
	}
	c.req = append(c.req[:0], c.in[:i+4]...)
	c.in = c.in[:copy(c.in, c.in[i+4:])]
	c.busy = true
	l.ev.Reset()
	if !parseRequest(c.req, &l.ev) {
		l.send(c, notHandled)
		l.close(c)
		return
	}
	if l.agent == nil {
		l.forward(c, c.req)
		return
	}
	l.nextID++
	l.ev.RequestID = l.nextID
	l.ev.Metadata.Protocol = protoHTTP11
	var err error
	if l.agent.out, err = uds.AppendFrameAs(l.agent.out, &l.ev, l.enc); err != nil {
		l.send(c, agentFailed)
		c.busy = false
		return
	}
	l.pending[l.nextID] = c
}

var protoHTTP11 = []byte("HTTP/1.1")

// parseRequest fills ev from a request head; false for what this program
// does not handle (a body, a malformed head).
func parseRequest(head []byte, ev *protocol.RequestHeaders) bool {
	line, rest, ok := bytes.Cut(head, []byte("\r\n"))
	if !ok {
		return false
	}
	m, rest1, ok1 := bytes.Cut(line, []byte(" "))
	uri, _, ok2 := bytes.Cut(rest1, []byte(" "))
	if !ok1 || !ok2 {
		return false
	}
	ev.Method, ev.URI = m, uri
	for len(rest) > 2 {
		var h []byte
		h, rest, _ = bytes.Cut(rest, []byte("\r\n"))
		name, value, ok := bytes.Cut(h, []byte(":"))
		if !ok {
			return false
		}
		value = bytes.TrimSpace(value)
		if bytes.EqualFold(name, hdrTE) || (bytes.EqualFold(name, hdrCL) && !bytes.Equal(value, []byte("0"))) {
			return false
		}
		ev.Headers = append(ev.Headers, protocol.Header{Name: name, Value: value})
	}
	return true
}

// forward sends the request head out to an upstream connection.
func (l *loop) forward(c *conn, head []byte) {
	var u *conn
	if n := len(l.idle); n > 0 {
		u, l.idle = l.idle[n-1], l.idle[:n-1]
	} else {
		var err error
		if u, err = l.dialUpstream(); err != nil {
			l.send(c, []byte("HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n"))
			c.busy = false
			return
		}
	}
	u.cl = c
	l.send(u, head)
}

func (l *loop) dialUpstream() (*conn, error) {
	// A blocking connect (loopback answers at once), then non-blocking.
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := syscall.Connect(fd, &l.upstream); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	_ = syscall.SetNonblock(fd, true)
	_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
	u := &conn{fd: fd, kind: kUpstream, in: make([]byte, 0, 8192)}
	l.add(u)
	return u, nil
}

func (l *loop) upstreamReadable(u *conn) {
	if !fill(u) {
		l.close(u)
		return
	}
	i := l.headEnd(u)
	if i < 0 {
		return
	}
	cl := contentLength(u.in[:i])
	if cl < 0 {
		l.close(u) // not a response this program understands
		return
	}
	total := i + 4 + cl
	if len(u.in) < total {
		return
	}
	c := u.cl
	u.cl = nil
	if c != nil && c.fd >= 0 {
		l.send(c, u.in[:total])
	}
	u.in = u.in[:copy(u.in, u.in[total:])]
	l.idle = append(l.idle, u)
	if c != nil && c.fd >= 0 {
		c.busy = false
		l.nextRequest(c)
	}
}

// contentLength finds Content-Length in a response head (-1: none).
func contentLength(head []byte) int {
	_, rest, _ := bytes.Cut(head, []byte("\r\n")) // past the status line
	for len(rest) > 0 {
		var h []byte
		h, rest, _ = bytes.Cut(rest, []byte("\r\n"))
		name, value, ok := bytes.Cut(h, []byte(":"))
		if ok && bytes.EqualFold(name, hdrCL) {
			n, err := strconv.Atoi(string(bytes.TrimSpace(value)))
			if err != nil || n < 0 {
				return -1
			}
			return n
		}
	}
	return -1
}

func (l *loop) dialAgent(path string) error {
	nc, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		return err
	}
	defer nc.Close()
	fr, caps, err := udsclient.Handshake(nc, "loopproxy", 5*time.Second, true)
	if err != nil {
		return err
	}
	if fr.Buffered() > 0 {
		return errors.New("agent: frames before the first event")
	}
	if caps.SupportsProtobufPayloads {
		l.enc = uds.Protobuf
	}
	// The loop owns a duplicate of the descriptor; nc is closed.
	raw, err := nc.(*net.UnixConn).SyscallConn()
	if err != nil {
		return err
	}
	fd, derr := -1, error(nil)
	if err := raw.Control(func(s uintptr) { fd, derr = syscall.Dup(int(s)) }); err != nil {
		return err
	}
	if derr != nil {
		return derr
	}
	_ = syscall.SetNonblock(fd, true)
	l.agent = &conn{fd: fd, kind: kAgent, in: make([]byte, 0, 64<<10)}
	l.add(l.agent)
	return nil
}

func (l *loop) agentReadable(a *conn) error {
	if !fill(a) {
		return errors.New("agent connection lost")
	}
	for {
		if len(a.in) < uds.HeaderSize {
			break
		}
		n := int(binary.BigEndian.Uint32(a.in))
		if n == 0 || n > protocol.MaxFrameSize {
			return fmt.Errorf("agent: bad frame length %d", n)
		}
		if len(a.in) < 4+n {
			break
		}
		t := protocol.MsgType(a.in[4])
		payload := a.in[uds.HeaderSize : 4+n]
		if t == protocol.TypeDecision {
			if err := l.decision(payload); err != nil {
				return err
			}
		}
		a.in = a.in[:copy(a.in, a.in[4+n:])]
	}
	return nil
}

func (l *loop) decision(payload []byte) error {
	l.dec.Reset()
	var err error
	if l.enc == uds.Protobuf {
		l.frame.ParseAs(protocol.TypeDecision, payload)
		if err = l.frame.Err; err == nil {
			err = l.frame.DecodeDecision(&l.dec)
		}
	} else {
		err = l.dec.Decode(payload)
	}
	if err == nil {
		err = l.dec.Normalize()
	}
	if err != nil {
		return fmt.Errorf("agent: undecodable decision: %w", err)
	}
	c := l.pending[l.dec.RequestID]
	delete(l.pending, l.dec.RequestID)
	if c == nil || c.fd < 0 {
		return nil
	}
	switch l.dec.Kind {
	case protocol.DecisionAllow:
		l.scratch = applyOps(l.scratch[:0], c.req, l.dec.RequestHeaderOps)
		l.forward(c, l.scratch)
	case protocol.DecisionBlock:
		b := append(l.block[:0], "HTTP/1.1 "...)
		b = strconv.AppendInt(b, int64(l.dec.Status), 10)
		b = append(b, " Blocked\r\nContent-Length: "...)
		b = strconv.AppendInt(b, int64(len(l.dec.Body)), 10)
		b = append(b, "\r\n\r\n"...)
		b = append(b, l.dec.Body...)
		l.block = b
		l.send(c, b)
		c.busy = false
		l.nextRequest(c)
	default:
		l.send(c, agentFailed)
		c.busy = false
		l.nextRequest(c)
	}
	return nil
}

// applyOps appends to dst head with the agent's set operations applied
// (the only kind the benchmark's agent sends).
func applyOps(dst, head []byte, ops []protocol.HeaderOp) []byte {
	end := len(head) - 2 // before the blank line
	out := append(dst, head[:end]...)
	for _, op := range ops {
		if op.Op != protocol.HeaderSet {
			continue
		}
		out = append(out, op.Name...)
		out = append(out, ": "...)
		out = append(out, op.Value...)
		out = append(out, "\r\n"...)
	}
	return append(out, "\r\n"...)
}

// epollWait waits up to a millisecond for events without telling the
// runtime: a wait entered as a system call (syscall.EpollWait) leaves the
// P in a system call, sysmon hands it to another thread after 20 µs and
// then keeps waking every 20 µs — on a core shared with the agent, more
// context switches than requests. Holding the P through the wait is safe
// here because this goroutine is the only one with work: the wait is
// bounded, and the loop yields after each one so that the runtime's own
// goroutines (the garbage collector's) still run.
func epollWait(ep int, events []syscall.EpollEvent) (int, error) {
	runtime.Gosched()
	return epollPwait(ep, events, 1)
}

// epollPoll is epollWait without waiting.
func epollPoll(ep int, events []syscall.EpollEvent) (int, error) {
	return epollPwait(ep, events, 0)
}

func epollPwait(ep int, events []syscall.EpollEvent, timeoutMS uintptr) (int, error) {
	r, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, uintptr(ep),
		uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), timeoutMS, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}
