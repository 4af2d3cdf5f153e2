package handshake

import (
	"errors"
	"fmt"
	"slices"

	"github.com/zentinelproxy/sidecar/protocol"
)

// Errors of the negotiation. Wrapped with details; test with errors.Is.
var (
	// ErrHandshakeVersion: the peer speaks a protocol version other than 2.
	ErrHandshakeVersion = errors.New("handshake: unsupported protocol version")
	// ErrHandshakeRefused: the agent answered accepted=false or with an error.
	ErrHandshakeRefused = errors.New("handshake: refused by agent")
	// ErrHandshakeInvalid: the message is missing something it must carry.
	ErrHandshakeInvalid = errors.New("handshake: invalid message")
)

// ProxyFeatures are the features this proxy offers.
var ProxyFeatures = []string{protocol.FeatureCancellation, protocol.FeatureBodyMutation, protocol.FeatureStreaming, protocol.FeatureInlineBody, protocol.FeatureClientRequest}

// NewRequest is the proxy's HandshakeRequest.
func NewRequest(clientName string) protocol.HandshakeRequest {
	return NewRequestWith(clientName)
}

// NewRequestWith is the proxy's HandshakeRequest offering features beyond
// ProxyFeatures, e.g. protocol.FeatureProtobufPayloads on a UDS
// connection (the gRPC transport is protobuf anyway).
func NewRequestWith(clientName string, more ...string) protocol.HandshakeRequest {
	return protocol.HandshakeRequest{
		ProtocolVersion:   protocol.Version,
		ClientName:        clientName,
		SupportedFeatures: append(slices.Clone(ProxyFeatures), more...),
	}
}

// CheckResponse validates an agent's HandshakeResponse on the proxy side
// and returns the capabilities to use. Capabilities the proxy did not offer
// are masked: an agent cannot claim cancellation if the proxy did not
// offer it.
func CheckResponse(req *protocol.HandshakeRequest, resp *protocol.HandshakeResponse) (protocol.Capabilities, error) {
	if !resp.Accepted || resp.Error != "" {
		reason := resp.Error
		if reason == "" {
			reason = "no reason given"
		}
		return protocol.Capabilities{}, fmt.Errorf("%w: %q", ErrHandshakeRefused, clip(reason))
	}
	if resp.ProtocolVersion != protocol.Version {
		return protocol.Capabilities{}, fmt.Errorf("%w: agent speaks %d, proxy speaks %d", ErrHandshakeVersion, resp.ProtocolVersion, protocol.Version)
	}
	caps := resp.Capabilities
	if !slices.Contains(req.SupportedFeatures, protocol.FeatureCancellation) {
		caps.SupportsCancellation = false
	}
	if !slices.Contains(req.SupportedFeatures, protocol.FeatureStreaming) {
		caps.SupportsStreaming = false
	}
	if !slices.Contains(req.SupportedFeatures, protocol.FeatureInlineBody) {
		caps.SupportsInlineBody = false
	}
	if !slices.Contains(req.SupportedFeatures, protocol.FeatureClientRequest) {
		caps.SupportsClientRequest = false
	}
	if !slices.Contains(req.SupportedFeatures, protocol.FeatureProtobufPayloads) {
		caps.SupportsProtobufPayloads = false
	}
	return caps, nil
}

// Answer builds the agent side's HandshakeResponse to req: a refusal with
// a clear error for a wrong version, an acceptance with caps otherwise.
func Answer(req *protocol.HandshakeRequest, agentName string, caps protocol.Capabilities) (protocol.HandshakeResponse, error) {
	if req.ProtocolVersion != protocol.Version {
		err := fmt.Errorf("%w: proxy speaks %d, agent speaks %d", ErrHandshakeVersion, req.ProtocolVersion, protocol.Version)
		return protocol.HandshakeResponse{ProtocolVersion: protocol.Version, AgentName: agentName, Accepted: false, Error: err.Error()}, err
	}
	// An agent declares inline_body, client_request and protobuf_payloads
	// only to a proxy that offered them.
	if !slices.Contains(req.SupportedFeatures, protocol.FeatureInlineBody) {
		caps.SupportsInlineBody = false
	}
	if !slices.Contains(req.SupportedFeatures, protocol.FeatureClientRequest) {
		caps.SupportsClientRequest = false
	}
	if !slices.Contains(req.SupportedFeatures, protocol.FeatureProtobufPayloads) {
		caps.SupportsProtobufPayloads = false
	}
	return protocol.HandshakeResponse{ProtocolVersion: protocol.Version, AgentName: agentName, Accepted: true, Capabilities: caps}, nil
}

// CheckRegistration validates the protocol part of a RegistrationRequest
// (version and id); authentication and allow-lists are the listener's job.
func CheckRegistration(req *protocol.RegistrationRequest) error {
	if req.ProtocolVersion != protocol.Version {
		return fmt.Errorf("%w: agent speaks %d, proxy speaks %d", ErrHandshakeVersion, req.ProtocolVersion, protocol.Version)
	}
	if req.AgentID == "" {
		return fmt.Errorf("%w: empty agent_id", ErrHandshakeInvalid)
	}
	if len(req.AgentID) > 256 {
		return fmt.Errorf("%w: agent_id longer than 256 bytes", ErrHandshakeInvalid)
	}
	return nil
}

// AcceptRegistration is the proxy side's capability decision for an
// accepted registration, the counterpart of CheckResponse's masking:
// protobuf payloads when the agent declared supports_protobuf_payloads,
// the proxy allows them and the answer is a RegistrationResponse (the
// 0x02 compatibility answer has no field to say so). The capabilities
// returned keep supports_protobuf_payloads only when it was taken.
func AcceptRegistration(req *protocol.RegistrationRequest, allowProtobuf, compat bool) (caps protocol.Capabilities, protobuf bool) {
	caps = req.Capabilities
	protobuf = caps.SupportsProtobufPayloads && allowProtobuf && !compat
	caps.SupportsProtobufPayloads = protobuf
	return caps, protobuf
}

// RegistrationProtobuf is the agent side's reading of the payload
// encoding in an accepted RegistrationResponse: whether the frames that
// follow are protobuf, and an error when the proxy chose protobuf though
// the agent did not declare it (declared).
func RegistrationProtobuf(resp *protocol.RegistrationResponse, declared bool) (bool, error) {
	if resp.PayloadEncoding != protocol.EncodingProtobuf {
		return false, nil
	}
	if !declared {
		return false, fmt.Errorf("%w: proxy chose protobuf payloads, which this agent did not declare", ErrHandshakeInvalid)
	}
	return true, nil
}

// CheckRegistrationResponse validates a RegistrationResponse on the agent side.
func CheckRegistrationResponse(resp *protocol.RegistrationResponse) error {
	if !resp.Accepted || resp.Error != "" {
		reason := resp.Error
		if reason == "" {
			reason = "no reason given"
		}
		return fmt.Errorf("%w: %q", ErrHandshakeRefused, clip(reason))
	}
	return nil
}

// clip bounds peer-provided text before it reaches logs and errors.
func clip(s string) string {
	if len(s) > 256 {
		return s[:256] + "…"
	}
	return s
}
