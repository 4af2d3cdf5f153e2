package sdk

import (
	"context"

	"github.com/zentinelproxy/sidecar/protocol"
)

// Inline bodies (feature inline_body, docs/protocol.md): a proxy may send
// chunk 0 of a buffered request body inside RequestHeaders, and one
// Decision answers both. The SDK hides this from handlers: they see
// OnRequestHeaders and then OnRequestBody with chunk 0, exactly as when the
// chunk comes in an event of its own, and the two answers are merged into
// the one Decision the proxy expects.

// DeclaredCapabilities are the capabilities the SDK declares for h in a
// handshake, a registration or GetCapabilities: h's own, plus
// supports_inline_body when h handles request bodies (the SDK handles the
// inline form for it), unless h implements InlineBodyChooser, and
// supports_client_request (handlers then see the request as the client
// sent it: Event.RequestHeaders carries the client's header block and
// RequestTarget; Options.NoClientRequest and its kin turn it off). The
// handshake drops what a proxy did not offer.
func DeclaredCapabilities(h Handler) protocol.Capabilities {
	c := h.Capabilities()
	c.SupportsClientRequest = true
	if c.HandlesRequestBody {
		c.SupportsInlineBody = true
	}
	if ch, ok := h.(InlineBodyChooser); ok {
		c.SupportsInlineBody = ch.InlineBody()
	}
	return c
}

// InlineBodyChooser is an optional interface of a Handler that decides
// itself whether to declare supports_inline_body. With the feature, the
// proxy reads a buffered request body before it sends RequestHeaders, so
// a verdict on the headers alone waits for the body (at most the agent's
// request body limit); an agent that mostly blocks on headers and wants
// that verdict before the upload may say false.
type InlineBodyChooser interface {
	InlineBody() bool
}

// inlineBody runs the handler's OnRequestBody for the inline chunk of a
// RequestHeaders event whose OnRequestHeaders has filled ev.decision, and
// merges its answer into ev.decision (see mergeInline). A header decision
// other than allow or needs_more (a block, a redirect) is final for the
// whole event: OnRequestBody is not called, as the proxy would send no
// chunk after it. Allocation-free: the body reply reuses the pooled event.
func (d *Dispatcher) inlineBody(ctx context.Context, ev *Event) error {
	dec := &ev.decision
	if dec.Kind != protocol.DecisionAllow && dec.Kind != protocol.DecisionNeedsMore {
		return nil
	}
	m := &ev.RequestHeaders.InlineBody
	m.RequestID, m.TimeoutMs = ev.RequestHeaders.RequestID, ev.RequestHeaders.TimeoutMs
	r := &ev.body
	r.Decision.Reset()
	r.Mutation.Reset()
	r.UseMutation = false
	if err := d.h.OnRequestBody(ctx, m, r); err != nil {
		return err
	}
	mergeInline(dec, r, m.IsLast)
	return nil
}

// mergeInline merges the answer r to the inline chunk into dec, the answer
// to the headers (an allow or needs_more), so that the proxy does with the
// one Decision what it would have done with the two replies in turn:
//
//   - r is a BodyMutation (Pass, Drop, Replace): the verdict is allow, with
//     needs_more unless the chunk is the last (a mutation is never final:
//     the handler gets chunk 1); a drop or replace becomes the Decision's
//     request_body_mutation for chunk 0. The header reply's operations and
//     audit stay. (What r.Decision holds is ignored, as for a mutation
//     reply to a chunk event.)
//   - r is a Decision: its verdict (kind, needs_more, block or redirect
//     parameters) and its request_body_mutation replace the header
//     reply's; request and response header operations are the header
//     reply's followed by r's; audit lists are concatenated, and r's
//     confidence and custom value win when set.
func mergeInline(dec *protocol.Decision, r *BodyReply, last bool) {
	if r.UseMutation {
		dec.Kind, dec.NeedsMore = protocol.DecisionAllow, !last
		dec.HasRequestBodyMutation = r.Mutation.Action != protocol.MutationPass
		if dec.HasRequestBodyMutation {
			bm := &dec.RequestBodyMutation
			bm.RequestID, bm.Phase, bm.ChunkIndex = dec.RequestID, protocol.PhaseRequest, 0
			bm.Action, bm.Data = r.Mutation.Action, r.Mutation.Data
		}
		return
	}
	b := &r.Decision
	dec.Kind, dec.NeedsMore = b.Kind, b.NeedsMore
	dec.Status, dec.Body, dec.RedirectURL = b.Status, b.Body, b.RedirectURL
	dec.BlockHeaders = append(dec.BlockHeaders[:0], b.BlockHeaders...)
	dec.RequestHeaderOps = append(dec.RequestHeaderOps, b.RequestHeaderOps...)
	dec.ResponseHeaderOps = append(dec.ResponseHeaderOps, b.ResponseHeaderOps...)
	dec.HasRequestBodyMutation = b.HasRequestBodyMutation
	if b.HasRequestBodyMutation {
		bm := &dec.RequestBodyMutation
		bm.RequestID, bm.Phase, bm.ChunkIndex = dec.RequestID, protocol.PhaseRequest, 0
		bm.Action, bm.Data = b.RequestBodyMutation.Action, b.RequestBodyMutation.Data
	}
	a, ba := &dec.Audit, &b.Audit
	a.Tags = append(a.Tags, ba.Tags...)
	a.RuleIDs = append(a.RuleIDs, ba.RuleIDs...)
	a.ReasonCodes = append(a.ReasonCodes, ba.ReasonCodes...)
	if ba.HasConf {
		a.Confidence, a.HasConf = ba.Confidence, true
	}
	if len(ba.Custom) > 0 {
		a.Custom = ba.Custom
	}
}
