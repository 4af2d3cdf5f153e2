package extauthz

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"

	"github.com/zentinelproxy/sidecar/internal/authcall"
	"github.com/zentinelproxy/sidecar/protocol"
)

// The CheckRequest is Envoy's (source/extensions/filters/common/ext_authz/
// check_request_utils.cc): the headers map has lower-cased names, repeated
// headers joined with commas, and the pseudo-headers :authority, :method,
// :path and :scheme; path is the request target with its query (Envoy's
// :path), query the query alone (Envoy leaves it empty; filled here for
// policies that read it); protocol as the client named it; source the
// client's address and, on mTLS, its principal (the certificate's first
// URI SAN, else its subject); destination the listener's side of the
// connection.

// utf8 is b as a string that proto3 can carry: HTTP allows bytes in
// header values (obs-text) and targets that are not UTF-8, which a proto3
// string field may not hold (the Check would fail to encode). Each byte
// of an invalid sequence becomes '!', as Envoy sanitizes them
// (MessageUtil::sanitizeUtf8String); a valid b is copied as is.
func utf8Str(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	out := make([]byte, 0, len(b))
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n <= 1 {
			out = append(out, '!')
			b = b[1:]
			continue
		}
		out = append(out, b[:n]...)
		b = b[n:]
	}
	return string(out)
}

// principalOf is Envoy's peer principal: the certificate's first URI
// SAN, else its subject.
func principalOf(san, subject []byte) []byte {
	for len(san) > 0 {
		var item []byte
		item, san, _ = bytes.Cut(san, []byte(","))
		if v, ok := bytes.CutPrefix(item, []byte("URI:")); ok {
			return v
		}
	}
	return subject
}

func header(hs protocol.Headers, name string) []byte {
	for i := range hs {
		if strings.EqualFold(string(hs[i].Name), name) {
			return hs[i].Value
		}
	}
	return nil
}

// lowerName is strings.ToLower(string(b)) without the second copy for a
// name that is lower-case already (the dataplane sends them so).
func lowerName(b []byte) string {
	for _, c := range b {
		if 'A' <= c && c <= 'Z' || c >= 0x80 {
			return strings.ToLower(string(b))
		}
	}
	return string(b)
}

// The CheckResponse is read as Envoy's ext_authz filter reads it
// (ext_authz_grpc_impl.cc, ext_authz.cc):
//
//   - status OK: the request goes on; ok_response's headers change the
//     upstream request, headers_to_remove are removed after them,
//     response_headers_to_add go on the client's response;
//   - error_response set (status not OK): an error, the agent's failure
//     policy decides (Envoy's status_on_error);
//   - any other status: denied, with denied_response's status (403 when
//     unset), headers and body.
//
// A header's action is the deprecated append when it is set (true: a new
// field line for a request header, as Envoy's append to the existing
// value means the same under RFC 9110 §5.3; false: overwrite), else
// append_action: APPEND_IF_EXISTS_OR_ADD adds a field line,
// OVERWRITE_IF_EXISTS_OR_ADD sets, ADD_IF_ABSENT and OVERWRITE_IF_EXISTS
// are decided here against the request's headers as the agent was shown
// them, in order. On the client's response they cannot be (its headers
// are not known yet): such an answer fails the request.
// query_parameters_to_set and query_parameters_to_remove rebuild the
// query of the target the agent was shown (query.go) into the
// Decision's query rewrite. Envoy refuses to
// remove pseudo-headers and Host; so does this mapping (the dataplane's
// rules refuse the rest it refuses for every agent).

