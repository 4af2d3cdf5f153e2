// Package dataplane is the sidecar's HTTP reverse proxy: listeners in
// front of one or more services that show every request and response to
// the agents configured for its route, in order, and do what they decide
// (agent protocol v2, docs/protocol.md sections 7 and 8).
//
// # API
//
// The stable API is what a process embedding the proxy needs: Server
// (New from a Config, Serve or ListenAndServe, Swap to reload routes and
// agents without dropping a request, Shutdown to drain), its snapshots
// for status pages and metrics (Stats, PolicyStatus, Upstreams,
// AgentStatus, TracingStats and their types), the Observer and
// RequestRecorder interfaces with the event vocabulary they take
// (Outcome, RequestOutcome, RequestSummary, the phase indices), and the
// errors and marker headers. The vocabulary and the snapshot types are
// defined in internal/observe, so that the metrics and the access log
// need not link the proxy, and re-exported here. Everything else is in
// dataplane/internal and may change at any time.
//
// # Layout
//
// A request goes listeners → front end → exchange → upstream, each in a
// package of its own under dataplane/internal:
//
//   - http1: the HTTP/1.1 front end over fasthttp (connections, TLS
//     listeners, parse errors, the head normalisation its parse needs,
//     writing the response, Upgrade tunnels);
//   - exchange: the engine-independent core, one Exchange per request
//     (the agent chain and its decisions, header operations and their
//     rules, body policy, decision cache, shadow agents, circuit
//     breakers, failover, trace context, the request's summary), with
//     the two seams a front end and an upstream implement;
//   - upstream: the upstream side (endpoints, pools, balancing, health
//     checks, DNS re-resolution, TLS to the upstream, retries, the
//     HTTP/1.1 request writer and response reader).
//
// This package wires them: a Server owns the exchange core, one http1
// Listener per configured listener and the upstreams of the current
// routing table, and keeps the listeners within the process's file
// descriptor budget (fdlimit.go).
//
// # Per request
//
// Each agent of the route that handles request headers gets
// RequestHeaders (lower-case names; metadata: correlation id, client
// address, protocol, server name, route, upstream, traceparent,
// timestamp) and answers with a Decision. The first non-allow decision
// wins and stops the chain: a block or redirect is answered without
// contacting the upstream, the agents before it that still expected
// events get CancelRequest ("decided"), the agents after it hear nothing.
// Header operations of the allowing agents accumulate in chain order, and
// each agent sees the request as the agents before it left it. The
// response goes through the same chain (ResponseHeaders; a block there
// replaces the upstream's response).
//
// Every header operation passes the security rules or is refused, logged
// and counted, never applied: the name must be an HTTP token, the value
// an RFC 9110 field-value (no control byte but HTAB, no SP or HTAB at
// either end), and hop-by-hop headers, Host, Content-Length,
// Transfer-Encoding and the sidecar's own X-Sidecar-* markers are off
// limits. Block headers go through the same rules. A block status must be
// 200–599 (a 1xx cannot end an exchange) and a redirect 301, 302, 303, 307
// or 308 to an absolute http(s) URL or a /path; anything else is an agent
// error for the failure policy.
//
// # Bodies
//
// Per route and agent, a body phase is off, buffered or streamed (auto:
// streamed when the agent declares supports_streaming). Buffered bodies
// are read up to the agent's limit before the upstream is contacted (a
// request body every agent buffers, before any agent is asked, so that a
// slow upload holds none of an agent's in-flight slots); past
// the limit the message is refused (413 for a request, 502 for a
// response) or passes uninspected with X-Sidecar-Inspection: skipped and a
// counter. Streamed bodies go chunk by chunk through the agents, each chunk
// forwarded (unchanged, replaced or dropped) as soon as the agents
// answered for it, so memory stays at one chunk per request however large
// the body; a final allow ends an agent's say over the rest of the body.
// A chunk takes every byte already received, up to its size, so chunks
// follow bytes rather than the sender's framing. A request
// body slower than its listener's body_min_rate is answered 408.
// A body an agent may rewrite is sent chunked (or, buffered, with its new
// Content-Length). A header decision does not end an agent's say over the
// body: an agent that handles a body phase gets its chunks.
//
// # Failures
//
// An agent that times out (per message, or its per-request budget), is
// down, overloaded or breaks the protocol is handled by its failure mode:
// closed answers 504 for a timeout and 503 otherwise; open lets the
// request pass with X-Sidecar-Fail-Open: <agent> on the upstream request
// and the response, and a counter. Error bodies are generic; details go to
// the log with the request and correlation ids. The upstream's failures
// answer 502, its timeouts 504. A client that goes away mid-request is
// noticed (a peek at idle sockets, or the failed read or write) and its
// agents get CancelRequest ("client_disconnect") while its upstream
// connection is closed.
//
// # Upstreams and tracing
//
// An upstream is one or more endpoints, balanced round robin or by least
// requests in flight, taken out by an active health check or ejected
// after consecutive failures, and optionally re-resolved from DNS. A
// request whose endpoint refuses or breaks the connection before the
// upstream could act on it moves to another.
// The W3C trace context is checked strictly, made when asked, and spans
// may be exported over OTLP.
//
// # TLS and Upgrade
//
// A listener with tls serves HTTPS: certificates chosen by SNI,
// optional client certificates, rotation without a restart, and the
// connection's TLS facts in every RequestHeaders' metadata. An upstream
// with tls is dialed over TLS. A WebSocket or other Upgrade request
// passes the agents, and on the upstream's 101 its bytes are tunnelled
// both ways, uninspected.
//
// # Cost
//
// The hot path allocates nothing in the common case: per-request state is
// pooled (its context, deadline timer and buffers included), header bytes
// go from fasthttp to the agent encoder without string conversion, and no
// goroutine is started per request. Client and upstream sockets are read
// and written with raw system calls (internal/rawio), which keeps the
// runtime from handing the P to another thread when an agent sharing the
// core preempts a write, and a bodiless idempotent upstream request goes
// out with the read of its answer, one read(2) fewer.
package dataplane
