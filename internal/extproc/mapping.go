package extproc

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/zentinelproxy/sidecar/protocol"
)

// attrNamespace is the key Envoy files the attributes under.
const attrNamespace = "envoy.filters.http.ext_proc"

// setNames records the lower-cased header names of direction dir (0
// request, 1 response) as they are sent to the processor.
func (st *reqStream) setNames(dir int, names []string) {
	n := make(map[string]bool, len(names))
	for _, k := range names {
		n[k] = true
	}
	st.mu.Lock()
	st.names[dir] = n
	st.mu.Unlock()
}

// pseudoHeader is a pseudo-header sent ahead of the headers.
type pseudoHeader struct {
	key   string
	value []byte
}

// schemeHTTP is the :scheme sent (read only).
var schemeHTTP = []byte("http")

// headerMap maps the pseudo-headers and hs to a HeaderMap; it also returns
// the lower-cased names of hs (all of them, host included). The values
// are aliased and the HeaderValues share one backing array: Send encodes
// the message before it returns and these connections have no stats
// handler that could read it later, so the event's buffers may be reused
// afterwards.
func headerMap(pseudo []pseudoHeader, hs protocol.Headers, skipHost bool) (*corev3.HeaderMap, []string) {
	vals := make([]corev3.HeaderValue, len(pseudo)+len(hs))
	out := make([]*corev3.HeaderValue, 0, len(vals))
	names := make([]string, len(hs))
	for _, p := range pseudo {
		v := &vals[len(out)]
		v.Key, v.RawValue = p.key, p.value
		out = append(out, v)
	}
	for i := range hs {
		name := lowerName(hs[i].Name)
		names[i] = name
		if skipHost && name == "host" {
			continue // it is :authority
		}
		v := &vals[len(out)]
		v.Key, v.RawValue = name, hs[i].Value
		out = append(out, v)
	}
	return &corev3.HeaderMap{Headers: out}, names
}

// lowerName is strings.ToLower(string(b)) with one allocation for an
// ASCII name.
func lowerName(b []byte) string {
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

// first fills what the request's first message carries: the protocol
// configuration and the metadata context.
func (st *reqStream) first(pr *extprocsvc.ProcessingRequest) {
	if st.sentFirst {
		return
	}
	st.sentFirst = true
	cfg := &st.l.c.cfg
	pr.ProtocolConfig = &extprocsvc.ProtocolConfiguration{
		RequestBodyMode:  st.mode.RequestBody,
		ResponseBodyMode: st.mode.ResponseBody,
	}
	if len(cfg.Metadata) > 0 {
		md := &corev3.Metadata{FilterMetadata: make(map[string]*structpb.Struct, len(cfg.Metadata))}
		for ns, kv := range cfg.Metadata {
			s := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(kv))}
			for k, v := range kv {
				s.Fields[k] = structpb.NewStringValue(v)
			}
			md.FilterMetadata[ns] = s
		}
		pr.MetadataContext = md
	}
}

// requestAttrs are the request attributes the request's metadata gives.
// They go with the request's first message (Envoy sends them with the
// request headers, or the first request message when those are skipped).
func (st *reqStream) requestAttrs(pr *extprocsvc.ProcessingRequest, m *protocol.RequestHeaders) {
	names := st.l.c.cfg.RequestAttrs
	if len(names) == 0 || m == nil {
		return
	}
	f := make(map[string]*structpb.Value, len(names))
	path, query, _ := strings.Cut(string(m.URI), "?")
	for _, a := range names {
		switch a {
		case "request.path":
			f[a] = structpb.NewStringValue(string(m.URI))
		case "request.url_path":
			f[a] = structpb.NewStringValue(path)
		case "request.query":
			f[a] = structpb.NewStringValue(query)
		case "request.host":
			f[a] = structpb.NewStringValue(string(header(m.Headers, "host")))
		case "request.scheme":
			f[a] = structpb.NewStringValue("http")
		case "request.method":
			f[a] = structpb.NewStringValue(string(m.Method))
		case "request.headers":
			f[a] = headersValue(m.Headers)
		case "request.referer":
			f[a] = structpb.NewStringValue(string(header(m.Headers, "referer")))
		case "request.useragent":
			f[a] = structpb.NewStringValue(string(header(m.Headers, "user-agent")))
		case "request.time":
			f[a] = structpb.NewStringValue(string(m.Metadata.Timestamp))
		case "request.id":
			f[a] = structpb.NewStringValue(string(m.Metadata.CorrelationID))
		case "request.protocol":
			f[a] = structpb.NewStringValue(string(m.Metadata.Protocol))
		case "source.address":
			f[a] = structpb.NewStringValue(string(m.Metadata.ClientIP))
		case "source.port":
			f[a] = structpb.NewNumberValue(float64(m.Metadata.ClientPort))
		case "xds.route_name":
			f[a] = structpb.NewStringValue(string(m.Metadata.RouteID))
		case "xds.cluster_name":
			f[a] = structpb.NewStringValue(string(m.Metadata.UpstreamID))
		}
	}
	pr.Attributes = map[string]*structpb.Struct{attrNamespace: {Fields: f}}
}

func header(hs protocol.Headers, name string) []byte {
	for i := range hs {
		if strings.EqualFold(string(hs[i].Name), name) {
			return hs[i].Value
		}
	}
	return nil
}

func headersValue(hs protocol.Headers) *structpb.Value {
	s := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(hs))}
	for i := range hs {
		k := strings.ToLower(string(hs[i].Name))
		if old, ok := s.Fields[k]; ok {
			s.Fields[k] = structpb.NewStringValue(old.GetStringValue() + "," + string(hs[i].Value))
			continue
		}
		s.Fields[k] = structpb.NewStringValue(string(hs[i].Value))
	}
	return structpb.NewStructValue(s)
}

