// Package edgetest is the sidecar's raw-socket HTTP conformance suite: a
// table of raw request bytes, each with the statuses the client must get,
// whether the connection stays open, and the exact bytes the upstream must
// receive (nothing, for a refused request), run against the real sidecar
// binary in front of an upstream that logs every request byte for byte and
// a policy agent that records what it was shown.
//
// Beside the table it holds the fault tests of the HTTP edge: a slow
// upstream and a long download past read_timeout, file-descriptor
// exhaustion under a low RLIMIT_NOFILE, an upstream restart under
// keep-alive, hostile agent replies (huge header operation lists, unsafe
// Location headers) and the admin listener's Host check; and the client
// connection's life (lifecycle_test.go): idle connections closed
// unanswered, the connection limit and its accounting, the lingering
// close after a request refused before its body was read, and a tunnel
// ending with either of its sides.
//
// The suite builds ./cmd/sidecar once per run; SIDECAR_BIN points it at
// another binary instead (to run it against an older build).
package edgetest
