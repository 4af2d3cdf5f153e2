// Package allowagent is the smallest useful agent: it allows everything.
// It measures what the agent round trip itself costs (the end-to-end
// benchmark uses it) and is the skeleton to start a new agent from.
package allowagent

import (
	"context"

	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// Handler allows every request. With RequestBody set it also asks for
// request bodies and reads every chunk before allowing.
type Handler struct {
	sdk.Base
}

// New returns an allow-all agent that sees request headers only, or also
// request bodies when requestBody is set.
func New(requestBody bool) *Handler {
	return &Handler{Base: sdk.Base{Caps: protocol.Capabilities{
		HandlesRequestHeaders: true,
		HandlesRequestBody:    requestBody,
		SupportsCancellation:  true,
	}}}
}

// OnRequestBody implements sdk.Handler: ask for the next chunk until the
// last one, then allow. A final allow before the last chunk would end the
// agent's say over the body, and it would see no more of it.
func (h *Handler) OnRequestBody(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
	if !m.IsLast {
		r.NeedMore()
	}
	return nil
}
