package extproc

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/zentinelproxy/sidecar/protocol"
)

// attrNamespace is the key Envoy files the attributes under.
const attrNamespace = "envoy.filters.http.ext_proc"

// pseudoHeader is a pseudo-header sent ahead of the headers.
type pseudoHeader struct {
	key   string
	value []byte
}

// headersMsg is a headers message and its parts, kept by a request for
// its two header messages: Send encodes a message before it returns, and
// these connections have no stats handler that could read it later, so
// one request's messages reuse the same memory (the event's buffers are
// aliased too, and the dataplane reuses them once the event is answered),
// and so does the next request given the same reqStream.
type headersMsg struct {
	pr   extprocsvc.ProcessingRequest
	rq   extprocsvc.ProcessingRequest_RequestHeaders
	rs   extprocsvc.ProcessingRequest_ResponseHeaders
	hh   extprocsvc.HttpHeaders
	hm   corev3.HeaderMap
	vals []corev3.HeaderValue
	ptrs []*corev3.HeaderValue
	pc   extprocsvc.ProtocolConfiguration
	// status holds the digits of :status.
	status [3]byte
	// names are the names of the last request (0) and response (1)
	// headers mapped here that were lower-case already, by position: the
	// next request's are mostly the same, in the same order, and a name
	// equal to the one kept is that string (no lookup in commonNames, no
	// allocation for an uncommon name).
	names [2][]string
}

// reset clears what the previous message set.
func (h *headersMsg) reset() *extprocsvc.ProcessingRequest {
	h.pr.Attributes, h.pr.MetadataContext, h.pr.ProtocolConfig = nil, nil, nil
	return &h.pr
}

// clear drops the references to a finished request's buffers (the
// memory and the names are kept).
func (h *headersMsg) clear() {
	h.pr.Request, h.pr.Attributes, h.pr.MetadataContext, h.pr.ProtocolConfig = nil, nil, nil, nil
	h.rq.RequestHeaders, h.rs.ResponseHeaders = nil, nil
	h.hh.Headers, h.hm.Headers = nil, nil
	for i := range h.vals {
		h.vals[i].RawValue = nil
	}
}

// headerMap maps the pseudo-headers and hs into h.hm: lower-cased names
// (hs's as sent by the dataplane, lower-case already), host left out when
// it is sent as :authority. dir picks the names kept (0 request, 1
// response).
func (h *headersMsg) headerMap(pseudo []pseudoHeader, hs protocol.Headers, skipHost bool, dir int) *corev3.HeaderMap {
	n := len(pseudo) + len(hs)
	if cap(h.vals) < n {
		h.vals = make([]corev3.HeaderValue, n)
		h.ptrs = make([]*corev3.HeaderValue, 0, n)
	}
	vals, out := h.vals[:n], h.ptrs[:0]
	for _, p := range pseudo {
		v := &vals[len(out)]
		v.Key, v.Value, v.RawValue = p.key, "", p.value
		out = append(out, v)
	}
	names := h.names[dir]
	if cap(names) < len(hs) {
		names = make([]string, len(hs))
	}
	names = names[:len(hs)]
	for i := range hs {
		name := names[i]
		if string(hs[i].Name) != name {
			name = lowerName(hs[i].Name)
			names[i] = ""
			if string(hs[i].Name) == name {
				names[i] = name // lower-case already: the same bytes map to it
			}
		}
		if skipHost && name == "host" {
			continue // it is :authority
		}
		v := &vals[len(out)]
		v.Key, v.Value, v.RawValue = name, "", hs[i].Value
		out = append(out, v)
	}
	h.names[dir] = names
	h.ptrs = out
	h.hm.Headers = out
	return &h.hm
}

// commonNames are the header names most requests and responses carry,
// lower-case, so that mapping them allocates no string (a map lookup by
// string(b) does not allocate).
var commonNames = func() map[string]string {
	m := map[string]string{}
	for _, n := range []string{
		"host", "user-agent", "accept", "accept-encoding", "accept-language", "accept-charset", "cookie",
		"authorization", "cache-control", "connection", "content-length", "content-type", "content-encoding",
		"content-language", "content-disposition", "content-range", "date", "etag", "expires", "if-match",
		"if-modified-since", "if-none-match", "if-range", "if-unmodified-since", "last-modified", "location",
		"origin", "pragma", "range", "referer", "server", "set-cookie", "te", "trailer", "transfer-encoding",
		"upgrade", "vary", "via", "x-request-id", "x-correlation-id", "x-forwarded-for", "x-forwarded-proto",
		"x-forwarded-host", "x-real-ip", "traceparent", "tracestate", "sec-fetch-site", "sec-fetch-mode",
		"sec-fetch-dest", "sec-ch-ua", "sec-ch-ua-mobile", "sec-ch-ua-platform", "upgrade-insecure-requests",
		"dnt", "age", "allow", "keep-alive", "strict-transport-security", "x-content-type-options",
		"x-frame-options", "access-control-allow-origin", "www-authenticate", "retry-after", "grpc-status",
		"x-sidecar-fail-open", "x-sidecar-inspection",
	} {
		m[n] = n
	}
	return m
}()

