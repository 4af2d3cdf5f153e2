// Package reverse accepts agent-initiated connections: agents behind a NAT
// or scaled dynamically dial the proxy, register, and then carry the normal
// agent protocol v2, proxy → agent, exactly like a UDS agent connection.
//
// The first frame on a connection must be a RegistrationRequest (0x03, or
// the same JSON in a 0x01 frame, answered in 0x02), complete within the
// registration timeout and at most MaxRegistrationSize bytes. The listener
// then checks, in this order:
//
//  1. protocol_version is 2 and agent_id is a non-empty printable id of at
//     most 256 bytes ("unsupported protocol version", "invalid registration");
//  2. agent_id matches an ID pattern of a configured agent: the first agent
//     in configuration order whose pattern matches gets the connection;
//  3. auth_token is one of that agent's tokens, compared in constant time;
//  4. the limits: connections per agent_id and per agent ("too many
//     connections for agent id", "too many connections for agent").
//
// A refusal is answered with {"accepted":false,"error":reason} and the
// connection is closed; the reason never says more than the list above.
// Failing check 2 or 3 is answered "authentication failed" alike, byte for
// byte, so that refusals do not reveal which agent ids exist; the counters
// and the log tell them apart. Such a failure is an authentication
// failure of its (peer, agent_id), the peer being the IP address (the /64
// for IPv6) or the user id on a Unix socket: each doubles the delay before
// that key's next refusal is answered. A registration with a valid token
// is never delayed (see failures).
//
// Connections that have not registered share MaxPending slots, at most
// MaxPendingPerPeer per peer. A newcomer at a limit is let in and the
// connection of its scope that has sent nothing for the longest gives way
// (see admission); a refused connection gives its slot back before its
// answer is held back or drained, and at most MaxRefusing are held open.
// Neither silent connections nor wrong tokens, from however many
// addresses including the agent's own, can keep a valid registration out.
//
// Duplicate agent ids: an id may hold up to MaxConnsPerID connections at
// once (an instance may open several for throughput); a registration beyond
// that is refused, and the connections already serving are kept. Refusing
// the newcomer rather than replacing the oldest means that a second,
// misconfigured instance with the same id cannot knock a healthy one off,
// and that two instances cannot flap each other forever. The price is that
// an instance that restarts while the proxy still holds its dead
// connections waits until Ping liveness (PingTimeout) frees them; its SDK
// keeps retrying with backoff meanwhile.
//
// Every configured agent name has one agentmux.Pool, which exists before
// any agent registers: Begin fails with agentmux.ErrAgentUnavailable while
// it is empty, so routes follow their failure policy. New requests go to
// the connection with the fewest in flight. A connection that dies fails
// its in-flight requests with agentmux.ErrAgentConnLost and leaves the
// pool. Close drains: CancelAll to every connection, then close.
//
// # API
//
// The stable surface is the listener and what configures and observes it:
// Config (with AgentConfig, TLSConfig, DefaultConfig and Validate),
// NewListener, the Listener's Serve, Close, Agents, Stats, TCPAddr and
// UnixPath, Stats itself, the refusal reasons (Reason…, the text agents
// are sent) and the errors. They change only with the registration rules
// of docs/protocol.md. Listener.Agent hands out an agent's pool as the
// proxy's agentmux.Agent: that interface is the sidecar's own and may
// change with it. Everything else — admission, tokens and the failure
// table, peers — is unexported.
//
// What a configuration file says about reverse agents (options, one
// listener per address shared by its agents, kept across reloads) is the
// sidecar's, in internal/transports.
package reverse
