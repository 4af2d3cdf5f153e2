package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"

	"github.com/zentinelproxy/sidecar/dataplane/internal/exchange"
	"github.com/zentinelproxy/sidecar/dataplane/internal/h2conn"
	"github.com/zentinelproxy/sidecar/internal/config"
)

// HTTP/2 upstreams (upstreams[].protocol h2 or h2c): each endpoint keeps
// its own x/net/http2 client connections (h2Pool), dialed through the
// endpoint's own dial (TLS with ALPN h2 for h2, plain TCP or a Unix socket
// with prior knowledge for h2c), at most max_conns of them, each carrying
// as many streams as the upstream's SETTINGS_MAX_CONCURRENT_STREAMS.
//
// A request whose body no agent sees may be duplex
// (exchange.UpstreamRequest.Duplex): RoundTrip returns at the response
// head while the Transport still sends the body, which a bidirectional
// gRPC stream needs. Otherwise RoundTrip returns once the body was sent
// whole, as over HTTP/1. A stream the upstream refused before processing
// it (REFUSED_STREAM, or beyond a GOAWAY's last stream) is sent once more,
// to another endpoint when there is one, if none of the client's body was
// taken.

// h2Pool is an endpoint's HTTP/2 connections: at most max, each taking
// as many streams as the upstream allows. A request takes the connection
// with the fewest streams that has room, or a new one while there are
// fewer than max; past that it waits on the least loaded one for a
// stream (x/net's StrictMaxConcurrentStreams), within response_timeout.
// Requests go through ClientConn.RoundTrip, not the Transport's: the
// Transport's own retries of refused streams back off for seconds on
// the same endpoint; refused streams come back here and go elsewhere.
type h2Pool struct {
	tr   *http2.Transport
	dial func() (net.Conn, error)
	max  int
	// writeTimeout fails a write to the upstream that sent nothing for
	// that long (idle_timeout).
	writeTimeout time.Duration

	mu      sync.Mutex
	dialed  sync.Cond // a dial ended (L: &mu)
	conns   []*http2.ClientConn
	dialing int
}

// newH2Pool makes the HTTP/2 connections of an endpoint of u that dials
// with dial.
func newH2Pool(u *config.Upstream, dial func(string) (net.Conn, error), hcAddr string) *h2Pool {
	tr := &http2.Transport{
		StrictMaxConcurrentStreams: true,
		DisableCompression:         true,
		// The response head's bound, as read_buffer_size is over HTTP/1.
		MaxHeaderListSize: uint32(u.ReadBufferSize),
		IdleConnTimeout:   u.KeepAlive,
		// A connection silent for idle_timeout is pinged, and closed when
		// the ping is not answered within PingTimeout (15 s).
		ReadIdleTimeout: u.IdleTimeout,
		// No WriteByteTimeout: the connection's writes are the drain's
		// (h2conn), which keeps that bound itself (writeTimeout).
	}
	p := &h2Pool{tr: tr, dial: func() (net.Conn, error) { return dial(hcAddr) }, max: u.MaxConns, writeTimeout: u.IdleTimeout}
	p.dialed.L = &p.mu
	return p
}

// get returns a connection for one request.
func (p *h2Pool) get() (*http2.ClientConn, error) {
	p.mu.Lock()
	for {
		cc, dial := p.pickLocked()
		switch {
		case cc != nil && !dial:
			p.mu.Unlock()
			return cc, nil
		case dial:
			return p.dialNew() // unlocks
		}
		// Every place is taken by a dial: its connection will do.
		p.dialed.Wait()
	}
}

// pickLocked picks the least loaded connection, and says whether a new
// one is to be dialed (the best is full, and there is room for one).
func (p *h2Pool) pickLocked() (*http2.ClientConn, bool) {
	var best *http2.ClientConn
	bestLoad, bestMax := 0, uint32(0)
	live := p.conns[:0]
	for _, cc := range p.conns {
		st := cc.State()
		if st.Closed || st.Closing {
			continue // its streams finish on their own
		}
		live = append(live, cc)
		load := st.StreamsActive + st.StreamsReserved + st.StreamsPending
		if best == nil || load < bestLoad {
			best, bestLoad, bestMax = cc, load, st.MaxConcurrentStreams
		}
	}
	clear(p.conns[len(live):])
	p.conns = live
	full := best == nil || bestMax > 0 && bestLoad >= int(bestMax)
	return best, full && len(p.conns)+p.dialing < p.max
}

