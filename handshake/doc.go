// Package handshake holds the version and capability negotiation of agent
// protocol v2, shared by the UDS, reverse and gRPC transports and by both
// sides of them: the proxy (NewRequest, CheckResponse, CheckRegistration,
// AcceptRegistration) and the agent (Answer, CheckRegistrationResponse,
// RegistrationProtobuf). It does no I/O: transports move the messages,
// this package decides on them.
//
// It stays this thin on purpose. Every rule of docs/protocol.md's
// handshake and registration sections — the version check, which
// features the proxy offers (ProxyFeatures), a capability the other side
// did not offer masked away, a refusal's reason bounded before it reaches
// a log — is decided here once, so that the proxy's transports, the Go
// SDK and any other implementation built on it cannot disagree.
//
// # API
//
// Everything exported is stable and changes only with the protocol: a new
// feature is added to ProxyFeatures and to the masking of CheckResponse
// and Answer. ProxyFeatures must not be modified by callers; offer more
// with NewRequestWith. Errors wrap ErrHandshakeVersion,
// ErrHandshakeRefused or ErrHandshakeInvalid; test with errors.Is.
package handshake
