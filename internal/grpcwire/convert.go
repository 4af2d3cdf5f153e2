package grpcwire

import (
	"github.com/zentinelproxy/sidecar/grpcagent/pb"
	"github.com/zentinelproxy/sidecar/protocol"
)

// Conversions of the handshake messages, which the gRPC transport carries
// as generated protobuf messages on their own RPC (the stream's messages
// go through the hand codec of internal/pbwire instead).

// CapabilitiesToPB converts c.
func CapabilitiesToPB(c protocol.Capabilities) *pb.Capabilities {
	return &pb.Capabilities{
		HandlesRequestHeaders:  c.HandlesRequestHeaders,
		HandlesRequestBody:     c.HandlesRequestBody,
		HandlesResponseHeaders: c.HandlesResponseHeaders,
		HandlesResponseBody:    c.HandlesResponseBody,
		SupportsStreaming:      c.SupportsStreaming,
		SupportsCancellation:   c.SupportsCancellation,
		MaxConcurrentRequests:  c.MaxConcurrentRequests,
		SupportsInlineBody:     c.SupportsInlineBody,
		SupportsClientRequest:  c.SupportsClientRequest,
	}
}

// CapabilitiesFromPB converts c (nil is the zero value).
func CapabilitiesFromPB(c *pb.Capabilities) protocol.Capabilities {
	if c == nil {
		return protocol.Capabilities{}
	}
	return protocol.Capabilities{
		HandlesRequestHeaders:  c.HandlesRequestHeaders,
		HandlesRequestBody:     c.HandlesRequestBody,
		HandlesResponseHeaders: c.HandlesResponseHeaders,
		HandlesResponseBody:    c.HandlesResponseBody,
		SupportsStreaming:      c.SupportsStreaming,
		SupportsCancellation:   c.SupportsCancellation,
		MaxConcurrentRequests:  c.MaxConcurrentRequests,
		SupportsInlineBody:     c.SupportsInlineBody,
		SupportsClientRequest:  c.SupportsClientRequest,
	}
}

// CapabilityRequestToPB converts the proxy's handshake request.
func CapabilityRequestToPB(r *protocol.HandshakeRequest) *pb.CapabilityRequest {
	v := uint32(0)
	if r.ProtocolVersion > 0 {
		v = uint32(r.ProtocolVersion)
	}
	return &pb.CapabilityRequest{
		ProtocolVersion:   v,
		ClientName:        r.ClientName,
		SupportedFeatures: append([]string(nil), r.SupportedFeatures...),
	}
}

// CapabilityRequestFromPB converts a CapabilityRequest into the handshake
// request it stands for.
func CapabilityRequestFromPB(r *pb.CapabilityRequest) protocol.HandshakeRequest {
	return protocol.HandshakeRequest{
		ProtocolVersion:   int(r.GetProtocolVersion()),
		ClientName:        r.GetClientName(),
		SupportedFeatures: append([]string(nil), r.GetSupportedFeatures()...),
	}
}

// CapabilityResponseToPB converts the agent's handshake response; accepted
// is always sent explicitly.
func CapabilityResponseToPB(r *protocol.HandshakeResponse) *pb.CapabilityResponse {
	v := uint32(0)
	if r.ProtocolVersion > 0 {
		v = uint32(r.ProtocolVersion)
	}
	acc := r.Accepted
	return &pb.CapabilityResponse{
		ProtocolVersion: v,
		AgentName:       r.AgentName,
		Accepted:        &acc,
		Error:           r.Error,
		Capabilities:    CapabilitiesToPB(r.Capabilities),
	}
}

// CapabilityResponseFromPB converts a CapabilityResponse into a handshake
// response. An absent accepted field is an acceptance, as in the JSON form.
func CapabilityResponseFromPB(r *pb.CapabilityResponse) protocol.HandshakeResponse {
	acc := true
	if r.Accepted != nil {
		acc = *r.Accepted
	}
	return protocol.HandshakeResponse{
		ProtocolVersion: int(r.GetProtocolVersion()),
		AgentName:       r.GetAgentName(),
		Accepted:        acc,
		Error:           r.GetError(),
		Capabilities:    CapabilitiesFromPB(r.GetCapabilities()),
	}
}