// dialNew dials a connection, with p.mu held (and released).
func (p *h2Pool) dialNew() (*http2.ClientConn, error) {
	p.dialing++
	p.mu.Unlock()
	c, err := p.dial()
	var cc *http2.ClientConn
	if err == nil {
		// x/net's client flushes each request's HEADERS, and each DATA
		// frame, in a write(2) of its own; the drain sends what the
		// streams wrote meanwhile in one (h2conn).
		w, hc := h2conn.New(c)
		w.SetWriteTimeout(p.writeTimeout)
		if cc, err = p.tr.NewClientConn(hc); err != nil {
			_ = c.Close()
		}
	}
	p.mu.Lock()
	p.dialing--
	if err == nil {
		p.conns = append(p.conns, cc)
	}
	p.dialed.Broadcast()
	p.mu.Unlock()
	if err != nil {
		return nil, &dialError{err: err}
	}
	return cc, nil
}

// roundTrip sends req on one of the connections.
func (p *h2Pool) roundTrip(req *http.Request) (*http.Response, error) {
	cc, err := p.get()
	if err != nil {
		return nil, err
	}
	return cc.RoundTrip(req)
}

// closeIdle closes the connections without a stream.
func (p *h2Pool) closeIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	live := p.conns[:0]
	for _, cc := range p.conns {
		if st := cc.State(); st.StreamsActive == 0 && st.StreamsReserved == 0 && st.StreamsPending == 0 {
			_ = cc.Close()
			continue
		}
		live = append(live, cc)
	}
	clear(p.conns[len(live):])
	p.conns = live
}

// dialError is a connection to an endpoint that could not be made.
type dialError struct{ err error }

