package extproc

import (
	"context"
	"net"

	"google.golang.org/grpc/credentials"

	"github.com/zentinelproxy/sidecar/internal/rawio"
)

// rawCreds are the connections' transport credentials with the socket
// underneath read and written by raw system calls (rawio), below TLS when
// TLS is on. gRPC dials as it otherwise would (resolver, proxy, keepalive,
// TCP user timeout); only the connection's Reads and Writes change.
//
// Why: every request costs its Process stream a few writes (gRPC's writer
// flushes each time its queue runs empty) and reads, each a system call
// through net.Conn, which enters the runtime's system-call state. The
// proxy's other sockets are raw already, so the runtime's monitor often
// sleeps; each of the link's system calls then woke it (a futex wake), and
// a write to the processor preempted in the loopback's receive path was
// found "in a system call" and its P handed to another thread: context
// switches the proxy's HTTP sockets stopped paying for (rawio's package
// doc). A connection that is not a TCP or Unix socket is left as it is
// (rawio.Wrap). Measured with 64 requests at a time through the proxy to
// a CONTINUE processor (both headers phases), medians of 6 alternated
// rounds: the proxy's context switches per request 1.86 -> 0.85, the CPU
// the agent adds per request 126 -> 105 µs (docs/performance.md).
type rawCreds struct {
	credentials.TransportCredentials
}

// ClientHandshake wraps the dialled socket, then runs the inner
// credentials' handshake over it.
func (c rawCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c.TransportCredentials.ClientHandshake(ctx, authority, rawio.Wrap(conn))
}

// Clone implements credentials.TransportCredentials.
func (c rawCreds) Clone() credentials.TransportCredentials {
	return rawCreds{c.TransportCredentials.Clone()}
}
