package extproc

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/zentinelproxy/sidecar/protocol"
)

// Attributes follow Envoy's (source/extensions/filters/common/expr/
// context.cc): the same names, the same meaning, and the types Envoy's
// ext_proc sends them as (ExpressionManager::evaluateAttributes: booleans
// as bool_value, integers as number_value, everything else as its printed
// string), with one difference: request.headers, response.headers and
// response.trailers are sent as a struct of the lower-cased header names
// (Envoy prints a map as the useless string "map value"). An attribute
// Envoy would leave out for want of a value (request.referer without a
// Referer header, the TLS facts of a plain-text connection) is left out
// here too.
//
// request_attributes go with the first message of the request direction
// and response_attributes with the first of the response direction
// (Envoy's ProcessorState::sendAttributes); the request attributes are
// known on the response phase as well, the response ones only there.

// attrPhase is the phase an attribute list is sent on.
type attrPhase uint8

const (
	attrRequest attrPhase = iota
	attrResponse
)

// Attributes the transport can fill on each phase (Envoy's names).
var (
	RequestAttributes = []string{
		"request.path", "request.url_path", "request.host", "request.scheme", "request.method",
		"request.headers", "request.referer", "request.useragent", "request.time", "request.id",
		"request.protocol", "request.query", "request.size", "request.total_size",
		"source.address", "source.port", "destination.address", "destination.port",
		"connection.mtls", "connection.requested_server_name", "connection.tls_version",
		"connection.subject_peer_certificate", "connection.dns_san_peer_certificate",
		"connection.uri_san_peer_certificate",
		"xds.route_name", "xds.cluster_name",
	}
	// ResponseAttributes are the request attributes and those of the
	// response.
	ResponseAttributes = append(slices.Clone(RequestAttributes),
		"response.code", "response.code_details", "response.flags", "response.grpc_status",
		"response.headers", "response.trailers", "response.size", "response.total_size",
	)
)

// refusedAttributes are Envoy attributes check-config refuses, with why:
// they cannot have a value when a processor is called, the proxy has no
// such thing, or it does not give agents the fact.
var refusedAttributes = map[string]string{
	"request.duration":                          "the request's duration is only known once it has ended, after every processor call",
	"response.backend_latency":                  "the upstream latency is only known once the whole response has arrived",
	"connection.termination_details":            "the connection is still open while a processor is called",
	"connection.transport_failure_reason":       "a request only exists on a connection whose TLS handshake succeeded",
	"connection.id":                             "the proxy does not give agents a connection id",
	"connection.subject_local_certificate":      "the proxy does not give agents its own certificate",
	"connection.uri_san_local_certificate":      "the proxy does not give agents its own certificate",
	"connection.dns_san_local_certificate":      "the proxy does not give agents its own certificate",
	"connection.sha256_peer_certificate_digest": "the proxy does not give agents the client certificate's digest",
	"upstream.address":                          "the proxy does not give agents the upstream endpoint",
	"upstream.port":                             "the proxy does not give agents the upstream endpoint",
	"upstream.tls_version":                      "the proxy does not give agents the upstream connection's TLS facts",
	"upstream.subject_local_certificate":        "the proxy does not give agents the upstream connection's TLS facts",
	"upstream.subject_peer_certificate":         "the proxy does not give agents the upstream connection's TLS facts",
	"upstream.dns_san_local_certificate":        "the proxy does not give agents the upstream connection's TLS facts",
	"upstream.dns_san_peer_certificate":         "the proxy does not give agents the upstream connection's TLS facts",
	"upstream.uri_san_local_certificate":        "the proxy does not give agents the upstream connection's TLS facts",
	"upstream.uri_san_peer_certificate":         "the proxy does not give agents the upstream connection's TLS facts",
	"upstream.sha256_peer_certificate_digest":   "the proxy does not give agents the upstream connection's TLS facts",
	"upstream.local_address":                    "the proxy does not give agents the upstream endpoint",
	"upstream.transport_failure_reason":         "the proxy does not give agents the upstream connection's facts",
	"upstream.request_attempt_count":            "the proxy does not give agents the upstream attempts",
	"upstream.locality":                         "upstreams have no locality here",
	"upstream.cx_pool_ready_duration":           "the proxy does not give agents the upstream pool's timing",
	"xds.node":                                  "the proxy has no xDS node",
	"xds.cluster_metadata":                      "upstreams have no metadata here",
	"xds.route_metadata":                        "routes have no metadata here",
	"xds.virtual_host_name":                     "the proxy has no virtual hosts",
	"xds.virtual_host_metadata":                 "the proxy has no virtual hosts",
	"xds.upstream_host_metadata":                "upstream endpoints have no metadata here",
	"xds.filter_chain_name":                     "the proxy has no filter chains and does not give agents the listener's name",
	"xds.listener_metadata":                     "listeners have no metadata here",
	"xds.listener_direction":                    "listeners have no traffic direction here",
}