func (e *dialError) Error() string { return "connecting to upstream: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// h2Call is one request's stream to an HTTP/2 upstream: the exchange's
// UpstreamResponse and the Source of its body.
type h2Call struct {
	up   *Upstream
	req  *exchange.UpstreamRequest
	ep   *Endpoint
	resp *http.Response
	head exchange.ResponseHead
	tr   []exchange.Field
	body *h2Body // the request body (nil: none)
	// The backing arrays of head.Fields, tr and the keys fields sorts,
	// while they fit (a gRPC response's head and trailers do).
	headArr [8]exchange.Field
	trArr   [4]exchange.Field
	keyArr  [8]string

	ctx      context.Context
	cancel   context.CancelFunc
	timer    *time.Timer // response_timeout, then the body's idle timeout
	timedOut atomic.Bool
	extended time.Time
	attached bool
}

// cancelCloser is a stream's cancel as the Guard's io.Closer.
type cancelCloser struct{ cancel context.CancelFunc }

func (c cancelCloser) Close() error { c.cancel(); return nil }

// errH2Timeout is a stream that waited past response_timeout or the
// body's idle timeout.
var errH2Timeout = fmt.Errorf("upstream stream: %w", os.ErrDeadlineExceeded)

func (up *Upstream) roundTripH2(req *exchange.UpstreamRequest) (exchange.UpstreamResponse, error) {
	c := &h2Call{up: up, req: req}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if !req.Guard.Attach(cancelCloser{c.cancel}) {
		c.cancel()
		return nil, errCanceled
	}
	c.attached = true
	var tried [config.MaxEndpointAttempts]*Endpoint
	ntried := 0
	ep := up.pick(nil)
	refusedRetry := false
	for {
		tried[ntried] = ep
		ntried++
		err := c.attempt(ep)
		if err == nil {
			return c, nil
		}
		var pe *producerError
		switch {
		case errors.As(err, &pe):
			c.end()
			return nil, pe.err
		case req.Guard.Canceled():
			c.end()
			return nil, err
		case c.timedOut.Load():
			up.failed(ep)
			c.end()
			return nil, errH2Timeout
		}
		// The attempt's body is abandoned by now (attempt): Consumed reads
		// what no Read changes any more. A body the agents buffered whole
		// is produced again; one of the client's, once taken, cannot be.
		fresh := req.Body == nil || !req.Body.Consumed()
		if refused(err) && !refusedRetry && fresh {
			// Not processed: any method may go again, once.
			refusedRetry = true
			up.stats.Retries.Add(1)
			if next := up.pick(tried[:ntried]); next != nil && ntried < len(tried) {
				up.stats.EndpointRetries.Add(1)
				ep = next
			} else {
				ntried--
			}
			continue
		}
		up.failed(ep)
		if dialFailed(err) && fresh {
			var next *Endpoint
			if ntried < up.attempts {
				next = up.pick(tried[:ntried])
			}
			if next != nil {
				up.stats.EndpointRetries.Add(1)
				ep = next
				continue
			}
		}
		c.end()
		if errors.Is(err, exchange.ErrUpstreamBusy) {
			return nil, err
		}
		return nil, &upstreamError{err: err}
	}
}

// attempt sends the request on ep and reads the response head.
func (c *h2Call) attempt(ep *Endpoint) error {
	r := c.req
	ep.begin()
	c.ep = ep
	scheme := "http"
	if c.up.cfg.TLS != nil {
		scheme = "https"
	}
	host := ep.addr
	if strings.HasPrefix(host, "unix:") {
		host = "localhost"
	}
	method, ok := commonMethods[string(r.Method)]
	if !ok {
		method = string(r.Method)
	}
	// Made with its context, then filled: WithContext on the filled
	// request would copy it (an allocation more per call; the empty one
	// stays on the stack).
	hreq := (&http.Request{}).WithContext(c.ctx)
	hreq.Method = method
	hreq.URL = &url.URL{Scheme: scheme, Host: host, Opaque: string(r.Target)}
	hreq.Proto, hreq.ProtoMajor = "HTTP/2.0", 2
	hreq.Header = make(http.Header, len(r.Fields)+1)
	hreq.Host = string(r.Host)
	// The values are substrings of one string, and the slices of single
	// fields share one backing array: 2 allocations for the fields, not
	// 2 or 3 each (a gRPC call's: 14 of 160 per call).
	size := 0
	for _, f := range r.Fields {
		size += len(f.Value)
	}
	var sb strings.Builder
	sb.Grow(size)
	for _, f := range r.Fields {
		sb.Write(f.Value)
	}
	all := sb.String()
	vals := make([]string, len(r.Fields))
	grpc := false
	off := 0
	for i, f := range r.Fields {
		k, ok := commonRequestKeys[string(f.Name)]
		if !ok {
			k = http.CanonicalHeaderKey(string(f.Name))
		}
		vals[i] = all[off : off+len(f.Value)]
		off += len(f.Value)
		if old, dup := hreq.Header[k]; dup {
			hreq.Header[k] = append(old, vals[i])
		} else {
			hreq.Header[k] = vals[i : i+1 : i+1]
		}
		if k == "Content-Type" && strings.HasPrefix(vals[i], "application/grpc") {
			grpc = true
		}
	}
	if grpc {
		// gRPC servers may insist on it (the exchange drops the client's
		// TE as hop-by-hop).
		hreq.Header["Te"] = teTrailers
	}
	if r.Body != nil {
		c.body = &h2Body{p: r.Body, done: make(chan struct{})}
		if r.BodyLen < 0 || r.Trailer != nil {
			// The client's trailers, if it sends any, go as the stream's
			// trailers: filled in when the body ends (h2Body.read), which
			// is before x/net reads the map. Names the client announced
			// are announced (a Go server keeps only those).
			hreq.Trailer = http.Header{}
			for name := range exchange.TrailerNames(r.Trailer) {
				hreq.Trailer[http.CanonicalHeaderKey(string(name))] = nil
			}
			c.body.tr = hreq.Trailer
		}
		hreq.Body = c.body
		hreq.ContentLength = r.BodyLen
		if r.BodyLen == 0 {
			hreq.ContentLength = -1
		}
	}
	c.timer = time.AfterFunc(c.up.cfg.ResponseTimeout, c.expire)
	resp, err := ep.h2.roundTrip(hreq)
	if err == nil && c.body != nil && !r.Duplex {
		// The exchange reads the response only once the whole body went.
		<-c.body.done
		if perr := c.body.producerErr(); perr != nil {
			_ = resp.Body.Close()
			resp, err = nil, perr
		}
	}
	if err != nil {
		c.timer.Stop()
		ep.end()
		c.ep = nil
		if c.body != nil {
			c.body.abandon()
			if perr := c.body.producerErr(); perr != nil {
				err = perr
			}
		}
		return err
	}
	c.timer.Stop()
	c.resp = resp
	c.readHead()
	if resp.StatusCode >= 500 {
		c.up.got5xx(ep)
	} else {
		ep.succeeded()
	}
	return nil
}

// teTrailers is the TE field of gRPC requests; x/net only reads it.
var teTrailers = []string{"trailers"}

// commonMethods are the request methods as strings, looked up without
// allocating.
var commonMethods = map[string]string{
	"GET": "GET", "POST": "POST", "PUT": "PUT", "DELETE": "DELETE", "HEAD": "HEAD",
	"OPTIONS": "OPTIONS", "PATCH": "PATCH",
}

// commonRequestKeys are the canonical forms of frequent request field
// names, in the spellings the fronts give (looked up without allocating).
var commonRequestKeys = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{"Accept", "Accept-Encoding", "Accept-Language", "Authorization", "Cache-Control",
		"Content-Type", "Cookie", "Forwarded", "Origin", "Referer", "Traceparent", "Tracestate", "User-Agent",
		"Via", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Real-Ip", "X-Request-Id",
		"Grpc-Timeout", "Grpc-Encoding", "Grpc-Accept-Encoding", "Grpc-Trace-Bin"} {
		m[k] = k
		m[strings.ToLower(k)] = k
	}
	m["X-Real-IP"] = "X-Real-Ip"
	return m
}()