// lowerName is strings.ToLower(string(b)), without an allocation for a
// common lower-case name and with one for another ASCII name.
func lowerName(b []byte) string {
	if s, ok := commonNames[string(b)]; ok {
		return s
	}
	upper := false
	for _, c := range b {
		if c >= 0x80 {
			return strings.ToLower(string(b))
		}
		upper = upper || ('A' <= c && c <= 'Z')
	}
	if !upper {
		return string(b)
	}
	var sb strings.Builder
	sb.Grow(len(b))
	for _, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		sb.WriteByte(c)
	}
	return sb.String()
}

// common fills what every message carries: the metadata context (Envoy
// sets it on every message, Filter::addDynamicMetadata), the protocol
// configuration on the stream's first message (Filter::encodeProtocolConfig)
// and the attributes of direction dir with its first message
// (ProcessorState::sendAttributes).
func (st *reqStream) common(pr *extprocsvc.ProcessingRequest, dir int, rq *requestFacts, rs *protocol.ResponseHeaders) {
	c := st.l.c
	pr.MetadataContext = c.metadata
	if !st.sentFirst {
		st.sentFirst = true
		st.hdrs.pc.RequestBodyMode, st.hdrs.pc.ResponseBodyMode = st.mode.RequestBody, st.mode.ResponseBody
		pr.ProtocolConfig = &st.hdrs.pc
	}
	if st.attrsSent[dir] {
		return
	}
	st.attrsSent[dir] = true
	names := c.cfg.RequestAttrs
	if dir == 1 {
		names = c.cfg.ResponseAttrs
	}
	if len(names) > 0 {
		pr.Attributes = attributes(names, rq, rs)
	}
}

func (st *reqStream) requestHeaders(m *protocol.RequestHeaders) *extprocsvc.ProcessingRequest {
	pseudo := [...]pseudoHeader{{":method", m.Method}, {":path", m.URI}, {":authority", header(m.Headers, "host")}, {":scheme", scheme(m)}}
	h := &st.hdrs
	pr := h.reset()
	h.hh.Headers, h.hh.EndOfStream = h.headerMap(pseudo[:], m.Headers, true, 0), !m.HasBody
	h.rq.RequestHeaders = &h.hh
	pr.Request = &h.rq
	st.common(pr, 0, m, nil)
	return pr
}

func (st *reqStream) responseHeaders(m *protocol.ResponseHeaders) *extprocsvc.ProcessingRequest {
	h := &st.hdrs
	pseudo := [...]pseudoHeader{{":status", strconv.AppendInt(h.status[:0], int64(m.StatusCode), 10)}}
	pr := h.reset()
	h.hh.Headers, h.hh.EndOfStream = h.headerMap(pseudo[:], m.Headers, false, 1), !m.HasBody
	h.rs.ResponseHeaders = &h.hh
	pr.Request = &h.rs
	st.common(pr, 1, st.facts, m)
	return pr
}

func (st *reqStream) bodyRequest(p protocol.Phase, data []byte, last bool) *extprocsvc.ProcessingRequest {
	b := &extprocsvc.HttpBody{Body: data, EndOfStream: last} // aliased, as the headers
	pr := &extprocsvc.ProcessingRequest{}
	dir := 0
	if p == protocol.PhaseResponse {
		pr.Request = &extprocsvc.ProcessingRequest_ResponseBody{ResponseBody: b}
		dir = 1
	} else {
		pr.Request = &extprocsvc.ProcessingRequest_RequestBody{RequestBody: b}
	}
	// The attributes of a direction whose headers were not sent go with
	// its first body message, from the facts kept of the skipped event.
	st.common(pr, dir, st.facts, st.resp)
	return pr
}

// responseKind names what a ProcessingResponse answers.
func responseKind(r *extprocsvc.ProcessingResponse) string {
	switch r.GetResponse().(type) {
	case *extprocsvc.ProcessingResponse_RequestHeaders:
		return "request_headers"
	case *extprocsvc.ProcessingResponse_ResponseHeaders:
		return "response_headers"
	case *extprocsvc.ProcessingResponse_RequestBody:
		return "request_body"
	case *extprocsvc.ProcessingResponse_ResponseBody:
		return "response_body"
	case *extprocsvc.ProcessingResponse_RequestTrailers:
		return "request_trailers"
	case *extprocsvc.ProcessingResponse_ResponseTrailers:
		return "response_trailers"
	case *extprocsvc.ProcessingResponse_ImmediateResponse:
		return "immediate_response"
	case *extprocsvc.ProcessingResponse_StreamedImmediateResponse:
		return "streamed_immediate_response"
	}
	return "empty response"
}

