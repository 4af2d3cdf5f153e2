// Package exchange is the dataplane's engine-independent core: one
// Exchange per request, from its head to its response, whatever HTTP
// engine received it and whatever protocol reaches the upstream. It
// imports neither fasthttp nor net/http.
//
// An exchange runs the request's route's agent chain and applies their
// decisions (agents.go: header events, decide, block, redirect, the
// failure policy), their header operations under the security rules and
// limits (headers.go, hdrops.go), the body policy (body.go: one plan per
// request body, buffered, streamed or inline bodies, prefix and stream
// over a limit, chunks that follow bytes, the minimum rate), the decision
// cache, shadow agents, circuit breakers and failover, the W3C trace
// context and span export, and the request's summary for the observers.
//
// # Seams
//
// A front end (dataplane/internal/http1 for HTTP/1.1) implements Front
// and drives an Exchange it embeds in its per-request state:
//
//	ex.Init(front)            // once, when the state is made
//	core.Begin(ex, start)     // per request
//	fill *ex.Head()           // the head as received
//	ex.Serve()                // or ex.Refuse(reason, outcome)
//	write ex.Response()       // Full, or Stream: pull ex.NextBody() until last, then ex.StreamDone
//	ex.Finish()               // the Exchange may be reused
//
// Front gives the exchange the connection's facts, the request body as
// a Source, a disconnect check and, where the protocol has them, Upgrade
// tunnels. The response is staged as data (status, header fields, body)
// and written once by the front end, which answers in its own protocol.
//
// An upstream (dataplane/internal/upstream for HTTP/1.1) implements
// Upstream: RoundTrip sends an UpstreamRequest (a head and a
// BodyProducer the exchange feeds through the agents) and returns an
// UpstreamResponse (a head, its body as a Source, Release), retrying
// where that is safe. A Guard ties the connection in use to the request
// so that a client that goes away aborts it.
//
// # Cost
//
// The hot path allocates nothing in the common case: an Exchange is
// pooled with its front end's state, its sub-states keep their buffers
// across requests (each reset whole: a zero value with its buffers,
// trimmed), header bytes go from the front end's parse to the agent
// encoder without conversion, and no goroutine is started per request.
package exchange
