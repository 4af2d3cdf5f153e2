package exchange

import (
	"errors"
	"io"
	"net"
	"time"
)

// The exchange's two seams. A front end (dataplane/internal/http1 for
// HTTP/1.1 over fasthttp) receives a request, fills its Head, gives the
// exchange a Front and writes out the Response the exchange staged; an
// upstream (dataplane/internal/upstream: HTTP/1.1 over pooled
// connections) implements Upstream. Nothing here names an HTTP engine:
// heads are field lists and bodies are Sources and producers, so that a
// second front end (HTTP/2: one handler call per stream, a
// ResponseWriter with Flush and trailers, the request's context for
// disconnects, no hijack) or a second upstream (an HTTP/2 Transport's
// RoundTrip) plugs in without the core changing.

// Field is one header field: name and value as the front end or the
// upstream received them, or as the exchange set them. The bytes belong
// to whoever filled the list and stay valid for the request.
type Field struct {
	Name, Value []byte
}

// Head is the request head as the front end received it and normalised
// what its engine's parse depends on (for HTTP/1: an absolute-form
// target rewritten to origin-form, its authority as Host). The front end
// fills it after Core.Begin; every slice stays valid until Finish.
type Head struct {
	// Method is the request method.
	Method []byte
	// Target is the request target as forwarded: origin-form, or "*".
	Target []byte
	// RawTarget is the target as the client sent it when that was not
	// origin-form (nil otherwise): what agents with the client's view see.
	RawTarget []byte
	// Path is the decoded, normalised path of Target: routing and logs.
	Path []byte
	// Proto is the protocol as the client named it ("HTTP/1.1").
	Proto []byte
	// Host is the Host (or :authority) as received, or the authority of
	// an absolute-form target; the exchange canonicalises it.
	Host []byte
	// Fields are every header field in the order received, Host and
	// framing fields included.
	Fields []Field
	// ContentLength is the body's length: 0 none, -1 unknown (chunked).
	ContentLength int64
	// ContentLengthValue is the Content-Length field as the engine read
	// it (nil without one).
	ContentLengthValue []byte
	// HTTP11 reports a client of HTTP/1.1 or later.
	HTTP11 bool
	// Trailer is the client's Trailer field, the names of the trailer
	// fields it announced (nil: none).
	Trailer []byte
}

// Listener is what the exchange knows of the listener a request came
// in on; the front end keeps one per listener, unchanged while it runs.
type Listener struct {
	// Name is the listener's name (metadata listener_id).
	Name []byte
	// TLS says the listener serves HTTPS (X-Forwarded-Proto).
	TLS bool
	// TrustForwarded keeps the client's X-Forwarded-* and Forwarded.
	TrustForwarded bool
	// MaxRequestBody refuses larger request bodies with 413 (0: none).
	MaxRequestBody int64
	// BodyTimeout bounds each wait on a request body, and caps the
	// credit of MinBodyRate.
	BodyTimeout time.Duration
	// MinBodyRate is the slowest a request body may arrive, in bytes per
	// second (0: any).
	MinBodyRate int64
	// Duplex says the front end relays a request body and its response
	// body at once (an HTTP/2 stream): a request whose body no agent
	// inspects may then go on reading the response while the upstream is
	// still sending the body (UpstreamRequest.Duplex). An HTTP/1 front end
	// reads the whole request before the next one, and leaves it unset.
	Duplex bool
}

// TLSFacts are a client connection's TLS facts, formatted once after its
// handshake.
type TLSFacts struct {
	Version, Cipher, ServerName, ClientSubject, ClientSAN []byte
}

// Conn is what the exchange knows of the client connection: the same
// for every request on it.
type Conn struct {
	// ClientIP is the text of the client's IP (nil when not TCP).
	ClientIP   []byte
	ClientPort int
	// ServerIP is the text of the connection's local IP (nil when not TCP).
	ServerIP   []byte
	ServerPort int
	// TLS is nil on a plain connection.
	TLS *TLSFacts
	// Listener is the listener the connection came in on.
	Listener *Listener
}