// expire ends a stream past its deadline.
func (c *h2Call) expire() {
	c.timedOut.Store(true)
	c.cancel()
}

// readHead fills the response head for the exchange.
func (c *h2Call) readHead() {
	resp := c.resp
	hd := &c.head
	hd.Status = resp.StatusCode
	hd.Fields = c.fields(resp.Header, c.headArr[:0])
	hd.ContentLength = resp.ContentLength
	if hd.ContentLength < 0 {
		hd.ContentLength = -1
	}
	hd.HasBody = !c.req.Head && resp.ContentLength != 0 && resp.StatusCode != 204 && resp.StatusCode != 304
}

// end releases what an attempt left: the stream's context, the guard.
func (c *h2Call) end() {
	if c.timer != nil {
		c.timer.Stop()
	}
	c.cancel()
	if c.attached {
		c.attached = false
		c.req.Guard.Detach()
	}
}

// refused reports a stream the upstream did not process: RST_STREAM
// REFUSED_STREAM, or a GOAWAY that came before it. x/net retries those
// itself on a new connection to the same endpoint while none of the body
// went; what still fails comes back here.
func refused(err error) bool {
	var se http2.StreamError
	if errors.As(err, &se) && se.Code == http2.ErrCodeRefusedStream {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "received Server's graceful shutdown GOAWAY") || strings.Contains(msg, "client conn not usable")
}

// dialFailed reports a connection that could not be made.
func dialFailed(err error) bool {
	var de *dialError
	return errors.As(err, &de)
}

// Head implements exchange.UpstreamResponse.
func (c *h2Call) Head() *exchange.ResponseHead { return &c.head }

// Body implements exchange.UpstreamResponse.
func (c *h2Call) Body() exchange.Source {
	if !c.head.HasBody {
		return nil
	}
	return c
}

// Endpoint implements exchange.UpstreamResponse.
func (c *h2Call) Endpoint() string { return c.ep.addr }

// Trailers implements exchange.TrailerSource: the response's trailers,
// complete once its body was read to the end.
func (c *h2Call) Trailers() []exchange.Field {
	if c.tr != nil || len(c.resp.Trailer) == 0 {
		return c.tr
	}
	c.tr = c.fields(c.resp.Trailer, c.trArr[:0])
	return c.tr
}

// fields appends h's fields to dst, sorted by name, their names and
// values copied into one buffer (one allocation; the sort's keys and dst
// in the call's own arrays while they fit).
func (c *h2Call) fields(h http.Header, dst []exchange.Field) []exchange.Field {
	keys := c.keyArr[:0]
	size := 0
	for k, vs := range h {
		keys = append(keys, k)
		for _, v := range vs {
			size += len(k) + len(v)
		}
	}
	slices.Sort(keys)
	buf := make([]byte, 0, size)
	for _, k := range keys {
		for _, v := range h[k] {
			buf = append(buf, k...)
			name := buf[len(buf)-len(k) : len(buf) : len(buf)]
			buf = append(buf, v...)
			dst = append(dst, exchange.Field{Name: name, Value: buf[len(buf)-len(v) : len(buf) : len(buf)]})
		}
	}
	return dst
}

// Release implements exchange.UpstreamResponse: the stream is closed
// (reset when its body was not read to the end; the connection stays),
// and a duplex body's sending is waited for: its producer is the
// exchange's, which is reused after Release.
func (c *h2Call) Release(bool) {
	_ = c.resp.Body.Close()
	c.cancel()
	if c.body != nil {
		<-c.body.done
	}
	c.ep.end()
	c.end()
}