func (st *reqStream) requestHeaders(m *protocol.RequestHeaders) *extprocsvc.ProcessingRequest {
	pseudo := [...]pseudoHeader{{":method", m.Method}, {":path", m.URI}, {":authority", header(m.Headers, "host")}, {":scheme", schemeHTTP}}
	hm, names := headerMap(pseudo[:], m.Headers, true)
	st.setNames(0, names)
	pr := &extprocsvc.ProcessingRequest{Request: &extprocsvc.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocsvc.HttpHeaders{Headers: hm, EndOfStream: !m.HasBody},
	}}
	st.first(pr)
	st.requestAttrs(pr, m)
	return pr
}

func (st *reqStream) responseHeaders(m *protocol.ResponseHeaders) *extprocsvc.ProcessingRequest {
	pseudo := [...]pseudoHeader{{":status", strconv.AppendInt(nil, int64(m.StatusCode), 10)}}
	hm, names := headerMap(pseudo[:], m.Headers, false)
	st.setNames(1, names)
	pr := &extprocsvc.ProcessingRequest{Request: &extprocsvc.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocsvc.HttpHeaders{Headers: hm, EndOfStream: !m.HasBody},
	}}
	st.first(pr)
	if names := st.l.c.cfg.ResponseAttrs; len(names) > 0 {
		f := make(map[string]*structpb.Value, len(names))
		for _, a := range names {
			switch a {
			case "response.code":
				f[a] = structpb.NewNumberValue(float64(m.StatusCode))
			case "response.headers":
				f[a] = headersValue(m.Headers)
			}
		}
		pr.Attributes = map[string]*structpb.Struct{attrNamespace: {Fields: f}}
	}
	return pr
}

func (st *reqStream) bodyRequest(p protocol.Phase, data []byte, last bool) *extprocsvc.ProcessingRequest {
	b := &extprocsvc.HttpBody{Body: data, EndOfStream: last} // aliased, as the headers
	pr := &extprocsvc.ProcessingRequest{}
	if p == protocol.PhaseResponse {
		pr.Request = &extprocsvc.ProcessingRequest_ResponseBody{ResponseBody: b}
	} else {
		pr.Request = &extprocsvc.ProcessingRequest_RequestBody{RequestBody: b}
	}
	st.first(pr)
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
	ops := st.headerOps(dir, common.GetHeaderMutation())
	if want == kindRequestHeaders || want == kindResponseHeaders {
		if common.GetBodyMutation() != nil {
			c.count(evIgnored) // only meaningful with CONTINUE_AND_REPLACE
		}
		if mo := r.GetModeOverride(); mo != nil {
			st.override(mo)
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

// headerOps maps a HeaderMutation onto header operations of direction
// dir: removals first, then the set_headers in order, as Envoy applies
// them. The conditional append actions are resolved against the names
// the processor was shown.
func (st *reqStream) headerOps(dir int, hm *extprocsvc.HeaderMutation) []protocol.HeaderOp {
	if hm == nil {
		return nil
	}
	names := st.names[dir]
	if names == nil {
		names = map[string]bool{}
		st.names[dir] = names
	}
	ops := make([]protocol.HeaderOp, 0, len(hm.GetRemoveHeaders())+len(hm.GetSetHeaders()))
	for _, n := range hm.GetRemoveHeaders() {
		n = mutationName(n)
		ops = append(ops, protocol.HeaderOp{Op: protocol.HeaderRemove, Name: []byte(n)})
		delete(names, n)
	}
	for _, h := range hm.GetSetHeaders() {
		op, name, value, ok := setOp(h, names)
		if !ok {
			continue
		}
		ops = append(ops, protocol.HeaderOp{Op: op, Name: name, Value: value})
		names[string(name)] = true
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

// setOp maps one HeaderValueOption; ok is false when it does nothing.
func setOp(h *corev3.HeaderValueOption, present map[string]bool) (op protocol.HeaderOpKind, name, value []byte, ok bool) {
	n := mutationName(h.GetHeader().GetKey())
	v := h.GetHeader().GetRawValue()
	if len(v) == 0 {
		v = []byte(h.GetHeader().GetValue())
	}
	if len(v) == 0 && !h.GetKeepEmptyValue() {
		return 0, nil, nil, false // Envoy drops a header without a value
	}
	action := h.GetAppendAction()
	if a := h.GetAppend(); a != nil {
		// The deprecated flag, when set, decides.
		action = corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
		if a.GetValue() {
			action = corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD
		}
	}
	switch action {
	case corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD:
		op = protocol.HeaderAdd
	case corev3.HeaderValueOption_ADD_IF_ABSENT:
		if present[n] {
			return 0, nil, nil, false
		}
		op = protocol.HeaderAdd
	case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD:
		op = protocol.HeaderSet
	case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
		if !present[n] {
			return 0, nil, nil, false
		}
		op = protocol.HeaderSet
	default:
		return 0, nil, nil, false
	}
	return op, []byte(n), bytes.Clone(v), true
}

// immediate maps an ImmediateResponse onto a block.
func immediate(ir *extprocsvc.ImmediateResponse) func(*protocol.Decision) {
	status := int(ir.GetStatus().GetCode())
	if status == 0 {
		status = 200 // Envoy's default when the processor sets none
	}
	var hs protocol.Headers
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		v := h.GetHeader().GetRawValue()
		if len(v) == 0 {
			v = []byte(h.GetHeader().GetValue())
		}
		if len(v) == 0 && !h.GetKeepEmptyValue() {
			continue
		}
		hs = append(hs, protocol.Header{Name: []byte(mutationName(h.GetHeader().GetKey())), Value: bytes.Clone(v)})
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