// Front is the client side of one exchange, implemented by a front end.
type Front interface {
	// Conn returns the client connection's facts.
	Conn() *Conn
	// Body returns the request body (called only when the head announced
	// one, at most once per request).
	Body() Source
	// Gone reports whether the client went away. The disconnect watcher
	// calls it from its own goroutine; it must not block.
	Gone() bool
	// TunnelRoom reports whether a tunnel could start now; an upgrade
	// request is answered 503 otherwise. A front end without tunnels
	// never sees an upgrade request (HTTP/2 has no Upgrade).
	TunnelRoom() bool
	// Tunnel hands the client connection over to t after the upstream's
	// 101. ErrNoTunnel: no room (503).
	Tunnel(t *Tunnel) error
}

// ErrNoTunnel is a Tunnel the front end cannot start.
var ErrNoTunnel = errors.New("no room for another tunnel")

// Tunnel is an upgraded upstream connection for Front.Tunnel.
type Tunnel struct {
	// Conn is the upstream connection; Pre the bytes it sent after its
	// 101 that were already read.
	Conn net.Conn
	Pre  []byte
	// Release gives the upstream connection back (closed) when the
	// tunnel ends.
	Release func()
	// Fields are the 101's headers for the client (the upstream's,
	// hop-by-hop ones removed), Upgrade the protocol it switches to.
	Fields  []Field
	Upgrade []byte
}

// Source is one body as an engine delivers it: a client's request body
// (front end) or an upstream's response body (upstream). The exchange
// reads it, coalesces what already arrived into chunks, and keeps the
// read deadlines moving while it reads.
type Source interface {
	// Read reads what the next piece of the body's framing holds into p;
	// io.EOF ends the body.
	Read(p []byte) (int, error)
	// Pending reports whether more of the body was already received
	// (buffered, or waiting in the socket): a Read would not wait.
	Pending() bool
	// Buffered reports whether the next read needs no deadline: the
	// source keeps none, or rest (the body still to come, -1 unknown)
	// is already buffered.
	Buffered(rest int64) bool
	// ExtendRead pushes the read deadline to the source's idle timeout
	// from now (a source may skip a move that changes little).
	ExtendRead()
	// SetReadDeadline sets an exact read deadline (the minimum rate's);
	// the next ExtendRead moves it again.
	SetReadDeadline(t time.Time)
	// Truncated reports whether the connection under the body ended: a
	// body that needed more is cut off. A body delimited by the close of
	// its connection is never truncated.
	Truncated() bool
}

// Upstream is where a route's requests go, implemented by the upstream
// side.
type Upstream interface {
	// Name is the upstream's name; NameBytes the same as bytes.
	Name() string
	NameBytes() []byte
	// HostHeader is the Host a request gets with host_header: upstream.
	HostHeader() []byte
	// RoundTrip sends req and reads the response head. An error the
	// body producer returned ends the call as it is; otherwise the
	// upstream retries where that is safe (a stale pooled connection,
	// another endpoint) and returns its last failure, ErrUpstreamBusy
	// when no connection was free, or a net.Error with Timeout().
	RoundTrip(req *UpstreamRequest) (UpstreamResponse, error)
	// LogAllow rate-limits the log lines of the upstream's failures:
	// whether one may be written now, and how many were held back.
	LogAllow() (bool, uint64)
}

// ErrUpstreamBusy is an upstream with no connection free within its
// wait (503).
var ErrUpstreamBusy = errors.New("upstream busy")