// mapResponse maps the processor's answer to the event that waits for
// kind want into the fill of a protocol.Decision. The Decision then goes
// through agentmux (Decision.Normalize) and the dataplane's rules like
// any agent's. Called with st.mu held.
func (st *reqStream) mapResponse(want kind, r *extprocsvc.ProcessingResponse) (func(*protocol.Decision), error) {
	c := st.l.c
	st.ignored(r)
	if ir := r.GetImmediateResponse(); ir != nil {
		c.count(evImmediate)
		return immediate(ir), nil
	}
	var got kind
	var common *extprocsvc.CommonResponse
	switch x := r.GetResponse().(type) {
	case *extprocsvc.ProcessingResponse_RequestHeaders:
		got, common = kindRequestHeaders, x.RequestHeaders.GetResponse()
	case *extprocsvc.ProcessingResponse_ResponseHeaders:
		got, common = kindResponseHeaders, x.ResponseHeaders.GetResponse()
	case *extprocsvc.ProcessingResponse_RequestBody:
		got, common = kindRequestBody, x.RequestBody.GetResponse()
	case *extprocsvc.ProcessingResponse_ResponseBody:
		got, common = kindResponseBody, x.ResponseBody.GetResponse()
	case *extprocsvc.ProcessingResponse_StreamedImmediateResponse:
		c.count(evUnsupported)
		return nil, fmt.Errorf("%w: streamed_immediate_response", ErrUnsupported)
	}
	if got != want {
		return nil, fmt.Errorf("%w: %s in answer to %s", ErrWrongPhase, responseKind(r), want)
	}
	if common.GetStatus() == extprocsvc.CommonResponse_CONTINUE_AND_REPLACE {
		c.count(evUnsupported)
		return nil, fmt.Errorf("%w: CONTINUE_AND_REPLACE", ErrUnsupported)
	}
	if common.GetClearRouteCache() {
		c.count(evClearRouteCache)
	}
	if common.GetTrailers() != nil {
		c.count(evIgnored)
	}
	dir := 0
	if want == kindResponseHeaders || want == kindResponseBody {
		dir = 1
	}
	ops := headerOps(common.GetHeaderMutation())
	if want == kindRequestHeaders || want == kindResponseHeaders {
		if common.GetBodyMutation() != nil {
			c.count(evIgnored) // only meaningful with CONTINUE_AND_REPLACE
		}
		if mo := r.GetModeOverride(); mo != nil {
			st.override(mo)
		}
		if len(ops) == 0 {
			return allowFinal, nil // a plain CONTINUE: nothing to capture
		}
		return func(d *protocol.Decision) {
			d.Kind = protocol.DecisionAllow
			if dir == 0 {
				d.RequestHeaderOps = append(d.RequestHeaderOps, ops...)
			} else {
				d.ResponseHeaderOps = append(d.ResponseHeaderOps, ops...)
			}
		}, nil
	}
	if r.GetModeOverride() != nil {
		c.count(evOverrideRefused) // Envoy ignores it outside header responses
	}
	phase := protocol.PhaseRequest
	if dir == 1 {
		phase = protocol.PhaseResponse
	}
	action, data := protocol.MutationPass, []byte(nil)
	if st.isHeld {
		action, data = protocol.MutationReplace, st.held
	}
	switch m := common.GetBodyMutation().GetMutation().(type) {
	case *extprocsvc.BodyMutation_Body:
		action, data = protocol.MutationReplace, m.Body
	case *extprocsvc.BodyMutation_ClearBody:
		if m.ClearBody {
			action, data = protocol.MutationDrop, nil
		}
	case *extprocsvc.BodyMutation_StreamedResponse:
		action, data = protocol.MutationReplace, m.StreamedResponse.GetBody()
	}
	if rest := st.rest; len(rest) > 0 {
		// The part of a BUFFERED_PARTIAL body the processor did not get
		// follows its answer unchanged.
		if action == protocol.MutationDrop {
			data = nil
		}
		if action == protocol.MutationPass {
			data = st.held
		}
		action, data = protocol.MutationReplace, append(bytes.Clone(data), rest...)
	}
	if action == protocol.MutationReplace && len(data) == 0 {
		action, data = protocol.MutationDrop, nil
	}
	idx, last, partial := st.chunk, st.last, st.partial
	st.held, st.rest, st.isHeld = nil, nil, false
	return func(d *protocol.Decision) {
		d.Kind = protocol.DecisionAllow
		// Every chunk of a STREAMED body goes to the processor; a
		// BUFFERED_PARTIAL body's rest passes without it.
		d.NeedsMore = !last && !partial
		if dir == 0 {
			d.RequestHeaderOps = append(d.RequestHeaderOps, ops...)
		} else {
			d.ResponseHeaderOps = append(d.ResponseHeaderOps, ops...)
		}
		if action != protocol.MutationPass {
			setMutation(d, phase, idx, action, data)
		}
	}, nil
}