// checkAttr reports why attribute a cannot be sent on phase p (nil: it
// can).
func checkAttr(a string, p attrPhase) error {
	known := RequestAttributes
	if p == attrResponse {
		known = ResponseAttributes
	}
	if slices.Contains(known, a) {
		return nil
	}
	if why, ok := refusedAttributes[a]; ok {
		return fmt.Errorf("attribute %q is not supported: %s", a, why)
	}
	if p == attrRequest && slices.Contains(ResponseAttributes, a) {
		return fmt.Errorf("attribute %q is not supported in request_attributes: there is no response when they are sent (use response_attributes)", a)
	}
	return fmt.Errorf("attribute %q is unknown (supported: %s)", a, strings.Join(known, ", "))
}

// needsRequestFacts reports whether response attributes names read the
// request (anything but response.*).
func needsRequestFacts(names []string) bool {
	for _, a := range names {
		if !strings.HasPrefix(a, "response.") {
			return true
		}
	}
	return false
}

// requestFacts is what the request attributes are computed from: the
// request headers event itself, or the copy a request keeps of it for a
// later phase.
type requestFacts = protocol.RequestHeaders

// cloneFacts copies what the attributes read of m (its buffers belong to
// the dataplane and are reused once the event is answered).
func cloneFacts(m *protocol.RequestHeaders) *requestFacts {
	n := len(m.Method) + len(m.URI)
	for i := range m.Headers {
		n += len(m.Headers[i].Name) + len(m.Headers[i].Value)
	}
	md := &m.Metadata
	n += len(md.CorrelationID) + len(md.ClientIP) + len(md.Protocol) + len(md.RouteID) + len(md.UpstreamID) +
		len(md.Timestamp) + len(md.TLSVersion) + len(md.TLSServerName) + len(md.TLSClientSubject) + len(md.TLSClientSAN) +
		len(md.ServerIP)
	buf := make([]byte, 0, n)
	cp := func(b []byte) []byte {
		if b == nil {
			return nil
		}
		start := len(buf)
		buf = append(buf, b...)
		return buf[start:len(buf):len(buf)]
	}
	f := &requestFacts{Method: cp(m.Method), URI: cp(m.URI), HasBody: m.HasBody, Headers: make(protocol.Headers, len(m.Headers))}
	for i := range m.Headers {
		f.Headers[i] = protocol.Header{Name: cp(m.Headers[i].Name), Value: cp(m.Headers[i].Value)}
	}
	f.Metadata = protocol.Metadata{
		CorrelationID: cp(md.CorrelationID), ClientIP: cp(md.ClientIP), ClientPort: md.ClientPort,
		Protocol: cp(md.Protocol), RouteID: cp(md.RouteID), UpstreamID: cp(md.UpstreamID), Timestamp: cp(md.Timestamp),
		TLSVersion: cp(md.TLSVersion), TLSServerName: cp(md.TLSServerName),
		TLSClientSubject: cp(md.TLSClientSubject), TLSClientSAN: cp(md.TLSClientSAN),
		ServerIP: cp(md.ServerIP), ServerPort: md.ServerPort,
	}
	return f
}

// cloneResponse copies a response headers event (for attributes sent with
// a response body message).
func cloneResponse(m *protocol.ResponseHeaders) *protocol.ResponseHeaders {
	c := &protocol.ResponseHeaders{StatusCode: m.StatusCode, HasBody: m.HasBody, Headers: make(protocol.Headers, len(m.Headers))}
	for i := range m.Headers {
		c.Headers[i] = protocol.Header{Name: bytes.Clone(m.Headers[i].Name), Value: bytes.Clone(m.Headers[i].Value)}
	}
	return c
}