// Detach implements exchange.UpstreamResponse: HTTP/2 has no Upgrade.
func (c *h2Call) Detach() (exchange.Tunnel, bool) { return exchange.Tunnel{}, false }

// Read implements exchange.Source.
func (c *h2Call) Read(p []byte) (int, error) {
	n, err := c.resp.Body.Read(p)
	if err != nil && err != io.EOF && c.timedOut.Load() {
		err = errH2Timeout
	}
	return n, err
}

// Pending implements exchange.Source: the stream's buffer is not shown.
func (c *h2Call) Pending() bool { return false }

// Buffered implements exchange.Source: the body's idle timeout is kept
// by a timer (ExtendRead).
func (c *h2Call) Buffered(int64) bool { return false }

// ExtendRead moves the body's idle timeout to idle_timeout from now, at
// most every quarter of it.
func (c *h2Call) ExtendRead() {
	idle := c.up.cfg.IdleTimeout
	now := time.Now()
	if now.Sub(c.extended) > idle/4 {
		c.extended = now
		c.timer.Reset(idle)
	}
}

// SetReadDeadline implements exchange.Source.
func (c *h2Call) SetReadDeadline(t time.Time) {
	c.extended = time.Time{}
	c.timer.Reset(time.Until(t))
}

// Truncated implements exchange.Source: a stream cut off is an error of
// its own (a reset), never a short io.EOF.
func (c *h2Call) Truncated() bool { return false }

// h2Body is the request body as the Transport reads it, from the
// exchange's producer. done is closed once the Transport is through with
// it (the end of the body, an error, or Close) and no Read runs: the
// producer is the exchange's, reused after the request.
type h2Body struct {
	p    exchange.BodyProducer
	rest []byte
	last bool
	err  error // the producer's error, as a producerError
	done chan struct{}
	// tr is the request's Trailer map (nil: the request has none), filled
	// from the producer's trailers at the body's end.
	tr     http.Header
	trDone bool

	mu      sync.Mutex
	reading bool
	closed  bool
	ended   bool // done is closed
}

var errBodyClosed = errors.New("request body closed")

func (b *h2Body) Read(p []byte) (int, error) {
	b.mu.Lock()
	if b.closed || b.ended {
		err := b.err
		b.mu.Unlock()
		if err == nil {
			err = errBodyClosed
		}
		return 0, err
	}
	b.reading = true
	b.mu.Unlock()
	n, end, err := b.read(p)
	b.mu.Lock()
	b.reading = false
	if end || b.closed {
		b.endLocked()
	}
	b.mu.Unlock()
	return n, err
}

// read is Read outside the lock; end: the body ended (io.EOF or an error).
func (b *h2Body) read(p []byte) (int, bool, error) {
	for len(b.rest) == 0 {
		if b.last {
			if !b.trDone {
				b.trDone = true
				b.trailers()
			}
			return 0, true, io.EOF
		}
		data, last, err := b.p.Next()
		if err != nil {
			b.err = &producerError{err: err}
			return 0, true, b.err
		}
		b.rest, b.last = data, last
	}
	n := copy(p, b.rest)
	b.rest = b.rest[n:]
	return n, false, nil
}

// trailers puts the client's trailers in the request's Trailer map, for
// x/net to send once it read the body's end; a request without the map
// counts them as dropped.
func (b *h2Body) trailers() {
	tr := b.p.Trailers(b.tr != nil)
	for _, f := range tr {
		k := http.CanonicalHeaderKey(string(f.Name))
		b.tr[k] = append(b.tr[k], string(f.Value))
	}
}

// Close implements io.Closer: the Transport is done with the body. A Read
// still running ends it when it returns.
func (b *h2Body) Close() error {
	b.mu.Lock()
	b.closed = true
	if !b.reading {
		b.endLocked()
	}
	b.mu.Unlock()
	return nil
}

func (b *h2Body) endLocked() {
	if !b.ended {
		b.ended = true
		close(b.done)
	}
}

// abandon ends the body after a failed RoundTrip, and waits for a Read
// the Transport may still be in.
func (b *h2Body) abandon() {
	_ = b.Close()
	<-b.done
}

// producerErr is the producer's error, if one ended the body (after done).
func (b *h2Body) producerErr() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}