// UpstreamRequest is what the exchange asks the upstream to send; it and
// what it points to are valid during RoundTrip.
type UpstreamRequest struct {
	Method, Target []byte
	// Host is the Host the upstream gets.
	Host []byte
	// Fields are the other header fields, in order.
	Fields []Field
	// ContentLength, without a Body, is the client's Content-Length to
	// forward as it was (nil: none).
	ContentLength []byte
	// Body produces the request body (nil: none); BodyLen is its length,
	// -1 when it may change on the way (framed chunked in HTTP/1).
	Body    BodyProducer
	BodyLen int64
	// Idempotent: the method may be sent twice. Head: the response has
	// no body (HEAD).
	Idempotent, Head bool
	// Trailer is the trailer field names the client declared (its
	// Trailer field, comma-separated; nil: none): an upstream that must
	// announce its trailers announces these. The fields come with the
	// body's end (Body.Trailers).
	Trailer []byte
	// Duplex: Body may be produced while the response is read, from
	// another goroutine (no agent or shadow sees the request body, and
	// the front end relays both at once: Listener.Duplex), until the
	// response's Release. Without it RoundTrip returns only once Body was
	// produced to its end (or abandoned). An upstream that reads the
	// response only after the whole request (HTTP/1) ignores it; a
	// bidirectional stream (gRPC) needs it.
	Duplex bool
	// Guard ties the connection in use to the request's cancel.
	Guard Guard
	// ResponseTimeout bounds the wait for the response head once the
	// request is sent (0: the upstream's response_timeout); a route's
	// upstream_timeout, per_try_timeout or timeout sets it.
	ResponseTimeout time.Duration
}

// BodyProducer produces a request body as the upstream writes it: the
// client's bytes after the agents.
type BodyProducer interface {
	// Next returns the next piece of the body and whether it is the last.
	// Its data is valid until the next call. An error ends the call.
	Next() (data []byte, last bool, err error)
	// Consumed reports whether some of the client's body was taken: the
	// request cannot be sent again.
	Consumed() bool
	// Trailers returns the client's trailer fields that may go on, once
	// Next returned the last piece (nil: none). framed says the upstream
	// can send them (an HTTP/2 stream, a chunked HTTP/1 body); without,
	// they are counted as dropped and none are returned.
	Trailers(framed bool) []Field
}

// Guard ties what the upstream is doing for the request to it, so that a
// client that goes away aborts it: an HTTP/1 connection, closed; an
// HTTP/2 stream would register the cancel of its context.
type Guard interface {
	// Attach registers c, closed if the request is canceled; false: it
	// was canceled already (c is not registered).
	Attach(c io.Closer) bool
	// Detach unregisters the connection; aborted reports that cancel
	// closed it meanwhile.
	Detach() (aborted bool)
	// Canceled reports whether the request was canceled.
	Canceled() bool
}

// ResponseHead is an upstream response's head.
type ResponseHead struct {
	Status int
	// Reason is the status line's reason phrase.
	Reason []byte
	// Fields are the header fields as received.
	Fields []Field
	// ContentLength is the body's length: -1 chunked, -2 until close.
	ContentLength int64
	// HasBody reports a body to relay (not for HEAD, 204, 304, length 0).
	HasBody bool
}

// TrailerSource is an UpstreamResponse, or a request body Source, whose
// body may end with trailer fields (HTTP/2: gRPC's status travels there;
// chunked HTTP/1).
type TrailerSource interface {
	// Trailers are the fields received after the body: valid once the
	// body ended, until Release (the request's: until Finish).
	Trailers() []Field
}

// UpstreamResponse is one upstream response, valid until Release.
type UpstreamResponse interface {
	// Head is the response head.
	Head() *ResponseHead
	// Body is the response body (nil without one).
	Body() Source
	// Endpoint is the address of the endpoint that answered.
	Endpoint() string
	// Release ends the response: the connection goes back to its pool
	// when reuse is set and the upstream can still use it, and is closed
	// otherwise.
	Release(reuse bool)
	// Detach takes the connection out of the response for a tunnel;
	// ok is false when the request was canceled (the connection is then
	// released). Release after Detach only releases the response.
	Detach() (t Tunnel, ok bool)
}
