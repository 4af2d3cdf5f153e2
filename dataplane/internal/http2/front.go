package http2

import (
	"context"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/dataplane/internal/exchange"
	"github.com/zentinelproxy/sidecar/internal/observe"
)

// stream is one HTTP/2 stream's exchange and what its Front needs of
// net/http: the ResponseWriter, the request, the body. Pooled with the
// exchange it embeds.
type stream struct {
	ex   exchange.Exchange
	srv  *Server
	w    http.ResponseWriter
	r    *http.Request
	info *exchange.Conn
	body reqBody
	// uri normalises the path as the HTTP/1 front end's parse does
	// (fasthttp's: percent-decoding, dot segments, repeated slashes), so
	// that routes and agents see one path whatever the client's protocol.
	uri fasthttp.URI
	// arena holds the head's bytes (names, values, method, target) for
	// the exchange; keys sorts the header names.
	arena   []byte
	keys    []string
	scratch []byte
	// fired is the stream's cancel hook (serveStream), onReset the hook's
	// function, made once per pooled stream.
	fired   sync.WaitGroup
	onReset func()
	vals    []string
	// seen are the response field values this pooled stream sent last,
	// by position, and clen its Content-Length with clenN its number:
	// the next response reuses the strings of the values it repeats (an
	// upstream's Server, Content-Type; the length of same-sized bodies)
	// instead of allocating them again.
	seen  []string
	clen  []string
	clenN int64
	// wext is when the response's write deadline was last moved
	// (extendWrite; zero: none set).
	wext time.Time
}

type writeDeadliner interface{ SetWriteDeadline(time.Time) error }

// fullPiece is the most of a whole response body written under one write
// deadline (extendWrite).
const fullPiece = 64 << 10

// extendWrite moves the stream's write deadline to body_timeout from now,
// at most every quarter of it, as a stalled HTTP/1 response write is
// bounded: a client that opens a stream and never lets its response
// through (a window it never updates, a socket it does not read) has it
// reset then, and the exchange (the upstream's response with it) ends,
// instead of being held for ever. x/net's deadline is a timer that
// fires whether a write waits or not: clearWrite takes it off while the
// stream waits for the upstream's next piece (a gRPC stream's next
// message may be minutes away). Each is a message to x/net's serve loop:
// one for a response of one piece, two more per further piece.
func (f *stream) extendWrite() {
	idle := f.srv.facts.BodyTimeout
	if idle <= 0 {
		return
	}
	now := time.Now()
	if now.Sub(f.wext) > idle/4 {
		if d, ok := f.w.(writeDeadliner); ok {
			_ = d.SetWriteDeadline(now.Add(idle))
		}
		f.wext = now
	}
}

// clearWrite takes the write deadline off (extendWrite).
func (f *stream) clearWrite() {
	if f.wext.IsZero() {
		return
	}
	if d, ok := f.w.(writeDeadliner); ok {
		_ = d.SetWriteDeadline(time.Time{})
	}
	f.wext = time.Time{}
}

var streams = sync.Pool{New: func() any {
	f := new(stream)
	f.ex.Init(f)
	f.onReset = func() { f.ex.Cancel(); f.fired.Done() }
	return f
}}

// commonKeys are the canonical forms of frequent response field names,
// in the spellings the upstreams send (looked up without allocating).
var commonKeys = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{"Accept-Ranges", "Age", "Allow", "Alt-Svc", "Cache-Control", "Content-Disposition",
		"Content-Encoding", "Content-Language", "Content-Location", "Content-Range", "Content-Security-Policy",
		"Content-Type", "Date", "Etag", "Expires", "Last-Modified", "Link", "Location", "Pragma", "Retry-After",
		"Server", "Set-Cookie", "Strict-Transport-Security", "Traceparent", "Tracestate", "Vary", "Via",
		"Www-Authenticate", "X-Content-Type-Options", "X-Frame-Options", "X-Request-Id", "X-Sidecar-Fail-Open",
		"X-Sidecar-Inspection", "Grpc-Status", "Grpc-Message", "Grpc-Encoding", "Grpc-Accept-Encoding"} {
		m[k] = k
		m[strings.ToLower(k)] = k
	}
	m["ETag"] = "Etag"
	m["WWW-Authenticate"] = "Www-Authenticate"
	return m
}()

