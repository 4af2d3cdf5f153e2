package exchange

import (
	"iter"

	"github.com/zentinelproxy/sidecar/protocol"
)

// Trailer fields (RFC 9110 §6.5) go on where both ends' framing carries
// them: a request's from an HTTP/2 stream or a chunked HTTP/1 body to an
// HTTP/2 upstream, or to an HTTP/1 one whose body goes chunked; a
// response's from an HTTP/2 or chunked HTTP/1 upstream to an HTTP/2
// client, or to an HTTP/1.1 one whose response goes chunked. Elsewhere
// they are dropped and counted. Only fields no recipient could take for
// framing, routing, a request modifier, authentication, response control
// or content processing pass (TrailerAllowed, RFC 9110 §6.5.1); their
// size is bounded where they are read, by the header limits of the
// engine that read them (a listener's read_buffer_size or
// http2.max_header_list_size, an upstream's read_buffer_size).

// Trailer outcomes (TrailerStats).
const (
	trailerForwarded = iota
	trailerDropped
	trailerRefused
	numTrailerOutcomes
)

// TrailerAllowed reports whether a trailer field named name may be
// forwarded: a valid field name that is not a pseudo-field, not
// hop-by-hop, not the sidecar's own (X-Sidecar-*), and none of those
// RFC 9110 §6.5.1 keeps out of trailers.
func TrailerAllowed(name []byte) bool {
	// The fields no agent may set (hop-by-hop, Host, Content-Length, the
	// sidecar's markers: a client never speaks for it, in a trailer
	// section as in its head).
	if len(name) == 0 || refusal(name) != "" {
		return false
	}
	for _, c := range name {
		if !tchar[c] {
			return false // ":authority" and the like included
		}
	}
	if len(name) >= 11 && foldEq(name[:11], "x-forwarded") {
		return false
	}
	var low [24]byte
	if len(name) > len(low) {
		return true // longer than every name below
	}
	for i, c := range name {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		low[i] = c
	}
	switch string(low[:len(name)]) {
	case
		// Framing and routing.
		"max-forwards", "forwarded", "via", "x-real-ip",
		// Request modifiers.
		"expect", "range", "if-match", "if-none-match", "if-modified-since",
		"if-unmodified-since", "if-range", "cache-control", "pragma",
		// Authentication and state.
		"authorization", "www-authenticate", "authentication-info", "cookie", "set-cookie",
		// Response control.
		"location", "retry-after", "vary", "age", "expires", "date",
		// Content processing.
		"content-type", "content-encoding", "content-range", "content-location", "content-language":
		return false
	}
	return true
}

// validTrailerValue reports a value with no CR, LF or NUL.
func validTrailerValue(v []byte) bool {
	for _, c := range v {
		if c == '\r' || c == '\n' || c == 0 {
			return false
		}
	}
	return true
}

// filterTrailers returns the fields of src that may go on, in dst's
// storage, counting the refused ones under phase p.
func (ex *Exchange) filterTrailers(p protocol.Phase, dst, src []Field) []Field {
	dst = dst[:0]
	refused := 0
	for _, f := range src {
		if !TrailerAllowed(f.Name) || !validTrailerValue(f.Value) {
			refused++
			continue
		}
		dst = append(dst, f)
	}
	if refused > 0 {
		ex.core.stats.trailers[p][trailerRefused].Add(uint64(refused))
	}
	return dst
}

// Trailers are the trailer fields of the upstream's response that may go
// on to the client, once its body ended (nil: none, or an upstream that
// has none); the front end that calls it sends them. Valid until Finish.
func (ex *Exchange) Trailers() []Field {
	ts, ok := ex.res.(TrailerSource)
	if !ok || !ex.upBodyDone {
		return nil
	}
	src := ts.Trailers()
	if len(src) == 0 {
		return nil
	}
	ex.respTrailers = ex.filterTrailers(protocol.PhaseResponse, ex.respTrailers, src)
	ex.core.stats.trailers[protocol.PhaseResponse][trailerForwarded].Add(uint64(len(ex.respTrailers)))
	return ex.respTrailers
}

// TrailersDropped is the front end's word that the response's body went
// out in a framing without trailers (a Content-Length, a close, an
// HTTP/1.0 client): the upstream's trailers are counted as dropped.
func (ex *Exchange) TrailersDropped() {
	ts, ok := ex.res.(TrailerSource)
	if !ok || !ex.upBodyDone {
		return
	}
	if n := len(ts.Trailers()); n > 0 {
		ex.core.stats.trailers[protocol.PhaseResponse][trailerDropped].Add(uint64(n))
	}
}

// Trailers implements BodyProducer: the client's request trailers that
// may go on, once Next returned the last piece. Without framed (the
// upstream cannot carry them) they are counted as dropped, and none
// returned.
func (p *bodyProducer) Trailers(framed bool) []Field {
	ex := (*Exchange)(p)
	if !ex.reqSrc.eof || ex.reqSrc.src == nil {
		return nil
	}
	ts, ok := ex.reqSrc.src.(TrailerSource)
	if !ok {
		return nil
	}
	src := ts.Trailers()
	if len(src) == 0 {
		return nil
	}
	if !framed {
		ex.core.stats.trailers[protocol.PhaseRequest][trailerDropped].Add(uint64(len(src)))
		return nil
	}
	ex.reqTrailers = ex.filterTrailers(protocol.PhaseRequest, ex.reqTrailers, src)
	ex.core.stats.trailers[protocol.PhaseRequest][trailerForwarded].Add(uint64(len(ex.reqTrailers)))
	return ex.reqTrailers
}

// TrailerNames yields the names of a Trailer field's list (names, as
// UpstreamRequest.Trailer holds it) that may go on, trimmed.
func TrailerNames(names []byte) iter.Seq[[]byte] {
	return func(yield func([]byte) bool) {
		for len(names) > 0 {
			i := 0
			for i < len(names) && names[i] != ',' {
				i++
			}
			n := trimOWS(names[:i])
			if i < len(names) {
				i++
			}
			names = names[i:]
			if TrailerAllowed(n) && !yield(n) {
				return
			}
		}
	}
}
