// Package sdk is the agent side of agent protocol v2: implement Handler,
// then serve it over a Unix socket (ServeUDS), gRPC (ServeGRPC) or a reverse
// connection to the proxy (DialAndServe). The same handler works over all
// three.
//
// Requests of one connection are handled concurrently (bounded by a
// Limiter when the options name one); the events of one request reach the
// handler in order. A handler's context ends at its event's deadline (the
// proxy's timeout_ms, counted from when the event was read), and a
// CancelRequest from the proxy cancels it. An event whose request was
// canceled, or whose deadline passed, before its handler could start is
// dropped without an answer (ReadStats counts them).
//
// Messages passed to a handler are valid only during the call: copy what
// you keep.
package sdk

import (
	"context"

	"github.com/zentinelproxy/sidecar/protocol"
)

// Handler decides on requests. Embed Base to get allow-everything defaults
// and override what the agent cares about.
type Handler interface {
	// Capabilities declares which events the agent wants.
	Capabilities() protocol.Capabilities
	// OnRequestHeaders fills d (pre-set to allow for this request).
	OnRequestHeaders(ctx context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error
	// OnRequestBody answers one request body chunk.
	OnRequestBody(ctx context.Context, m *protocol.BodyChunk, r *BodyReply) error
	// OnResponseHeaders fills d (pre-set to allow for this request).
	OnResponseHeaders(ctx context.Context, m *protocol.ResponseHeaders, d *protocol.Decision) error
	// OnResponseBody answers one response body chunk.
	OnResponseBody(ctx context.Context, m *protocol.BodyChunk, r *BodyReply) error
}

// BodyReply is the answer to a body chunk: a Decision (the default, pre-set
// to allow; set NeedsMore to see the next chunk) or, after one of the
// mutation helpers, a BodyMutation for this chunk.
type BodyReply struct {
	Decision protocol.Decision
	Mutation protocol.BodyMutation
	// UseMutation selects Mutation as the reply.
	UseMutation bool
}

// Pass forwards the chunk unchanged (BodyMutation with no data).
func (r *BodyReply) Pass() {
	r.UseMutation = true
	r.Mutation.Action = protocol.MutationPass
	r.Mutation.Data = nil
}

// Drop removes the chunk from the stream.
func (r *BodyReply) Drop() {
	r.UseMutation = true
	r.Mutation.Action = protocol.MutationDrop
	r.Mutation.Data = nil
}

// Replace forwards data instead of the chunk. data must stay valid until the
// handler returns (it is encoded before the next event).
func (r *BodyReply) Replace(data []byte) {
	r.UseMutation = true
	r.Mutation.Action = protocol.MutationReplace
	r.Mutation.Data = data
}

// NeedMore asks for the next chunk before deciding.
func (r *BodyReply) NeedMore() { r.UseMutation = false; r.Decision.NeedsMore = true }

// Base is a Handler that allows everything; embed it.
type Base struct {
	Caps protocol.Capabilities
}

// Capabilities implements Handler.
func (b Base) Capabilities() protocol.Capabilities { return b.Caps }

// OnRequestHeaders implements Handler: allow.
func (Base) OnRequestHeaders(context.Context, *protocol.RequestHeaders, *protocol.Decision) error {
	return nil
}

// OnRequestBody implements Handler: pass the chunk.
func (Base) OnRequestBody(_ context.Context, _ *protocol.BodyChunk, r *BodyReply) error {
	r.Pass()
	return nil
}

// OnResponseHeaders implements Handler: allow.
func (Base) OnResponseHeaders(context.Context, *protocol.ResponseHeaders, *protocol.Decision) error {
	return nil
}

// OnResponseBody implements Handler: pass the chunk.
func (Base) OnResponseBody(_ context.Context, _ *protocol.BodyChunk, r *BodyReply) error {
	r.Pass()
	return nil
}