// date is the Date field of the responses of one second.
type date struct {
	sec int64
	v   []string
}

var lastDate atomic.Pointer[date]

// dateField is the Date field for a response now: formatted once a
// second, as fasthttp does (x/net formats and allocates it for each
// response). x/net only reads it.
func dateField() []string {
	now := time.Now()
	if d := lastDate.Load(); d != nil && d.sec == now.Unix() {
		return d.v
	}
	d := &date{sec: now.Unix(), v: []string{now.UTC().Format(http.TimeFormat)}}
	lastDate.Store(d)
	return d.v
}

// commonTrailerKeys are the keys of frequent trailers in the response
// header (x/net's http.TrailerPrefix form), looked up without allocating.
var commonTrailerKeys = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{"Grpc-Status", "Grpc-Message", "Grpc-Status-Details-Bin", "Server-Timing"} {
		m[k] = http.TrailerPrefix + k
		m[strings.ToLower(k)] = http.TrailerPrefix + k
	}
	return m
}()

// Conn implements exchange.Front.
func (f *stream) Conn() *exchange.Conn { return f.info }

// Gone implements exchange.Front: the stream's context ends when the
// client resets it or the connection closes.
func (f *stream) Gone() bool { return f.r.Context().Err() != nil }

// TunnelRoom implements exchange.Front: HTTP/2 has no Upgrade (RFC 9113
// §8.6), and x/net refuses extended CONNECT.
func (f *stream) TunnelRoom() bool { return false }

// Tunnel implements exchange.Front.
func (f *stream) Tunnel(*exchange.Tunnel) error { return exchange.ErrNoTunnel }

// Body implements exchange.Front.
func (f *stream) Body() exchange.Source {
	f.body = reqBody{r: f.r.Body, w: f.w, idle: f.srv.facts.BodyTimeout, req: f.r, tr: f.body.tr[:0]}
	return &f.body
}

// reqBody is a stream's request body: net/http's reader, its read
// deadline through the ResponseWriter (per stream in x/net/http2). A
// stream's end reads as io.EOF, its reset as an error.
type reqBody struct {
	r        io.Reader
	w        http.ResponseWriter
	idle     time.Duration
	extended time.Time
	// req carries the stream's trailers once its body ended (x/net
	// keeps those the client announced); tr is them as fields.
	req *http.Request
	tr  []exchange.Field
}

// Trailers implements exchange.TrailerSource: the client's trailers, in
// the order of their names. The fields share the strings of x/net's
// map, read only.
func (b *reqBody) Trailers() []exchange.Field {
	if len(b.req.Trailer) == 0 {
		return nil
	}
	tr := b.tr[:0]
	for _, k := range slices.Sorted(maps.Keys(b.req.Trailer)) {
		for _, v := range b.req.Trailer[k] {
			tr = append(tr, exchange.Field{Name: s2b(k), Value: s2b(v)})
		}
	}
	b.tr = tr
	return tr
}

