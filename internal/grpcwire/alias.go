package grpcwire

import (
	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/protocol"
)

// The AgentMessage wire format itself is package pbwire's (shared with the
// UDS transport's protobuf payloads); these names keep the gRPC
// transport's callers in one package.

// Frame is one received AgentMessage (pbwire.Frame).
type Frame = pbwire.Frame

// Payload names the payload of a received AgentMessage (pbwire.Payload).
type Payload = pbwire.Payload

// Payloads (pbwire's).
const (
	PayloadNone              = pbwire.PayloadNone
	PayloadRequestHeaders    = pbwire.PayloadRequestHeaders
	PayloadRequestBodyChunk  = pbwire.PayloadRequestBodyChunk
	PayloadResponseHeaders   = pbwire.PayloadResponseHeaders
	PayloadResponseBodyChunk = pbwire.PayloadResponseBodyChunk
	PayloadDecision          = pbwire.PayloadDecision
	PayloadCancel            = pbwire.PayloadCancel
	PayloadBodyMutation      = pbwire.PayloadBodyMutation
	PayloadCancelAll         = pbwire.PayloadCancelAll
	PayloadPing              = pbwire.PayloadPing
	PayloadPong              = pbwire.PayloadPong
	PayloadAgentError        = pbwire.PayloadAgentError
	PayloadUnknown           = pbwire.PayloadUnknown
)

// AppendMessage appends the AgentMessage carrying msg (pbwire.AppendMessage).
func AppendMessage(dst []byte, msg protocol.Message) ([]byte, error) {
	return pbwire.AppendMessage(dst, msg)
}

// AppendAgentError appends the AgentMessage of an agent error for request
// id (pbwire.AppendAgentError).
func AppendAgentError(dst []byte, id uint64, reason string) []byte {
	return pbwire.AppendAgentError(dst, id, reason)
}