// scheme is the request's scheme: https on a TLS connection.
func scheme(m *requestFacts) []byte {
	if m != nil && len(m.Metadata.TLSVersion) > 0 {
		return schemeHTTPS
	}
	return schemeHTTP
}

var (
	schemeHTTP  = []byte("http")
	schemeHTTPS = []byte("https")
)

// attributes evaluates names for a message of phase p; rq is nil when the
// request's facts are unknown (never for a configured list: the link keeps
// them), rs is the response (nil on the request phase).
func attributes(names []string, rq *requestFacts, rs *protocol.ResponseHeaders) map[string]*structpb.Struct {
	f := make(map[string]*structpb.Value, len(names))
	for _, a := range names {
		if v := attribute(a, rq, rs); v != nil {
			f[a] = v
		}
	}
	return map[string]*structpb.Struct{attrNamespace: {Fields: f}}
}

func str(b []byte) *structpb.Value { return structpb.NewStringValue(string(b)) }

// strIf is str(b), or nil (left out) when b is empty.
func strIf(b []byte) *structpb.Value {
	if len(b) == 0 {
		return nil
	}
	return str(b)
}

func num[T int | int64 | uint64](n T) *structpb.Value { return structpb.NewNumberValue(float64(n)) }

// attribute is one attribute's value, nil when it has none.
func attribute(a string, rq *requestFacts, rs *protocol.ResponseHeaders) *structpb.Value {
	if strings.HasPrefix(a, "response.") {
		if rs == nil {
			return nil
		}
		return responseAttribute(a, rs)
	}
	if rq == nil {
		return nil
	}
	md := &rq.Metadata
	tls := len(md.TLSVersion) > 0
	switch a {
	case "request.path":
		return str(rq.URI)
	case "request.url_path":
		path, _, _ := bytes.Cut(rq.URI, []byte("?"))
		return str(path)
	case "request.query":
		_, q, _ := bytes.Cut(rq.URI, []byte("?"))
		q, _, _ = bytes.Cut(q, []byte("#"))
		return str(q)
	case "request.host":
		return strIf(header(rq.Headers, "host"))
	case "request.scheme":
		return str(scheme(rq))
	case "request.method":
		return str(rq.Method)
	case "request.headers":
		return headersValue(rq.Headers)
	case "request.referer":
		return strIf(header(rq.Headers, "referer"))
	case "request.useragent":
		return strIf(header(rq.Headers, "user-agent"))
	case "request.time":
		return envoyTime(md.Timestamp)
	case "request.id":
		return strIf(md.CorrelationID)
	case "request.protocol":
		return strIf(md.Protocol)
	case "request.size":
		// Content-Length when there is one (an invalid one: no value);
		// else the body bytes received when the request headers are
		// processed, none.
		if cl := header(rq.Headers, "content-length"); cl != nil {
			n, err := strconv.ParseInt(string(cl), 10, 64)
			if err != nil || n < 0 {
				return nil
			}
			return num(n)
		}
		return num(0)
	case "request.total_size":
		// Envoy: bytes received plus the header map's byteSize (names and
		// values, pseudo-headers included), when the headers are
		// processed.
		n := len(":method") + len(rq.Method) + len(":path") + len(rq.URI) + len(":scheme") + len(scheme(rq))
		for i := range rq.Headers {
			n += len(rq.Headers[i].Name) + len(rq.Headers[i].Value)
		}
		return num(n)
	case "source.address":
		// Envoy's downstream remote address, ip:port.
		return hostPort(md.ClientIP, md.ClientPort)
	case "source.port":
		if md.ClientPort == 0 {
			return nil
		}
		return num(md.ClientPort)
	case "destination.address":
		// Envoy's downstream local address: the listener's side of the
		// client's connection (metadata server_ip, server_port).
		return hostPort(md.ServerIP, md.ServerPort)
	case "destination.port":
		if md.ServerPort == 0 {
			return nil
		}
		return num(md.ServerPort)
	case "connection.mtls":
		return structpb.NewBoolValue(tls && len(md.TLSClientSubject) > 0)
	case "connection.requested_server_name":
		return str(md.TLSServerName)
	case "connection.tls_version":
		if !tls {
			return nil
		}
		// Envoy's TLS library names them TLSv1.2 and TLSv1.3.
		v := md.TLSVersion
		if bytes.HasPrefix(v, []byte("TLS1")) {
			return structpb.NewStringValue("TLSv1" + string(v[4:]))
		}
		return str(v)
	case "connection.subject_peer_certificate":
		if !tls {
			return nil
		}
		return str(md.TLSClientSubject)
	case "connection.dns_san_peer_certificate":
		return firstSAN(md.TLSClientSAN, "DNS:")
	case "connection.uri_san_peer_certificate":
		return firstSAN(md.TLSClientSAN, "URI:")
	case "xds.route_name":
		return strIf(md.RouteID)
	case "xds.cluster_name":
		return strIf(md.UpstreamID)
	}
	return nil
}

