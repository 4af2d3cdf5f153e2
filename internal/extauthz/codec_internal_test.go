package extauthz

import (
	"testing"
	"time"
	"unicode/utf8"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/proto"

	"github.com/zentinelproxy/sidecar/protocol"
)

// wireRequest is a request headers event with everything the CheckRequest
// carries: repeated and mixed-case names, a query and a fragment, TLS
// facts, bytes that are not UTF-8.
func wireRequest() *protocol.RequestHeaders {
	m := &protocol.RequestHeaders{Method: []byte("POST"), URI: []byte("/caf\xe9/items?id=7&q=\xff#frag"), HasBody: true}
	for _, h := range [][2]string{
		{"host", "shop.example"}, {"X-Multi", "a"}, {"content-length", "12"}, {"x-multi", "b\xe9"},
		{"cookie", "s=1"}, {"X-Empty", ""}, {"x-multi", "c"},
	} {
		m.Headers = append(m.Headers, protocol.Header{Name: []byte(h[0]), Value: []byte(h[1])})
	}
	md := &m.Metadata
	md.ClientIP, md.ClientPort = []byte("2001:db8::9"), 51234
	md.ServerIP, md.ServerPort = []byte("10.0.0.1"), 8443
	md.Protocol, md.CorrelationID = []byte("HTTP/1.1"), []byte("corr-1")
	md.Timestamp = []byte("2026-11-21T10:00:00.123456789Z")
	md.TLSVersion, md.TLSServerName = []byte("TLS1.3"), []byte("shop.example")
	md.TLSClientSubject, md.TLSClientSAN = []byte("CN=alice,O=Shop"), []byte("DNS:a.example,URI:spiffe://shop/alice")
	return m
}

// TestWireMatchesProto: the hand encoding of a CheckRequest decodes to
// the message the generated types build, in every configuration.
func TestWireMatchesProto(t *testing.T) {
	now := time.Unix(1700000000, 42)
	for _, tc := range []struct {
		name    string
		cfg     Config
		body    []byte
		m       func(*protocol.RequestHeaders)
		partial bool
	}{
		{"defaults", Config{}, nil, nil, false},
		{"extensions and tls session", Config{ContextExtensions: map[string]string{"a": "1", "env": "prod", "empty": ""}, IncludeTLSSession: true}, nil, nil, false},
		{"raw headers", Config{EncodeRawHeaders: true}, nil, nil, false},
		{"body", Config{WithRequestBody: true}, []byte("hello \xe9 world"), nil, false},
		{"raw body", Config{WithRequestBody: true, PackAsBytes: true}, []byte{0, 1, 2, 0xff}, nil, false},
		{"empty body", Config{WithRequestBody: true, PackAsBytes: true}, []byte{}, nil, false},
		{"plain, no timestamp, no addresses", Config{}, nil, func(m *protocol.RequestHeaders) {
			m.Metadata = protocol.Metadata{}
			m.HasBody = false
			m.Headers = m.Headers[:2]
			m.URI = []byte("/")
		}, false},
		{"unknown length", Config{}, nil, func(m *protocol.RequestHeaders) { m.Headers[2].Value = []byte("+12") }, false},
		{"no host", Config{}, nil, func(m *protocol.RequestHeaders) { m.Headers = m.Headers[1:] }, false},
		{"partial body, the client's header dropped", Config{WithRequestBody: true}, []byte("hello"), func(m *protocol.RequestHeaders) {
			m.Headers = append(m.Headers, protocol.Header{Name: []byte("X-Envoy-Auth-Partial-Body"), Value: []byte("false")})
		}, true},
		{"raw headers, partial body", Config{WithRequestBody: true, EncodeRawHeaders: true}, []byte("hello"), func(m *protocol.RequestHeaders) {
			m.Headers = append(m.Headers, protocol.Header{Name: []byte("x-envoy-auth-partial-body"), Value: []byte("false")})
		}, true},
		{"route extensions merged", Config{ContextExtensions: map[string]string{"a": "1", "env": "prod"},
			RouteContextExtensions: map[string]map[string]string{"r1": {"env": "dev", "route": "r1"}, "r2": {"x": "y"}}}, nil,
			func(m *protocol.RequestHeaders) { m.Metadata.RouteID = []byte("r1") }, false},
		{"route extensions, other route", Config{ContextExtensions: map[string]string{"a": "1"},
			RouteContextExtensions: map[string]map[string]string{"r1": {"a": "2"}}}, nil,
			func(m *protocol.RequestHeaders) { m.Metadata.RouteID = []byte("r9") }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := wireRequest()
			if tc.m != nil {
				tc.m(m)
			}
			checkWireMatches(t, &tc.cfg, m, tc.body, tc.partial, now)
		})
	}
}

func checkWireMatches(t *testing.T, cfg *Config, m *protocol.RequestHeaders, body []byte, partial bool, now time.Time) {
	t.Helper()
	w := checkWire{cfg: cfg, m: m, body: body, partial: partial, now: now}
	b := w.encode(newCodec(cfg))
	var got authv3.CheckRequest
	if err := proto.Unmarshal(b, &got); err != nil {
		t.Fatalf("the hand encoding does not decode: %v", err)
	}
	want := cfg.checkRequest(m, body, partial, now)
	if !proto.Equal(&got, want) {
		t.Errorf("hand encoding decodes to\n%v\nwant\n%v", &got, want)
	}
}

// FuzzWire holds the hand encoding to the generated types on any
// request.
func FuzzWire(f *testing.F) {
	f.Add("GET", "/a?b#c", "Host", "x", "X-A", "1\xe9", "x-a", "", "1.2.3.4", uint16(80), []byte("body"), uint8(0))
	f.Add("", "", "", "", "", "", "", "", "", uint16(0), []byte(nil), uint8(255))
	f.Fuzz(func(t *testing.T, method, uri, n1, v1, n2, v2, n3, v3, ip string, port uint16, body []byte, flags uint8) {
		m := &protocol.RequestHeaders{Method: []byte(method), URI: []byte(uri), HasBody: flags&1 != 0}
		for _, h := range [][2]string{{n1, v1}, {n2, v2}, {n3, v3}} {
			if h[0] == "" || !isASCII([]byte(h[0])) {
				continue // names are tokens
			}
			m.Headers = append(m.Headers, protocol.Header{Name: []byte(h[0]), Value: []byte(h[1])})
		}
		m.Metadata.ClientIP, m.Metadata.ClientPort = []byte(ip), int(port)
		if flags&2 != 0 {
			m.Metadata.TLSVersion, m.Metadata.TLSClientSubject, m.Metadata.TLSServerName = []byte("TLS1.3"), []byte(v1), []byte(v2)
		}
		cfg := &Config{EncodeRawHeaders: flags&4 != 0, WithRequestBody: flags&8 != 0, PackAsBytes: flags&16 != 0, IncludeTLSSession: flags&32 != 0}
		if flags&64 != 0 {
			cfg.ContextExtensions = map[string]string{"k": v3}
			if !utf8.ValidString(v3) {
				cfg.ContextExtensions = nil // the configuration is UTF-8 YAML
			}
		}
		checkWireMatches(t, cfg, m, body, flags&128 != 0, time.Unix(int64(port), 0))
	})
}
