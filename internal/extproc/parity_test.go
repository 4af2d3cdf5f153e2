package extproc_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/zentinelproxy/sidecar/internal/extproc"
	"github.com/zentinelproxy/sidecar/protocol"
)

// TestHeaderAppendAsEnvoy: Envoy's ext_proc reads only the deprecated
// append, false when unset (MutationUtils::applyHeaderMutations), so every
// append_action value overwrites unless append is true, and append true
// adds whatever append_action says.
func TestHeaderAppendAsEnvoy(t *testing.T) {
	actions := []corev3.HeaderValueOption_HeaderAppendAction{
		corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD, corev3.HeaderValueOption_ADD_IF_ABSENT,
		corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD, corev3.HeaderValueOption_OVERWRITE_IF_EXISTS,
	}
	type tc struct {
		name string
		opt  *corev3.HeaderValueOption
		want string
	}
	var cases []tc
	for _, a := range actions {
		for _, app := range []*wrapperspb.BoolValue{nil, wrapperspb.Bool(false), wrapperspb.Bool(true)} {
			want := "set"
			if app.GetValue() {
				want = "add"
			}
			// Both an existing header and one the request lacks.
			for _, key := range []string{"x-client", "x-new"} {
				cases = append(cases, tc{
					name: fmt.Sprintf("%s/append=%v/%s", a, app, key),
					opt:  &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: key, RawValue: []byte("mutated")}, AppendAction: a, Append: app},
					want: want + " " + key + "=mutated",
				})
			}
		}
	}
	var opts []*corev3.HeaderValueOption
	var want []string
	for _, c := range cases {
		opts = append(opts, c.opt)
		want = append(want, c.want)
	}
	_, addr, _ := startProcessor(t, func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
		return []*extprocsvc.ProcessingResponse{cont(req, &extprocsvc.CommonResponse{
			HeaderMutation: &extprocsvc.HeaderMutation{SetHeaders: opts},
		})}, nil
	}, nil)
	c := newClient(t, addr, nil)
	ex := begin(t, c)
	defer ex.Finish()
	r, err := ex.RequestHeaders(wait(), reqHeaders(false, "x-client", "original"))
	if err != nil {
		t.Fatal(err)
	}
	got := opsString(r.Decision.RequestHeaderOps)
	if len(got) != len(want) {
		t.Fatalf("%d ops for %d options: %q", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("%s: %q, want %q", cases[i].name, got[i], want[i])
		}
	}
}

// TestDataplaneMutationAsEnvoy: Envoy Gateway's example processor sets
// x-request-client-header to "mutated" without append: the upstream gets
// "mutated" alone (Envoy Gateway's e2e test expects exactly that), and a
// header set with an empty value arrives empty (Envoy sets it; it drops
// nothing for a missing keep_empty_value).
func TestDataplaneMutationAsEnvoy(t *testing.T) {
	h := func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
		var cr *extprocsvc.CommonResponse
		switch {
		case req.GetRequestHeaders() != nil:
			cr = &extprocsvc.CommonResponse{HeaderMutation: &extprocsvc.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				{Header: &corev3.HeaderValue{Key: "x-request-client-header", RawValue: []byte("mutated")}},
				{Header: &corev3.HeaderValue{Key: "x-request-xds-route-name", RawValue: []byte("")}},
				{Header: &corev3.HeaderValue{Key: "x-from-client", RawValue: []byte("Value-request")}},
			}}}
		case req.GetResponseHeaders() != nil:
			cr = &extprocsvc.CommonResponse{HeaderMutation: &extprocsvc.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				{Header: &corev3.HeaderValue{Key: "server", RawValue: []byte("processed")}},
				{Header: &corev3.HeaderValue{Key: "x-empty-response"}},
			}}}
		}
		return []*extprocsvc.ProcessingResponse{cont(req, cr)}, nil
	}
	url, up, _, _ := e2e(t, h, map[string]string{"Mode": ""})
	resp, _ := get(t, "GET", url+"/processor", "", "X-Request-Client-Header", "original", "X-From-Client", "from-client")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if v := up.header.Values("X-Request-Client-Header"); !slices.Equal(v, []string{"mutated"}) {
		t.Errorf("upstream x-request-client-header %q, want only \"mutated\"", v)
	}
	if v := up.header.Values("X-From-Client"); !slices.Equal(v, []string{"Value-request"}) {
		t.Errorf("upstream x-from-client %q, want only \"Value-request\"", v)
	}
	if v, ok := up.header["X-Request-Xds-Route-Name"]; !ok || !slices.Equal(v, []string{""}) {
		t.Errorf("upstream x-request-xds-route-name %q (present %v), want one empty value", v, ok)
	}
	if v := resp.Header.Values("Server"); !slices.Equal(v, []string{"processed"}) {
		t.Errorf("client server header %q, want only \"processed\"", v)
	}
	if v, ok := resp.Header["X-Empty-Response"]; !ok || !slices.Equal(v, []string{""}) {
		t.Errorf("client x-empty-response %q (present %v), want one empty value", v, ok)
	}
}

