package extauthz

import (
	"bytes"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/zentinelproxy/sidecar/protocol"
)

// checkRequest builds the CheckRequest of a request headers event with
// the generated types: the reference the hand encoding (checkWire) is
// held to.
func (c *Config) checkRequest(m *protocol.RequestHeaders, body []byte, partial bool, now time.Time) *authv3.CheckRequest {
	md := &m.Metadata
	tls := len(md.TLSVersion) > 0
	scheme := "http"
	if tls {
		scheme = "https"
	}
	host := header(m.Headers, "host")
	uri := utf8Str(m.URI)
	query := ""
	if _, q, ok := strings.Cut(uri, "?"); ok {
		query, _, _ = strings.Cut(q, "#")
	}
	hr := &authv3.AttributeContext_HttpRequest{
		Id:       utf8Str(md.CorrelationID),
		Method:   utf8Str(m.Method),
		Path:     uri,
		Host:     utf8Str(host),
		Scheme:   scheme,
		Query:    query,
		Protocol: utf8Str(md.Protocol),
		Size:     -1,
	}
	if cl := header(m.Headers, "content-length"); cl != nil {
		if n, ok := parseSize(cl); ok {
			hr.Size = n
		}
	} else if !m.HasBody {
		hr.Size = 0
	}
	if c.WithRequestBody && body != nil {
		// Envoy: the body held (all of it, or the first
		// max_request_bytes with allow_partial_message), as a string or,
		// with pack_as_bytes, as bytes; size stays the request's.
		if c.PackAsBytes {
			hr.RawBody = bytes.Clone(body)
		} else {
			hr.Body = utf8Str(body) // a binary body wants pack_as_bytes
		}
	}
	pseudo := [...][2]string{{":authority", hr.Host}, {":method", hr.Method}, {":path", uri}, {":scheme", scheme}}
	if c.EncodeRawHeaders {
		raw := [...][]byte{host, m.Method, m.URI, []byte(scheme)}
		hs := make([]*corev3.HeaderValue, 0, len(pseudo)+len(m.Headers))
		vals := make([]corev3.HeaderValue, cap(hs))
		hs = hs[:0]
		for i, p := range pseudo {
			v := &vals[len(hs)]
			v.Key, v.RawValue = p[0], bytes.Clone(raw[i])
			hs = append(hs, v)
		}
		for i := range m.Headers {
			if k := lowerName(m.Headers[i].Name); k == "host" || k == partialBodyHeader {
				continue
			}
			v := &vals[len(hs)]
			v.Key, v.RawValue = lowerName(m.Headers[i].Name), bytes.Clone(m.Headers[i].Value)
			hs = append(hs, v)
		}
		if c.WithRequestBody && body != nil {
			hs = append(hs, &corev3.HeaderValue{Key: partialBodyHeader, RawValue: partialValue(partial)})
		}
		hr.HeaderMap = &corev3.HeaderMap{Headers: hs}
	} else {
		h := make(map[string]string, len(pseudo)+len(m.Headers))
		for _, p := range pseudo {
			h[p[0]] = p[1]
		}
		for i := range m.Headers {
			k := lowerName(m.Headers[i].Name)
			if k == "host" || k == partialBodyHeader {
				continue // Envoy drops a client's x-envoy-auth-partial-body
			}
			v := utf8Str(m.Headers[i].Value)
			if old, ok := h[k]; ok {
				h[k] = old + "," + v
				continue
			}
			h[k] = v
		}
		if c.WithRequestBody && body != nil {
			// Envoy: whether the body sent is cut at max_request_bytes.
			h[partialBodyHeader] = string(partialValue(partial))
		}
		hr.Headers = h
	}
	ts := timestamppb.New(now)
	if t, err := time.Parse(time.RFC3339Nano, string(md.Timestamp)); err == nil {
		ts = timestamppb.New(t)
	}
	ac := &authv3.AttributeContext{
		Source:            &authv3.AttributeContext_Peer{Address: socketAddress(md.ClientIP, md.ClientPort)},
		Destination:       &authv3.AttributeContext_Peer{Address: socketAddress(md.ServerIP, md.ServerPort)},
		Request:           &authv3.AttributeContext_Request{Time: ts, Http: hr},
		ContextExtensions: c.extensionsFor(string(md.RouteID)),
		MetadataContext:   &corev3.Metadata{},
	}
	if tls && len(md.TLSClientSubject) > 0 {
		ac.Source.Principal = utf8Str(principalOf(md.TLSClientSAN, md.TLSClientSubject))
	}
	if tls && c.IncludeTLSSession {
		ac.TlsSession = &authv3.AttributeContext_TLSSession{Sni: utf8Str(md.TLSServerName)}
	}
	return &authv3.CheckRequest{Attributes: ac}
}

func socketAddress(ip []byte, port int) *corev3.Address {
	if len(ip) == 0 {
		return nil
	}
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address:       utf8Str(ip),
		PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)},
	}}}
}
