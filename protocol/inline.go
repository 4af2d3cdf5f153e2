package protocol

import (
	"encoding/base64"
	"slices"
)

// The inline body (FeatureInlineBody): RequestHeaders may carry chunk 0 of
// the request body as "inline_body", a body chunk object without
// request_id. It is encoded and decoded exactly like a RequestBodyChunk's
// members: base64 data, decoded in place in the event's own buffer.

// appendInlineBody writes `,"inline_body":{…}` for chunk c.
func appendInlineBody(dst []byte, c *BodyChunk) []byte {
	dst = slices.Grow(dst, 112+base64.StdEncoding.EncodedLen(len(c.Data)))
	dst = append(dst, `,"inline_body":{`...)
	return appendChunkFields(dst, c, TypeRequestBodyChunk)
}

// inlineBody reads the value of "inline_body" into c: an object with the
// members of a body chunk. null reads as absent and leaves c zero; in a
// present chunk total_size and the progress stay -1 when absent, as for a
// BodyChunk. A timeout_ms inside it is ignored: the event's applies.
func (s *scanner) inlineBody(c *BodyChunk) (present bool, err error) {
	*c = BodyChunk{}
	if s.null() {
		return false, nil
	}
	c.TotalSize, c.Progress = -1, -1
	present, err = s.nested("inline_body", ctxInlineBody, s.chunkFields(c))
	c.TimeoutMs = 0 // the event's own counts; none is sent in here
	return present, err
}