// mapResponse fills d from the server's answer.
func (cl *Client) mapResponse(m *protocol.RequestHeaders, r *authv3.CheckResponse, d *protocol.Decision) error {
	if r.GetDynamicMetadata() != nil {
		cl.count(evIgnored)
	}
	code := codes.Code(r.GetStatus().GetCode())
	if code == codes.OK {
		cl.count(evOK)
		ok := r.GetOkResponse()
		if ok.GetDynamicMetadata() != nil {
			cl.count(evIgnored)
		}
		d.Kind = protocol.DecisionAllow
		if set, rm := ok.GetQueryParametersToSet(), ok.GetQueryParametersToRemove(); len(set) > 0 || len(rm) > 0 {
			q, err := rewriteQuery(d.Query[:0], m.URI, set, rm)
			if err != nil {
				cl.count(evBadQuery)
				return err
			}
			d.SetQuery, d.Query = true, q
			cl.count(evQueryRewrites)
		}
		// The request's header names only matter to the conditional
		// actions of headers to set: an allow without them (the common
		// answer) builds no set.
		var present map[string]bool
		if len(ok.GetHeaders()) > 0 {
			present = presence(m.Headers)
		}
		for _, h := range ok.GetHeaders() {
			if h.GetHeader() == nil {
				continue
			}
			name := strings.ToLower(h.GetHeader().GetKey())
			op, apply := requestAction(h, present[name])
			if !apply {
				continue
			}
			present[name] = true
			d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: op, Name: []byte(name), Value: value(h.GetHeader())})
		}
		for _, n := range ok.GetHeadersToRemove() {
			name := strings.ToLower(n)
			if strings.HasPrefix(name, ":") || name == "host" {
				cl.count(evIgnored) // Envoy ignores these too
				continue
			}
			d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderRemove, Name: []byte(name)})
		}
		for _, h := range ok.GetResponseHeadersToAdd() {
			if h.GetHeader() == nil {
				continue
			}
			op, err := responseAction(h)
			if err != nil {
				cl.count(evUnsupported)
				return err
			}
			d.ResponseHeaderOps = append(d.ResponseHeaderOps, protocol.HeaderOp{Op: op, Name: []byte(strings.ToLower(h.GetHeader().GetKey())), Value: value(h.GetHeader())})
		}
		return nil
	}
	if er := r.GetErrorResponse(); er != nil {
		cl.count(evErrorResponse)
		return fmt.Errorf("%w: error_response (status %s: %s)", authcall.ErrBadAnswer, code, clip(r.GetStatus().GetMessage()))
	}
	cl.count(evDenied)
	dr := r.GetDeniedResponse()
	d.Kind = protocol.DecisionBlock
	d.Status = 403
	if s := int(dr.GetStatus().GetCode()); s > 0 {
		d.Status = s
	}
	d.Body = []byte(dr.GetBody())
	// The local reply's headers, resolved here against the reply itself
	// (an empty header list to start with).
	for _, h := range dr.GetHeaders() {
		if h.GetHeader() == nil {
			continue
		}
		name := []byte(strings.ToLower(h.GetHeader().GetKey()))
		at := -1
		for i := range d.BlockHeaders {
			if bytes.Equal(d.BlockHeaders[i].Name, name) {
				at = i
				break
			}
		}
		v := value(h.GetHeader())
		op, apply := responseLocalAction(h, at >= 0)
		switch {
		case !apply:
		case op == protocol.HeaderAdd:
			d.BlockHeaders = append(d.BlockHeaders, protocol.Header{Name: name, Value: v})
		default: // set: the first replaced, the others dropped
			kept := d.BlockHeaders[:0]
			done := false
			for _, bh := range d.BlockHeaders {
				if bytes.Equal(bh.Name, name) {
					if done {
						continue
					}
					bh.Value, done = v, true
				}
				kept = append(kept, bh)
			}
			if !done {
				kept = append(kept, protocol.Header{Name: name, Value: v})
			}
			d.BlockHeaders = kept
		}
	}
	return nil
}

// presence is the set of the request's header names, lower-cased.
func presence(hs protocol.Headers) map[string]bool {
	out := make(map[string]bool, len(hs))
	for i := range hs {
		out[lowerName(hs[i].Name)] = true
	}
	return out
}

// requestAction is the operation of an upstream request header (see
// above); apply is false when a conditional action does not apply.
func requestAction(h *corev3.HeaderValueOption, exists bool) (op protocol.HeaderOpKind, apply bool) {
	if h.GetAppend() != nil {
		if h.GetAppend().GetValue() {
			return protocol.HeaderAdd, true
		}
		return protocol.HeaderSet, true
	}
	switch h.GetAppendAction() {
	case corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD:
		return protocol.HeaderAdd, true
	case corev3.HeaderValueOption_ADD_IF_ABSENT:
		return protocol.HeaderAdd, !exists
	case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
		return protocol.HeaderSet, exists
	}
	return protocol.HeaderSet, true // OVERWRITE_IF_EXISTS_OR_ADD, and Envoy's default for unknown ones
}

// responseAction is the operation of a header for the client's response.
func responseAction(h *corev3.HeaderValueOption) (protocol.HeaderOpKind, error) {
	if h.GetAppend() != nil {
		if h.GetAppend().GetValue() {
			return protocol.HeaderAdd, nil
		}
		return protocol.HeaderSet, nil
	}
	switch a := h.GetAppendAction(); a {
	case corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD:
		return protocol.HeaderAdd, nil
	case corev3.HeaderValueOption_ADD_IF_ABSENT, corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
		return 0, fmt.Errorf("%w: response_headers_to_add with append_action %s (the response's headers are not known when the request is checked)", authcall.ErrBadAnswer, a)
	}
	return protocol.HeaderSet, nil
}

// responseLocalAction is the operation of a denied response's header,
// decided against the headers of the reply so far.
func responseLocalAction(h *corev3.HeaderValueOption, exists bool) (protocol.HeaderOpKind, bool) {
	if h.GetAppend() != nil {
		if h.GetAppend().GetValue() {
			return protocol.HeaderAdd, true
		}
		return protocol.HeaderSet, true
	}
	return requestAction(h, exists)
}

// value is a header option's value: raw_value, else value (a copy).
func value(h *corev3.HeaderValue) []byte {
	if v := h.GetRawValue(); len(v) > 0 {
		return bytes.Clone(v)
	}
	return []byte(h.GetValue())
}

func clip(s string) string {
	if len(s) > 256 {
		return s[:256] + "…"
	}
	return s
}