// hostPort is Envoy's print of an address, ip:port ([v6]:port; the IP
// alone without a port), nil without an IP.
func hostPort(ip []byte, port int) *structpb.Value {
	if len(ip) == 0 {
		return nil
	}
	s := string(ip)
	if port == 0 {
		return structpb.NewStringValue(s)
	}
	if strings.Contains(s, ":") {
		s = "[" + s + "]"
	}
	return structpb.NewStringValue(s + ":" + strconv.Itoa(port))
}

func responseAttribute(a string, rs *protocol.ResponseHeaders) *structpb.Value {
	switch a {
	case "response.code":
		return num(rs.StatusCode)
	case "response.code_details":
		// The processor is shown upstream responses only, which Envoy's
		// router marks via_upstream.
		return structpb.NewStringValue("via_upstream")
	case "response.flags":
		// None of Envoy's response flags applies to an upstream response
		// whose headers arrived.
		return num(0)
	case "response.grpc_status":
		return grpcStatus(rs)
	case "response.headers":
		return headersValue(rs.Headers)
	case "response.trailers":
		// Trailers follow the body: none are known yet.
		return structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{}})
	case "response.size":
		// Body bytes sent to the client so far: none.
		return num(0)
	case "response.total_size":
		n := len(":status") + len(strconv.Itoa(rs.StatusCode))
		for i := range rs.Headers {
			n += len(rs.Headers[i].Name) + len(rs.Headers[i].Value)
		}
		return num(n)
	}
	return nil
}

// grpcStatus is Envoy's Grpc::Common::getGrpcStatus on the response
// headers: the grpc-status header (-1, Envoy's InvalidCode, when it is
// not a well-known code), else the HTTP status mapped as
// Grpc::Utility::httpToGrpcStatus does.
func grpcStatus(rs *protocol.ResponseHeaders) *structpb.Value {
	if v := header(rs.Headers, "grpc-status"); v != nil {
		n, err := strconv.ParseUint(string(v), 10, 32)
		if err != nil || n > 16 {
			return num(-1)
		}
		return num(n)
	}
	switch rs.StatusCode {
	case 400:
		return num(13) // Internal
	case 401:
		return num(16) // Unauthenticated
	case 403:
		return num(7) // PermissionDenied
	case 404:
		return num(12) // Unimplemented
	case 429, 502, 503, 504:
		return num(14) // Unavailable
	}
	return num(2) // Unknown
}

// firstSAN is the first subject alternative name of kind prefix in a
// "DNS:a,URI:b" list, as Envoy gives the first of each kind.
func firstSAN(san []byte, prefix string) *structpb.Value {
	for s := range strings.SplitSeq(string(san), ",") {
		if v, ok := strings.CutPrefix(s, prefix); ok {
			return structpb.NewStringValue(v)
		}
	}
	return nil
}

// envoyTime prints an RFC 3339 timestamp as Envoy prints a CEL timestamp
// (absl::FormatTime in UTC: fractional seconds without trailing zeros,
// the zone as +00:00).
func envoyTime(ts []byte) *structpb.Value {
	if len(ts) == 0 {
		return nil
	}
	t, err := time.Parse(time.RFC3339Nano, string(ts))
	if err != nil {
		return nil
	}
	return structpb.NewStringValue(t.UTC().Format("2006-01-02T15:04:05.999999999-07:00"))
}

func header(hs protocol.Headers, name string) []byte {
	for i := range hs {
		if strings.EqualFold(string(hs[i].Name), name) {
			return hs[i].Value
		}
	}
	return nil
}

// headersValue is a header list as a struct: lower-cased names, repeated
// headers joined with commas.
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