// TestImmediateResponseEmptyHeader: an immediate response's header with
// an empty value is kept, as Envoy applies those headers as a mutation.
func TestImmediateResponseEmptyHeader(t *testing.T) {
	_, addr, _ := startProcessor(t, func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
		return []*extprocsvc.ProcessingResponse{{Response: &extprocsvc.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocsvc.ImmediateResponse{
			Headers: &extprocsvc.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-empty"}}}},
		}}}}, nil
	}, nil)
	c := newClient(t, addr, nil)
	ex := begin(t, c)
	defer ex.Finish()
	r, err := ex.RequestHeaders(wait(), reqHeaders(false))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Decision.BlockHeaders) != 1 || string(r.Decision.BlockHeaders[0].Name) != "x-empty" || len(r.Decision.BlockHeaders[0].Value) != 0 {
		t.Errorf("block headers %v", r.Decision.BlockHeaders)
	}
}

// TestMetadataEveryMessage: the metadata_context goes with every message
// of the stream, as Envoy's Filter::addDynamicMetadata puts it on headers,
// body and trailers messages alike; without configured metadata the field
// is there, empty, as Envoy always sets it.
func TestMetadataEveryMessage(t *testing.T) {
	for _, configured := range []bool{true, false} {
		t.Run(fmt.Sprint("configured=", configured), func(t *testing.T) {
			p, addr, _ := startProcessor(t, continueAll, nil)
			c := newClient(t, addr, func(cfg *extproc.Config) {
				cfg.Mode.RequestBody = extprocfilter.ProcessingMode_STREAMED
				cfg.Mode.ResponseBody = extprocfilter.ProcessingMode_BUFFERED
				if configured {
					cfg.Metadata = map[string]map[string]string{"envoy.filters.http.rbac": {"enforced_engine_result": "allowed"}}
				}
			})
			ex := begin(t, c)
			if _, err := ex.RequestHeaders(wait(), reqHeaders(true)); err != nil {
				t.Fatal(err)
			}
			for i, last := range []bool{false, true} {
				if _, err := ex.BodyChunk(wait(), protocol.PhaseRequest, chunk(uint32(i), "part", last)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := ex.ResponseHeaders(wait(), &protocol.ResponseHeaders{StatusCode: 200, HasBody: true}); err != nil {
				t.Fatal(err)
			}
			if _, err := ex.BodyChunk(wait(), protocol.PhaseResponse, chunk(0, "resp", true)); err != nil {
				t.Fatal(err)
			}
			ex.Finish()
			seen := p.received()
			var phases []string
			for _, m := range seen {
				phases = append(phases, phaseOf(m))
				md := m.GetMetadataContext()
				if md == nil {
					t.Errorf("%s: no metadata_context", phaseOf(m))
					continue
				}
				got := md.GetFilterMetadata()["envoy.filters.http.rbac"].GetFields()["enforced_engine_result"].GetStringValue()
				if configured && got != "allowed" {
					t.Errorf("%s: metadata_context %v", phaseOf(m), md)
				}
				if !configured && len(md.GetFilterMetadata()) != 0 {
					t.Errorf("%s: metadata_context %v, want empty", phaseOf(m), md)
				}
			}
			if want := []string{"request_headers", "request_body", "request_body", "response_headers", "response_body"}; !slices.Equal(phases, want) {
				t.Errorf("phases %v, want %v", phases, want)
			}
		})
	}
}

// tlsHeaders is reqHeaders on a TLS connection with a client certificate.
func tlsHeaders() *protocol.RequestHeaders {
	m := reqHeaders(true, "referer", "https://ref.example/", "user-agent", "curl/8", "content-length", "4", "grpc-x", "1")
	m.URI = []byte("/api/x?q=1#frag")
	md := &m.Metadata
	md.Protocol = []byte("HTTP/1.1")
	md.Timestamp = []byte("2026-11-21T10:00:00Z")
	md.TLSVersion, md.TLSServerName = []byte("TLS1.3"), []byte("api.example")
	md.TLSClientSubject = []byte("CN=client,O=Example")
	md.TLSClientSAN = []byte("URI:spiffe://example/client,DNS:client.example,DNS:other.example")
	md.ServerIP, md.ServerPort = []byte("2001:db8::2"), 8443
	return m
}

// wantRequestAttrs are the values tlsHeaders gives every request
// attribute, as Envoy would send them.
func wantRequestAttrs() map[string]*structpb.Value {
	s := structpb.NewStringValue
	n := func(f float64) *structpb.Value { return structpb.NewNumberValue(f) }
	return map[string]*structpb.Value{
		"request.path": s("/api/x?q=1#frag"), "request.url_path": s("/api/x"), "request.query": s("q=1"),
		"request.host": s("example.com"), "request.scheme": s("https"), "request.method": s("POST"),
		"request.referer": s("https://ref.example/"), "request.useragent": s("curl/8"),
		"request.time": s("2026-11-21T10:00:00+00:00"), "request.id": s("corr-1"), "request.protocol": s("HTTP/1.1"),
		"request.size":   n(4),
		"source.address": s("10.0.0.9:51234"), "source.port": n(51234),
		"destination.address": s("[2001:db8::2]:8443"), "destination.port": n(8443),
		"connection.mtls": structpb.NewBoolValue(true), "connection.requested_server_name": s("api.example"),
		"connection.tls_version": s("TLSv1.3"), "connection.subject_peer_certificate": s("CN=client,O=Example"),
		"connection.dns_san_peer_certificate": s("client.example"), "connection.uri_san_peer_certificate": s("spiffe://example/client"),
		"xds.route_name": s("main"), "xds.cluster_name": s("app"),
	}
}

// checkAttrs compares the attributes of a message with want; request.headers,
// response.headers, request.total_size and response.total_size are checked
// for their kind only.
func checkAttrs(t *testing.T, what string, m *extprocsvc.ProcessingRequest, want map[string]*structpb.Value, names []string) {
	t.Helper()
	got := m.GetAttributes()["envoy.filters.http.ext_proc"].GetFields()
	if len(got) != len(names) {
		t.Errorf("%s: %d attributes, want %d: %v", what, len(got), len(names), slices.Sorted(maps.Keys(got)))
	}
	for _, a := range names {
		g, ok := got[a]
		switch {
		case !ok:
			t.Errorf("%s: %s missing", what, a)
		case strings.HasSuffix(a, ".headers") || strings.HasSuffix(a, ".trailers"):
			if g.GetStructValue() == nil {
				t.Errorf("%s: %s = %v, want a struct", what, a, g)
			}
		case strings.HasSuffix(a, ".total_size"):
			if g.GetNumberValue() <= 0 && a != "response.total_size" {
				t.Errorf("%s: %s = %v", what, a, g)
			}
		case want[a] == nil:
			t.Errorf("%s: %s has no expected value", what, a)
		case g.String() != want[a].String():
			t.Errorf("%s: %s = %v, want %v", what, a, g, want[a])
		}
	}
}

// TestAttributesEveryPhase: every supported attribute is sent with its
// phase's first message: request attributes on the request headers, and
// response attributes (which include the request's, as Envoy evaluates
// them on the response too) on the response headers; each list once.
func TestAttributesEveryPhase(t *testing.T) {
	p, addr, _ := startProcessor(t, continueAll, nil)
	c := newClient(t, addr, func(cfg *extproc.Config) {
		cfg.RequestAttrs = extproc.RequestAttributes
		cfg.ResponseAttrs = extproc.ResponseAttributes
		cfg.Mode.RequestBody = extprocfilter.ProcessingMode_STREAMED
	})
	ex := begin(t, c)
	rq := tlsHeaders()
	if _, err := ex.RequestHeaders(wait(), rq); err != nil {
		t.Fatal(err)
	}
	// The dataplane reuses its event buffers once answered: the response
	// attributes must not read them.
	for i := range rq.URI {
		rq.URI[i] = 'X'
	}
	rq.Metadata.RouteID[0] = 'X'
	if _, err := ex.BodyChunk(wait(), protocol.PhaseRequest, chunk(0, "body", true)); err != nil {
		t.Fatal(err)
	}
	rs := &protocol.ResponseHeaders{StatusCode: 503, HasBody: false, Headers: protocol.Headers{{Name: []byte("Server"), Value: []byte("app")}}}
	if _, err := ex.ResponseHeaders(wait(), rs); err != nil {
		t.Fatal(err)
	}
	ex.Finish()
	seen := p.received()
	if len(seen) != 3 {
		t.Fatalf("processor got %d messages", len(seen))
	}
	want := wantRequestAttrs()
	checkAttrs(t, "request_headers", seen[0], want, extproc.RequestAttributes)
	if len(seen[1].GetAttributes()) != 0 {
		t.Errorf("request_body carries attributes again: %v", seen[1].GetAttributes())
	}
	n := func(f float64) *structpb.Value { return structpb.NewNumberValue(f) }
	want["response.code"], want["response.code_details"] = n(503), structpb.NewStringValue("via_upstream")
	want["response.flags"], want["response.grpc_status"], want["response.size"] = n(0), n(14), n(0)
	checkAttrs(t, "response_headers", seen[2], want, extproc.ResponseAttributes)
	if v := seen[2].GetAttributes()["envoy.filters.http.ext_proc"].GetFields()["response.headers"].GetStructValue().GetFields()["server"].GetStringValue(); v != "app" {
		t.Errorf("response.headers server = %q", v)
	}
}

// TestAttributesPlainText: on a connection without TLS the scheme is http,
// mtls false, the SNI empty, and the TLS facts Envoy could not give are
// left out; a missing Referer leaves request.referer out.
func TestAttributesPlainText(t *testing.T) {
	p, addr, _ := startProcessor(t, continueAll, nil)
	c := newClient(t, addr, func(cfg *extproc.Config) { cfg.RequestAttrs = extproc.RequestAttributes })
	ex := begin(t, c)
	defer ex.Finish()
	if _, err := ex.RequestHeaders(wait(), reqHeaders(false)); err != nil {
		t.Fatal(err)
	}
	got := p.received()[0].GetAttributes()["envoy.filters.http.ext_proc"].GetFields()
	for a, v := range map[string]string{"request.scheme": "http", "connection.requested_server_name": "", "connection.mtls": "false"} {
		var g string
		if b, ok := got[a].GetKind().(*structpb.Value_BoolValue); ok {
			g = fmt.Sprint(b.BoolValue)
		} else {
			g = got[a].GetStringValue()
		}
		if _, ok := got[a]; !ok || g != v {
			t.Errorf("%s = %v, want %q", a, got[a], v)
		}
	}
	for _, a := range []string{"request.referer", "request.useragent", "connection.tls_version", "connection.subject_peer_certificate",
		"connection.dns_san_peer_certificate", "connection.uri_san_peer_certificate", "request.time", "request.protocol"} {
		if v, ok := got[a]; ok {
			t.Errorf("%s = %v, want it left out", a, v)
		}
	}
	if v := got["request.size"].GetNumberValue(); v != 0 {
		t.Errorf("request.size = %v, want 0 without a body", v)
	}
	if h, _ := headerOf(p.received()[0].GetRequestHeaders().GetHeaders(), ":scheme"); h != "http" {
		t.Errorf(":scheme %q", h)
	}
}

// TestAttributesSkippedHeaders: with a direction's headers not sent, its
// attributes go with its first body message, from the skipped event.
func TestAttributesSkippedHeaders(t *testing.T) {
	p, addr, _ := startProcessor(t, continueAll, nil)
	c := newClient(t, addr, func(cfg *extproc.Config) {
		cfg.Mode = extproc.Mode{
			RequestHeader: extprocfilter.ProcessingMode_SKIP, ResponseHeader: extprocfilter.ProcessingMode_SKIP,
			RequestBody: extprocfilter.ProcessingMode_BUFFERED, ResponseBody: extprocfilter.ProcessingMode_STREAMED,
		}
		cfg.RequestAttrs = []string{"request.path", "xds.route_name"}
		cfg.ResponseAttrs = []string{"request.path", "response.code"}
	})
	ex := begin(t, c)
	if _, err := ex.RequestHeaders(wait(), reqHeaders(true)); err != nil {
		t.Fatal(err)
	}
	if _, err := ex.BodyChunk(wait(), protocol.PhaseRequest, chunk(0, "body", true)); err != nil {
		t.Fatal(err)
	}
	if _, err := ex.ResponseHeaders(wait(), &protocol.ResponseHeaders{StatusCode: 201, HasBody: true}); err != nil {
		t.Fatal(err)
	}
	for i, last := range []bool{false, true} {
		if _, err := ex.BodyChunk(wait(), protocol.PhaseResponse, chunk(uint32(i), "x", last)); err != nil {
			t.Fatal(err)
		}
	}
	ex.Finish()
	seen := p.received()
	if len(seen) != 3 {
		t.Fatalf("processor got %d messages", len(seen))
	}
	attr := func(i int, a string) *structpb.Value {
		return seen[i].GetAttributes()["envoy.filters.http.ext_proc"].GetFields()[a]
	}
	if attr(0, "request.path").GetStringValue() != "/api/x?q=1" || attr(0, "xds.route_name").GetStringValue() != "main" {
		t.Errorf("request_body attributes %v", seen[0].GetAttributes())
	}
	if attr(1, "request.path").GetStringValue() != "/api/x?q=1" || attr(1, "response.code").GetNumberValue() != 201 {
		t.Errorf("first response_body attributes %v", seen[1].GetAttributes())
	}
	if len(seen[2].GetAttributes()) != 0 {
		t.Errorf("second response_body carries attributes: %v", seen[2].GetAttributes())
	}
}
