// Package http2 is the dataplane's HTTP/2 front end, over
// golang.org/x/net/http2: a Server serves the HTTP/2 connections of one
// listener (h2 chosen by ALPN on a TLS listener, h2c with prior
// knowledge on a cleartext one; the HTTP/1 front end's listener tells
// them apart and hands them over) and turns each stream into an
// exchange (dataplane/internal/exchange), implementing its Front. It is
// a second front end of the same core, not a second proxy: routing, the
// agents, the upstreams and the limits on bodies are the exchange's.
//
// What it owns is what depends on HTTP/2: the server's limits (streams
// per connection, header list size, frame size, idle connections) and
// its counters, the request head built from net/http's request (the path
// normalised as the HTTP/1 front end's is), the response written through
// a ResponseWriter (a streamed body flushed piece by piece, the
// upstream's trailers relayed), the gRPC form of the sidecar's own
// answers (grpc.go), and the graceful end of connections (GOAWAY) on
// shutdown. And how x/net reads and writes a connection (package h2conn,
// which HTTP/2 upstreams use too): reads through a buffer, writes held
// until the goroutines already runnable have run, so that the frames of
// many streams go out in one write(2).
package http2