// s2b is the bytes of s, shared: they must never be written to.
func s2b(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

type readDeadliner interface{ SetReadDeadline(time.Time) error }

func (b *reqBody) Read(p []byte) (int, error) { return b.r.Read(p) }

// Pending implements exchange.Source: net/http's reader shows no buffer.
func (b *reqBody) Pending() bool { return false }

// Buffered implements exchange.Source.
func (b *reqBody) Buffered(int64) bool { return b.idle <= 0 }

// ExtendRead moves the stream's read deadline to body_timeout from now,
// at most every quarter of it.
func (b *reqBody) ExtendRead() {
	now := time.Now()
	if now.Sub(b.extended) > b.idle/4 {
		if d, ok := b.w.(readDeadliner); ok {
			_ = d.SetReadDeadline(now.Add(b.idle))
		}
		b.extended = now
	}
}

// SetReadDeadline implements exchange.Source.
func (b *reqBody) SetReadDeadline(t time.Time) {
	b.extended = time.Time{}
	if d, ok := b.w.(readDeadliner); ok {
		_ = d.SetReadDeadline(t)
	}
}

// Truncated implements exchange.Source: a stream cut off is reset, an
// error of its own.
func (b *reqBody) Truncated() bool { return false }

var hdrHost = []byte("Host")

// fieldSize is a field's size in a header list (RFC 9113 §6.5.2).
func fieldSize(name, value string) int { return len(name) + len(value) + 32 }

// serveStream is the handler of every stream: the head from net/http's
// request, the exchange, the response it staged written out.
func (s *Server) serveStream(w http.ResponseWriter, r *http.Request, info *exchange.Conn) {
	s.stats.streams.Add(1)
	if info.TLS != nil {
		s.stats.h2.Add(1)
	} else {
		s.stats.h2c.Add(1)
	}
	s.stats.streamsOpen.Add(1)
	defer s.stats.streamsOpen.Add(-1)
	if headerListSize(r) > int(s.cfg.MaxHeaderListSize) {
		// As the HTTP/1 front end answers a head over its buffer: no
		// exchange, counted under the same reason.
		s.stats.headerTooLarge.Add(1)
		s.core.Reject(observe.RejectHeaderTooLarge)
		w.Header()["Content-Type"] = []string{"text/plain; charset=utf-8"}
		w.WriteHeader(http.StatusRequestHeaderFieldsTooLarge)
		_, _ = io.WriteString(w, "request header fields too large")
		return
	}
	f := streams.Get().(*stream)
	f.srv, f.w, f.r, f.info = s, w, r, info
	ex := &f.ex
	s.core.Begin(ex, time.Now())
	finished := false
	defer func() {
		if !finished {
			s.recoverPanic(f)
		}
	}()
	f.readHead()
	// A reset stream cancels its exchange at once, wherever it waits
	// (an agent, the upstream): a rapid reset flood (CVE-2023-44487)
	// costs no agent call or upstream request for the streams reset
	// before they got there. The WaitGroup keeps a late cancel from
	// reaching the exchange once it is pooled again.
	f.fired.Add(1)
	stop := context.AfterFunc(r.Context(), f.onReset)
	if r.Context().Err() != nil {
		ex.ClientGone()
	} else {
		ex.Serve()
	}
	f.respond()
	aborted := ex.Aborted()
	// Closed before Finish: a duplex request body still being sent
	// upstream (a gRPC stream the upstream ended first) is read from
	// r.Body, and Finish waits for its sender.
	_ = r.Body.Close()
	if stop() {
		f.fired.Done()
	}
	f.fired.Wait()
	ex.Finish()
	finished = true
	f.release()
	if aborted {
		// The response was cut off after its head: the stream is reset,
		// not ended, so that the client cannot take it for complete.
		panic(http.ErrAbortHandler)
	}
}

// recoverPanic keeps one broken request from taking the process down:
// the request is abandoned (not pooled) and its stream reset.
func (s *Server) recoverPanic(f *stream) {
	p := recover()
	if p == nil {
		return
	}
	s.log.Error().Uint64("req", f.ex.ID()).Bytes("corr", f.ex.Correlation()).Interface("panic", p).Msg("request handler panicked")
	f.ex.Abandon()
	panic(http.ErrAbortHandler)
}

// headerListSize is the size of r's header list as RFC 9113 §6.5.2
// counts it (names, values and 32 bytes per field), pseudo-fields
// included.
func headerListSize(r *http.Request) int {
	size := fieldSize(":method", r.Method) + fieldSize(":path", r.RequestURI) +
		fieldSize(":authority", r.Host) + fieldSize(":scheme", "https")
	for k, vs := range r.Header {
		for _, v := range vs {
			size += fieldSize(k, v)
		}
	}
	return size
}

// release returns f to the pool.
func (f *stream) release() {
	f.srv, f.w, f.r, f.info = nil, nil, nil, nil
	clear(f.body.tr)
	f.body = reqBody{tr: f.body.tr[:0]}
	f.uri.Reset()
	f.arena = trim(f.arena, 64<<10)
	f.scratch = trim(f.scratch, 16<<10)
	clear(f.keys)
	f.keys = f.keys[:0]
	clear(f.vals)
	f.vals = f.vals[:0]
	streams.Put(f)
}

func trim(b []byte, max int) []byte {
	if cap(b) > max {
		return nil
	}
	return b[:0]
}

// readHead fills the exchange's head from the request.
func (f *stream) readHead() {
	r := f.r
	total := len(r.Method) + len(r.RequestURI) + len(r.Host) + len(r.Proto)
	keys := f.keys[:0]
	for k, vs := range r.Header {
		keys = append(keys, k)
		for _, v := range vs {
			total += len(k) + len(v)
		}
	}
	// The order of the fields is lost in net/http's map: sorted, agents
	// see the same order for the same request.
	slices.Sort(keys)
	f.keys = keys
	h := f.ex.Head()
	// One arena for the head's bytes, grown once: the slices into it stay
	// valid.
	if cap(f.arena) < total {
		f.arena = make([]byte, 0, total)
	}
	a := f.arena[:0]
	put := func(v string) []byte {
		n := len(a)
		a = append(a, v...)
		return a[n:len(a):len(a)]
	}
	h.Method = put(r.Method)
	h.Target = put(r.RequestURI)
	h.Host = put(r.Host)
	h.Proto = put(r.Proto)
	h.HTTP11 = true
	f.uri.DisablePathNormalizing = false
	f.uri.SetPathBytes(h.Target[:pathEnd(h.Target)])
	h.Path = f.uri.Path()
	h.ContentLength = r.ContentLength
	if r.ContentLength < 0 {
		h.ContentLength = -1
	}
	h.ContentLengthValue = nil
	fields := h.Fields[:0]
	if len(h.Host) > 0 {
		// :authority, as the Host an HTTP/1 request carries (RFC 9113
		// §8.3.1): agents see it where they see an HTTP/1 request's.
		fields = append(fields, exchange.Field{Name: hdrHost, Value: h.Host})
	}
	for _, k := range keys {
		name := put(k)
		for _, v := range r.Header[k] {
			val := put(v)
			if h.ContentLengthValue == nil && k == "Content-Length" {
				h.ContentLengthValue = val
			}
			fields = append(fields, exchange.Field{Name: name, Value: val})
		}
	}
	h.Fields = fields
	h.Trailer = nil
	if len(r.Trailer) > 0 {
		// The names the client announced (x/net took the field out of
		// the header): as an HTTP/1 request's Trailer field.
		n := len(a)
		for k := range r.Trailer {
			if len(a) > n {
				a = append(a, ',')
			}
			a = append(a, k...)
		}
		h.Trailer = a[n:len(a):len(a)]
	}
	f.arena = a
}

// pathEnd is where the path of an origin-form target ends (its query).
func pathEnd(t []byte) int {
	for i, c := range t {
		if c == '?' || c == '#' {
			return i
		}
	}
	return len(t)
}

// Connection-specific fields are not HTTP/2's (RFC 9113 §8.2.2); the
// exchange leaves out the hop-by-hop ones, and Content-Length is the
// body's framing, the server's business.
func skipResponseField(name []byte) bool {
	switch len(name) {
	case 7:
		return strings.EqualFold(string(name), "upgrade")
	case 10:
		return strings.EqualFold(string(name), "connection") || strings.EqualFold(string(name), "keep-alive")
	case 14:
		return strings.EqualFold(string(name), "content-length")
	case 16:
		return strings.EqualFold(string(name), "proxy-connection")
	case 17:
		return strings.EqualFold(string(name), "transfer-encoding")
	}
	return false
}

// value is the string of the value of the response's i-th field sent, the one
// the stream's last response had there when they are the same.
func (f *stream) value(i int, b []byte) string {
	if i < len(f.seen) && f.seen[i] == string(b) {
		return f.seen[i]
	}
	v := string(b)
	if len(v) > maxSeenLen {
		return v
	}
	switch {
	case i < len(f.seen):
		f.seen[i] = v
	case i == len(f.seen) && i < maxSeen:
		f.seen = append(f.seen, v)
	}
	return v
}

// maxSeen and maxSeenLen bound the field values a pooled stream
// remembers: how many, how long each.
const (
	maxSeen    = 32
	maxSeenLen = 256
)

// contentLength is the Content-Length field of a body of n bytes: the
// stream's last one when n is the same (x/net reads it, and copies the
// header before the next response of the stream changes it).
func (f *stream) contentLength(n int64) []string {
	if f.clen == nil {
		f.clen = make([]string, 1)
	}
	if f.clenN != n || f.clen[0] == "" {
		f.clen[0], f.clenN = strconv.FormatInt(n, 10), n
	}
	return f.clen[:1:1]
}

// addField adds the value v of the field k to h: to the values h has
// for k already, or as a single value in vals (the backing array the
// single values share), which it returns.
func addField(h http.Header, vals []string, k, v string) []string {
	if old, dup := h[k]; dup {
		h[k] = append(old, v)
		return vals
	}
	vals = append(vals, v)
	h[k] = vals[len(vals)-1 : len(vals) : len(vals)]
	return vals
}

// respond writes the response the exchange staged: the head, the body
// (a streamed one flushed as each piece comes, so a gRPC stream's
// messages are not held back), the upstream's trailers.
func (f *stream) respond() {
	ex := &f.ex
	res := ex.Response()
	if res.Kind == exchange.ResponseNone {
		return
	}
	if ex.Answered() && isGRPC(f.r.Header.Get("Content-Type")) {
		f.writeGRPCAnswer(res.Status, res.Body)
		if res.Kind == exchange.ResponseStream {
			ex.StreamDone(0, nil)
		}
		return
	}
	h := f.w.Header()
	vals := f.vals[:0]
	i := 0
	for _, fl := range res.Fields {
		if skipResponseField(fl.Name) {
			continue
		}
		// Canonical keys: net/http looks fields up by them (a
		// "content-type" it did not find would get a sniffed second one).
		k, ok := commonKeys[string(fl.Name)]
		if !ok {
			k = http.CanonicalHeaderKey(string(fl.Name))
		}
		// The values of single fields share one backing array, reused by
		// the stream's next request: x/net copies the header when it
		// writes it, and reads the map no more once the handler returned.
		vals = addField(h, vals, k, f.value(i, fl.Value))
		i++
	}
	f.vals = vals
	if _, ok := h["Date"]; !ok {
		// x/net would format it for every response.
		h["Date"] = dateField()
	}
	if _, ok := h["Content-Type"]; !ok {
		// No type sniffed from the body: the response goes as it came,
		// as over HTTP/1.
		h["Content-Type"] = nil
	}
	f.wext = time.Time{}
	switch res.Kind {
	case exchange.ResponseFull:
		if res.Status >= 200 && res.Status != 204 && res.Status != 304 {
			h["Content-Length"] = f.contentLength(int64(len(res.Body)))
		}
		f.w.WriteHeader(res.Status)
		// In pieces, each under its own deadline: a large body the agents
		// buffered goes to a slow client that reads, as over HTTP/1.
		for b := res.Body; len(b) > 0; {
			n := min(len(b), fullPiece)
			f.extendWrite()
			if _, err := f.w.Write(b[:n]); err != nil {
				break
			}
			b = b[n:]
		}
	case exchange.ResponseStream:
		if res.Size >= 0 {
			h["Content-Length"] = f.contentLength(res.Size)
		}
		f.w.WriteHeader(res.Status)
		fl, _ := f.w.(http.Flusher)
		var written int64
		var err error
		for {
			data, last, nerr := ex.NextBody()
			if nerr != nil {
				err = nerr
				break
			}
			if len(data) > 0 {
				f.extendWrite()
				n, werr := f.w.Write(data)
				written += int64(n)
				if werr != nil {
					err = werr
					break
				}
				if fl != nil && !last {
					fl.Flush()
				}
				if !last {
					f.clearWrite()
				}
			}
			if last {
				break
			}
		}
		if err == nil {
			// The stream's strings of last time, single values in one
			// array; not the head's (f.vals): x/net reads the trailers
			// once the handler returned, after the stream's release.
			trs := ex.Trailers()
			var vals []string
			if len(trs) > 0 {
				vals = make([]string, 0, len(trs))
			}
			for _, t := range trs {
				k, ok := commonTrailerKeys[string(t.Name)]
				if !ok {
					k = http.TrailerPrefix + string(t.Name)
				}
				vals = addField(h, vals, k, f.value(i, t.Value))
				i++
			}
		}
		ex.StreamDone(written, err)
	}
}
