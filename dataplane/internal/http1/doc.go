// Package http1 is the dataplane's HTTP/1.1 front end, over fasthttp: a
// Listener serves one configured listener and turns each request into an
// exchange (dataplane/internal/exchange), implementing its Front.
//
// What it owns is what depends on HTTP/1 and on fasthttp: the listener
// wrapper (eofListener, eofConn: the connection limit, accept backoff,
// idle close, lingering close, raw socket I/O and the yield before the
// read that follows a response, the disconnect peek), TLS on listeners
// (certificates by SNI, client certificates, rotation), the answers to
// heads fasthttp cannot parse (400, 408, 414, 431), the normalisation
// that depends on its parse (absolute-form targets, folded lines), the
// request body as a Source (coalesce.go finds the buffer under
// fasthttp's body stream), writing the staged response (a streamed body
// pulled as fasthttp writes it; close-delimited for an HTTP/1.0 client)
// and Upgrade tunnels after a 101. On a listener that serves HTTP/2 too,
// it sorts the connections by protocol before fasthttp sees them (ALPN,
// or the HTTP/2 preface: sniff.go) and hands the HTTP/2 ones to
// dataplane/internal/http2.
//
// A request's state (request: the Exchange, fasthttp's context, the body
// reader and the response stream) is pooled; it lives until the
// response is written, a streamed body included.
package http1