// ignored counts the response fields that have no equivalent here.
func (st *reqStream) ignored(r *extprocsvc.ProcessingResponse) {
	c := st.l.c
	if r.GetDynamicMetadata() != nil || len(r.GetTypedDynamicMetadata()) > 0 {
		c.count(evIgnored)
	}
	if r.GetOverrideMessageTimeout() != nil {
		c.count(evIgnored)
	}
}

// override applies a mode_override if the configuration allows it.
func (st *reqStream) override(p *extprocfilter.ProcessingMode) {
	c := st.l.c
	cfg := &c.cfg
	m := ModeFromProto(p)
	ok := cfg.overridable()
	if ok && len(cfg.AllowedOverrides) > 0 {
		ok = false
		for _, a := range cfg.AllowedOverrides {
			if a.sameOverride(m) {
				ok = true
				break
			}
		}
	}
	if ok && m.check() != nil {
		ok = false
	}
	if !ok {
		c.count(evOverrideRefused)
		return
	}
	m.RequestHeader = st.mode.RequestHeader // never overridable
	st.mode = m
	c.count(evOverride)
}

// headerOps maps a HeaderMutation onto header operations: removals
// first, then the set_headers in order, as Envoy applies them
// (MutationUtils::applyHeaderMutations).
func headerOps(hm *extprocsvc.HeaderMutation) []protocol.HeaderOp {
	if hm == nil {
		return nil
	}
	ops := make([]protocol.HeaderOp, 0, len(hm.GetRemoveHeaders())+len(hm.GetSetHeaders()))
	for _, n := range hm.GetRemoveHeaders() {
		ops = append(ops, protocol.HeaderOp{Op: protocol.HeaderRemove, Name: []byte(mutationName(n))})
	}
	for _, h := range hm.GetSetHeaders() {
		if h.GetHeader() == nil {
			continue // Envoy skips an option without a header
		}
		op, name, value := setOp(h)
		ops = append(ops, protocol.HeaderOp{Op: op, Name: name, Value: value})
	}
	return ops
}

// mutationName lower-cases a name and maps :authority to host (the other
// pseudo-headers are left for the dataplane's rules to refuse).
func mutationName(n string) string {
	n = strings.ToLower(n)
	if n == ":authority" {
		return "host"
	}
	return n
}

// setOp maps one HeaderValueOption as Envoy's ext_proc does
// (MutationUtils::applyHeaderMutations): only the deprecated append
// decides, read with PROTOBUF_GET_WRAPPED_OR_DEFAULT(sh, append, false),
// so an option without it overwrites; append_action is not read at all
// (envoyproxy/envoy#36982), nor is keep_empty_value: an empty value is
// set empty. The value is raw_value, else value.
func setOp(h *corev3.HeaderValueOption) (op protocol.HeaderOpKind, name, value []byte) {
	op = protocol.HeaderSet
	if h.GetAppend().GetValue() {
		op = protocol.HeaderAdd
	}
	return op, []byte(mutationName(h.GetHeader().GetKey())), headerValue(h.GetHeader())
}

// headerValue is a mutation's value: raw_value, else value (a copy).
func headerValue(h *corev3.HeaderValue) []byte {
	if v := h.GetRawValue(); len(v) > 0 {
		return bytes.Clone(v)
	}
	return []byte(h.GetValue())
}

// immediate maps an ImmediateResponse onto a block.
func immediate(ir *extprocsvc.ImmediateResponse) func(*protocol.Decision) {
	status := int(ir.GetStatus().GetCode())
	if status == 0 {
		status = 200 // Envoy's default when the processor sets none
	}
	var hs protocol.Headers
	// Envoy applies them with the same MutationUtils::applyHeaderMutations
	// as a header mutation (Filter::sendImmediateResponse): an empty value
	// is set too.
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if h.GetHeader() == nil {
			continue
		}
		hs = append(hs, protocol.Header{Name: []byte(mutationName(h.GetHeader().GetKey())), Value: headerValue(h.GetHeader())})
	}
	if g := ir.GetGrpcStatus(); g != nil {
		hs = append(hs, protocol.Header{Name: []byte("grpc-status"), Value: []byte(strconv.FormatUint(uint64(g.GetStatus()), 10))})
	}
	body := bytes.Clone(ir.GetBody())
	return func(d *protocol.Decision) {
		d.Kind = protocol.DecisionBlock
		d.Status = status
		d.Body = body
		d.BlockHeaders = append(d.BlockHeaders, hs...)
	}
}
