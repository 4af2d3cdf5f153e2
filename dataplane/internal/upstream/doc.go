// Package upstream is the dataplane's upstream side: for each configured
// upstream, its endpoints (balanced round robin or by least requests in
// flight), one fasthttp.HostClient connection pool per endpoint, the
// active health checks and the passive ejection that take endpoints out,
// DNS re-resolution of endpoint names, TLS to the upstream, and the look
// at a pooled connection before it is reused (acquireConn). An upstream
// of protocol h2 or h2c sends its requests as HTTP/2 streams instead
// (h2.go), on connections of x/net/http2 each endpoint keeps.
//
// An Upstream belongs to one routing table; New builds the next table's
// from the previous one, keeping the endpoints whose address and client
// settings did not change, with their warm pools, health state and
// counters. Start runs its health checks and re-resolution until Stop;
// its endpoints go on serving the requests of their table after Stop.
//
// Every connection the pools make is a raw socket (internal/rawio),
// under TLS when configured, that caches its deadlines (upConn).
package upstream
