package extproc_test

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/extproc"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/protocol"
)

// TestRequestHeaders: the headers, pseudo-headers, attributes, metadata
// context and protocol configuration reach the processor, and every kind
// of header mutation maps onto the operation Envoy would apply: only the
// deprecated append decides (unset: overwrite), append_action and
// keep_empty_value are not read, an empty value is set empty.
func TestRequestHeaders(t *testing.T) {
	p, addr, _ := startProcessor(t, func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
		return []*extprocsvc.ProcessingResponse{cont(req, &extprocsvc.CommonResponse{
			HeaderMutation: &extprocsvc.HeaderMutation{
				SetHeaders: []*corev3.HeaderValueOption{
					hdr("X-Append", "a", corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD),
					hdr("x-absent-new", "b", corev3.HeaderValueOption_ADD_IF_ABSENT),
					hdr("accept", "ignored", corev3.HeaderValueOption_ADD_IF_ABSENT),
					hdr("x-over", "c", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD),
					hdr("accept", "d", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS),
					hdr("x-missing", "ignored", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS),
					{Header: &corev3.HeaderValue{Key: "x-legacy", Value: "e"}, Append: wrapperspb.Bool(false)},
					{Header: &corev3.HeaderValue{Key: "x-legacy-add", Value: "f"}, Append: wrapperspb.Bool(true)},
					{Header: &corev3.HeaderValue{Key: "x-empty"}},
					{Header: &corev3.HeaderValue{Key: "x-keep"}, KeepEmptyValue: true, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD},
					hdr(":authority", "other.example", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD),
				},
				RemoveHeaders: []string{"Cookie"},
			},
			ClearRouteCache: true,
		})}, nil
	}, nil)
	c := newClient(t, addr, func(cfg *extproc.Config) {
		cfg.RequestAttrs = []string{"request.path", "request.method", "source.address", "source.port", "request.id", "xds.route_name"}
		cfg.Metadata = map[string]map[string]string{"tenant": {"id": "t1"}}
	})
	ex := begin(t, c)
	defer ex.Finish()
	r, err := ex.RequestHeaders(wait(), reqHeaders(false, "accept", "*/*", "cookie", "a=b"))
	if err != nil {
		t.Fatal(err)
	}
	got := opsString(r.Decision.RequestHeaderOps)
	want := []string{"remove cookie", "set x-append=a", "set x-absent-new=b", "set accept=ignored", "set x-over=c", "set accept=d",
		"set x-missing=ignored", "set x-legacy=e", "add x-legacy-add=f", "set x-empty=", "set x-keep=", "set host=other.example"}
	if !slices.Equal(got, want) {
		t.Errorf("ops:\n got %q\nwant %q", got, want)
	}
	if r.Decision.Kind != protocol.DecisionAllow || !r.Decision.Final() {
		t.Errorf("decision %v final %v", r.Decision.Kind, r.Decision.Final())
	}
	seen := p.received()
	if len(seen) != 1 {
		t.Fatalf("processor got %d messages", len(seen))
	}
	rh := seen[0].GetRequestHeaders()
	for k, v := range map[string]string{":method": "POST", ":path": "/api/x?q=1", ":authority": "example.com", "accept": "*/*"} {
		if got, _ := headerOf(rh.GetHeaders(), k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if _, ok := headerOf(rh.GetHeaders(), "host"); ok {
		t.Error("host sent besides :authority")
	}
	if !rh.GetEndOfStream() {
		t.Error("end_of_stream not set for a request without body")
	}
	attrs := seen[0].GetAttributes()["envoy.filters.http.ext_proc"].GetFields()
	if attrs["request.path"].GetStringValue() != "/api/x?q=1" || attrs["source.address"].GetStringValue() != "10.0.0.9:51234" ||
		attrs["source.port"].GetNumberValue() != 51234 || attrs["request.id"].GetStringValue() != "corr-1" ||
		attrs["xds.route_name"].GetStringValue() != "main" || attrs["request.method"].GetStringValue() != "POST" {
		t.Errorf("attributes %v", attrs)
	}
	if v := seen[0].GetMetadataContext().GetFilterMetadata()["tenant"].GetFields()["id"].GetStringValue(); v != "t1" {
		t.Errorf("metadata context %v", seen[0].GetMetadataContext())
	}
	if seen[0].GetProtocolConfig() == nil {
		t.Error("no protocol_config on the first message")
	}
	if n := c.Counts()["clear_route_cache_ignored"]; n != 1 {
		t.Errorf("clear_route_cache_ignored = %d", n)
	}
}

// TestResponseHeaders: :status is sent, response mutations become
// response header operations, and the stream is half-closed when the
// exchange finishes.
func TestResponseHeaders(t *testing.T) {
	p, addr, _ := startProcessor(t, func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
		var cr *extprocsvc.CommonResponse
		if req.GetResponseHeaders() != nil {
			cr = &extprocsvc.CommonResponse{HeaderMutation: &extprocsvc.HeaderMutation{
				SetHeaders:    []*corev3.HeaderValueOption{hdr("x-frame-options", "DENY", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD)},
				RemoveHeaders: []string{"server"},
			}}
		}
		return []*extprocsvc.ProcessingResponse{cont(req, cr)}, nil
	}, nil)
	c := newClient(t, addr, func(cfg *extproc.Config) { cfg.ResponseAttrs = []string{"response.code"} })
	ex := begin(t, c)
	if _, err := ex.RequestHeaders(wait(), reqHeaders(false)); err != nil {
		t.Fatal(err)
	}
	rs := &protocol.ResponseHeaders{StatusCode: 201, HasBody: true, Headers: protocol.Headers{{Name: []byte("server"), Value: []byte("x")}}}
	r, err := ex.ResponseHeaders(wait(), rs)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := opsString(r.Decision.ResponseHeaderOps), []string{"remove server", "set x-frame-options=DENY"}; !slices.Equal(got, want) {
		t.Errorf("ops %q, want %q", got, want)
	}
	ex.Finish()
	seen := p.received()
	if len(seen) != 2 || seen[1].GetResponseHeaders() == nil {
		t.Fatalf("processor got %v", seen)
	}
	if s, _ := headerOf(seen[1].GetResponseHeaders().GetHeaders(), ":status"); s != "201" {
		t.Errorf(":status %q", s)
	}
	if seen[1].GetResponseHeaders().GetEndOfStream() {
		t.Error("end_of_stream set on a response with a body")
	}
	if code := seen[1].GetAttributes()["envoy.filters.http.ext_proc"].GetFields()["response.code"].GetNumberValue(); code != 201 {
		t.Errorf("response.code %v", code)
	}
	testutil.WaitFor(t, "the stream to be half-closed", func() bool { return p.halfEOF.Load() == 1 })
	if p.opened.Load() != 1 {
		t.Errorf("%d streams for one request", p.opened.Load())
	}
}

// TestStreamedBody: each chunk goes to the processor as it comes; body,
// clear_body, streamed_response and no mutation map onto replace, drop,
// replace and pass.
func TestStreamedBody(t *testing.T) {
	p, addr, _ := startProcessor(t, func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
		var cr *extprocsvc.CommonResponse
		if b := req.GetRequestBody(); b != nil {
			switch string(b.GetBody()) {
			case "one":
				cr = &extprocsvc.CommonResponse{BodyMutation: &extprocsvc.BodyMutation{Mutation: &extprocsvc.BodyMutation_Body{Body: []byte("ONE!")}}}
			case "two":
				cr = &extprocsvc.CommonResponse{BodyMutation: &extprocsvc.BodyMutation{Mutation: &extprocsvc.BodyMutation_ClearBody{ClearBody: true}}}
			case "three":
				cr = &extprocsvc.CommonResponse{BodyMutation: &extprocsvc.BodyMutation{Mutation: &extprocsvc.BodyMutation_StreamedResponse{
					StreamedResponse: &extprocsvc.StreamedBodyResponse{Body: []byte("3"), EndOfStream: true}}}}
			}
		}
		return []*extprocsvc.ProcessingResponse{cont(req, cr)}, nil
	}, nil)
	c := newClient(t, addr, func(cfg *extproc.Config) {
		cfg.Mode.RequestBody = extprocfilter.ProcessingMode_STREAMED
	})
	if caps := c.Capabilities(); !caps.HandlesRequestBody || !caps.SupportsStreaming || caps.HandlesResponseBody {
		t.Fatalf("capabilities %+v", caps)
	}
	ex := begin(t, c)
	defer ex.Finish()
	if _, err := ex.RequestHeaders(wait(), reqHeaders(true)); err != nil {
		t.Fatal(err)
	}
	type step struct {
		data      string
		last      bool
		action    protocol.MutationAction
		repl      string
		needsMore bool
	}
	for i, s := range []step{{"one", false, protocol.MutationReplace, "ONE!", true}, {"two", false, protocol.MutationDrop, "", true}, {"three", false, protocol.MutationReplace, "3", true}, {"four", true, protocol.MutationPass, "", false}} {
		r, err := ex.BodyChunk(wait(), protocol.PhaseRequest, chunk(uint32(i), s.data, s.last))
		if err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
		d := &r.Decision
		act := protocol.MutationPass
		if d.HasRequestBodyMutation {
			act = d.RequestBodyMutation.Action
			if d.RequestBodyMutation.ChunkIndex != uint32(i) {
				t.Errorf("chunk %d: mutation of chunk %d", i, d.RequestBodyMutation.ChunkIndex)
			}
		}
		if act != s.action || string(d.RequestBodyMutation.Data) != s.repl || d.NeedsMore != s.needsMore {
			t.Errorf("chunk %d: action %v data %q needs_more %v", i, act, d.RequestBodyMutation.Data, d.NeedsMore)
		}
	}
	var bodies []string
	for _, m := range p.received() {
		if b := m.GetRequestBody(); b != nil {
			bodies = append(bodies, string(b.GetBody())+map[bool]string{true: "|eos"}[b.GetEndOfStream()])
		}
	}
	if want := []string{"one", "two", "three", "four|eos"}; !slices.Equal(bodies, want) {
		t.Errorf("processor saw %q, want %q", bodies, want)
	}
}

// TestBufferedBody: the chunks are held and the whole body goes to the
// processor once, with end_of_stream; its answer replaces the whole body
// (no mutation: the held body is forwarded unchanged).
func TestBufferedBody(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mut    *extprocsvc.BodyMutation
		action protocol.MutationAction
		data   string
	}{
		{"pass", nil, protocol.MutationReplace, "aaabbbccc"},
		{"replace", &extprocsvc.BodyMutation{Mutation: &extprocsvc.BodyMutation_Body{Body: []byte("new")}}, protocol.MutationReplace, "new"},
		{"clear", &extprocsvc.BodyMutation{Mutation: &extprocsvc.BodyMutation_ClearBody{ClearBody: true}}, protocol.MutationDrop, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, addr, _ := startProcessor(t, func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
				if req.GetResponseBody() != nil {
					return []*extprocsvc.ProcessingResponse{cont(req, &extprocsvc.CommonResponse{BodyMutation: tc.mut})}, nil
				}
				return continueAll(req)
			}, nil)
			c := newClient(t, addr, func(cfg *extproc.Config) {
				cfg.Mode.ResponseBody = extprocfilter.ProcessingMode_BUFFERED
			})
			if caps := c.Capabilities(); !caps.HandlesResponseBody || caps.SupportsStreaming || caps.HandlesRequestBody {
				t.Fatalf("capabilities %+v", caps)
			}
			ex := begin(t, c)
			defer ex.Finish()
			if _, err := ex.RequestHeaders(wait(), reqHeaders(false)); err != nil {
				t.Fatal(err)
			}
			if _, err := ex.ResponseHeaders(wait(), &protocol.ResponseHeaders{StatusCode: 200, HasBody: true}); err != nil {
				t.Fatal(err)
			}
			for i, s := range []string{"aaa", "bbb"} {
				r, err := ex.BodyChunk(wait(), protocol.PhaseResponse, chunk(uint32(i), s, false))
				if err != nil {
					t.Fatal(err)
				}
				d := &r.Decision
				if !d.NeedsMore || !d.HasResponseBodyMutation || d.ResponseBodyMutation.Action != protocol.MutationDrop {
					t.Errorf("held chunk %d: %+v", i, d)
				}
			}
			r, err := ex.BodyChunk(wait(), protocol.PhaseResponse, chunk(2, "ccc", true))
			if err != nil {
				t.Fatal(err)
			}
			m := r.Decision.ResponseBodyMutation
			if !r.Decision.HasResponseBodyMutation || m.Action != tc.action || string(m.Data) != tc.data || m.ChunkIndex != 2 {
				t.Errorf("last chunk: %+v", r.Decision)
			}
			var bodies []string
			for _, m := range p.received() {
				if b := m.GetResponseBody(); b != nil {
					bodies = append(bodies, string(b.GetBody()))
					if !b.GetEndOfStream() {
						t.Error("buffered body without end_of_stream")
					}
				}
			}
			if !slices.Equal(bodies, []string{"aaabbbccc"}) {
				t.Errorf("processor saw %q", bodies)
			}
		})
	}
}

// TestBufferedPartial: the body is held until buffer_limit, its first
// buffer_limit bytes are sent without end_of_stream, and the rest passes
// without the processor.
func TestBufferedPartial(t *testing.T) {
	p, addr, _ := startProcessor(t, func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
		if req.GetRequestBody() != nil {
			return []*extprocsvc.ProcessingResponse{cont(req, &extprocsvc.CommonResponse{
				BodyMutation: &extprocsvc.BodyMutation{Mutation: &extprocsvc.BodyMutation_Body{Body: []byte("P")}},
			})}, nil
		}
		return continueAll(req)
	}, nil)
	c := newClient(t, addr, func(cfg *extproc.Config) {
		cfg.Mode.RequestBody = extprocfilter.ProcessingMode_BUFFERED_PARTIAL
		cfg.BufferLimit = 1024
	})
	ex := begin(t, c)
	defer ex.Finish()
	if _, err := ex.RequestHeaders(wait(), reqHeaders(true)); err != nil {
		t.Fatal(err)
	}
	part := strings.Repeat("x", 600)
	r, err := ex.BodyChunk(wait(), protocol.PhaseRequest, chunk(0, part, false))
	if err != nil || !r.Decision.NeedsMore {
		t.Fatalf("first chunk held: %v %+v", err, r)
	}
	r, err = ex.BodyChunk(wait(), protocol.PhaseRequest, chunk(1, part, false))
	if err != nil {
		t.Fatal(err)
	}
	// The processor's part (buffer_limit bytes) is replaced; the rest of
	// the held chunks follows unchanged.
	if want := "P" + strings.Repeat("x", 1200-1024); !r.Decision.Final() || string(r.Decision.RequestBodyMutation.Data) != want {
		t.Errorf("partial answer: final %v, data %q", r.Decision.Final(), r.Decision.RequestBodyMutation.Data)
	}
	var eos []bool
	for _, m := range p.received() {
		if b := m.GetRequestBody(); b != nil {
			eos = append(eos, b.GetEndOfStream())
			if len(b.GetBody()) != 1024 {
				t.Errorf("partial body of %d bytes, want buffer_limit", len(b.GetBody()))
			}
		}
	}
	if !slices.Equal(eos, []bool{false}) {
		t.Errorf("body messages (end_of_stream) %v", eos)
	}
}

// TestBufferLimit: a BUFFERED body over buffer_limit fails its request
// (as the processor's error: the failure policy decides) and is counted.
func TestBufferLimit(t *testing.T) {
	p, addr, _ := startProcessor(t, continueAll, nil)
	c := newClient(t, addr, func(cfg *extproc.Config) {
		cfg.Mode.RequestBody = extprocfilter.ProcessingMode_BUFFERED
		cfg.BufferLimit = 1024
	})
	ex := begin(t, c)
	defer ex.Finish()
	big := strings.Repeat("y", 700)
	if _, err := ex.BodyChunk(wait(), protocol.PhaseRequest, chunk(0, big, false)); err != nil {
		t.Fatal(err)
	}
	_, err := ex.BodyChunk(wait(), protocol.PhaseRequest, chunk(1, big, true))
	if !errors.Is(err, agentmux.ErrAgentProtocol) || !strings.Contains(err.Error(), "buffer_limit") {
		t.Fatalf("err %v", err)
	}
	if c.Counts()["buffer_limit"] != 1 {
		t.Errorf("buffer_limit counter %v", c.Counts())
	}
	for _, m := range p.received() {
		if m.GetRequestBody() != nil {
			t.Error("body sent despite the limit")
		}
	}
}

// TestSkipAndNone: phases the mode does not send are not offered to the
// processor (capabilities) and never reach it.
func TestSkipAndNone(t *testing.T) {
	p, addr, _ := startProcessor(t, continueAll, nil)
	c := newClient(t, addr, func(cfg *extproc.Config) {
		cfg.Mode.ResponseHeader = extprocfilter.ProcessingMode_SKIP
	})
	caps := c.Capabilities()
	if !caps.HandlesRequestHeaders || caps.HandlesResponseHeaders || caps.HandlesRequestBody || caps.HandlesResponseBody {
		t.Fatalf("capabilities %+v", caps)
	}
	ex := begin(t, c)
	if _, err := ex.RequestHeaders(wait(), reqHeaders(false)); err != nil {
		t.Fatal(err)
	}
	ex.Finish()
	c2 := newClient(t, addr, func(cfg *extproc.Config) {
		cfg.Mode.RequestHeader = extprocfilter.ProcessingMode_SKIP
		cfg.Mode.ResponseBody = extprocfilter.ProcessingMode_STREAMED
	})
	if caps := c2.Capabilities(); caps.HandlesRequestHeaders || !caps.HandlesResponseHeaders || !caps.HandlesResponseBody {
		t.Fatalf("capabilities %+v", caps)
	}
	var phases []string
	for _, m := range p.received() {
		phases = append(phases, phaseOf(m))
	}
	if !slices.Equal(phases, []string{"request_headers"}) {
		t.Errorf("processor saw %v", phases)
	}
}

// TestModeOverride: a mode_override in the request-headers answer changes
// the request's mode only when allowed_override_modes lists it.
func TestModeOverride(t *testing.T) {
	override := &extprocfilter.ProcessingMode{RequestBodyMode: extprocfilter.ProcessingMode_STREAMED}
	h := func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
		r := cont(req, nil)
		if req.GetRequestHeaders() != nil {
			r.ModeOverride = override
		}
		return []*extprocsvc.ProcessingResponse{r}, nil
	}
	for _, tc := range []struct {
		name    string
		allowed string
		sent    bool
		counter string
	}{
		{"allowed", "request_body_mode=STREAMED", true, "mode_overrides"},
		{"refused", "request_body_mode=BUFFERED", false, "mode_overrides_refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, addr, _ := startProcessor(t, h, nil)
			c := newClient(t, addr, func(cfg *extproc.Config) {
				if err := cfg.ApplyOptions(map[string]string{"allowed_override_modes": tc.allowed}); err != nil {
					t.Fatal(err)
				}
			})
			if !c.Capabilities().HandlesRequestBody {
				t.Fatalf("an allowed override's body phase is not offered: %+v", c.Capabilities())
			}
			ex := begin(t, c)
			defer ex.Finish()
			if _, err := ex.RequestHeaders(wait(), reqHeaders(true)); err != nil {
				t.Fatal(err)
			}
			r, err := ex.BodyChunk(wait(), protocol.PhaseRequest, chunk(0, "data", false))
			if err != nil {
				t.Fatal(err)
			}
			sent := false
			for _, m := range p.received() {
				sent = sent || m.GetRequestBody() != nil
			}
			if sent != tc.sent {
				t.Errorf("body sent to the processor: %v, want %v", sent, tc.sent)
			}
			if !tc.sent && !r.Decision.Final() {
				t.Error("a body the mode does not send must end the processor's say")
			}
			if c.Counts()[tc.counter] != 1 {
				t.Errorf("counters %v", c.Counts())
			}
		})
	}
}

// TestImmediateResponse: an immediate_response is a block with its
// status, headers, body and grpc-status.
func TestImmediateResponse(t *testing.T) {
	_, addr, _ := startProcessor(t, func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
		return []*extprocsvc.ProcessingResponse{{Response: &extprocsvc.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocsvc.ImmediateResponse{
			Status:     &typev3.HttpStatus{Code: typev3.StatusCode_Unauthorized},
			Headers:    &extprocsvc.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{hdr("www-authenticate", "Bearer", 0)}},
			Body:       []byte("no token"),
			GrpcStatus: &extprocsvc.GrpcStatus{Status: 16},
		}}}}, nil
	}, nil)
	c := newClient(t, addr, nil)
	ex := begin(t, c)
	defer ex.Finish()
	r, err := ex.RequestHeaders(wait(), reqHeaders(false))
	if err != nil {
		t.Fatal(err)
	}
	d := &r.Decision
	if d.Kind != protocol.DecisionBlock || d.Status != 401 || string(d.Body) != "no token" {
		t.Fatalf("decision %+v", d)
	}
	var hs []string
	for _, h := range d.BlockHeaders {
		hs = append(hs, string(h.Name)+"="+string(h.Value))
	}
	if want := []string{"www-authenticate=Bearer", "grpc-status=16"}; !slices.Equal(hs, want) {
		t.Errorf("block headers %q, want %q", hs, want)
	}
}

// TestProtocolErrors: a response for the wrong phase, an unsolicited
// response, a stream closed mid-request and an unsupported response fail
// their own request; a request on the same connection at the same time
// is unaffected.
func TestProtocolErrors(t *testing.T) {
	type kase struct {
		name    string
		h       handler
		counter string
	}
	for _, tc := range []kase{
		{"wrong phase", func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
			return []*extprocsvc.ProcessingResponse{{Response: &extprocsvc.ProcessingResponse_RequestBody{RequestBody: &extprocsvc.BodyResponse{}}}}, nil
		}, "wrong_phase"},
		{"stream closed", func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
			return nil, status.Error(codes.Internal, "processor bug")
		}, "stream_closed"},
		{"clean close", func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
			return nil, errEndStream
		}, "stream_closed"},
		{"continue and replace", func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
			return []*extprocsvc.ProcessingResponse{cont(req, &extprocsvc.CommonResponse{Status: extprocsvc.CommonResponse_CONTINUE_AND_REPLACE})}, nil
		}, "unsupported_responses"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			good := make(chan struct{})
			_, addr, _ := startProcessor(t, func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
				if path, _ := headerOf(req.GetRequestHeaders().GetHeaders(), ":path"); path == "/good" {
					<-good // held until the bad request has failed
					return continueAll(req)
				}
				return tc.h(req)
			}, nil)
			c := newClient(t, addr, nil)
			okEx := begin(t, c)
			defer okEx.Finish()
			var wg sync.WaitGroup
			var okErr error
			wg.Add(1)
			go func() {
				defer wg.Done()
				m := reqHeaders(false)
				m.URI = []byte("/good")
				_, okErr = okEx.RequestHeaders(wait(), m)
			}()
			ex := begin(t, c)
			_, err := ex.RequestHeaders(wait(), reqHeaders(false))
			ex.Finish()
			if !errors.Is(err, agentmux.ErrAgentProtocol) {
				t.Errorf("bad request: %v, want a protocol error", err)
			}
			close(good)
			wg.Wait()
			if okErr != nil {
				t.Errorf("the other request failed too: %v", okErr)
			}
			if c.Counts()[tc.counter] != 1 {
				t.Errorf("counters %v", c.Counts())
			}
			if st := c.Snapshot(); st.Protocol != 1 || !st.Ready {
				t.Errorf("status %+v", st)
			}
		})
	}
}

// Handled in Process: errEndStream ends the stream cleanly without an
// answer, errEndAfterSend after sending the answers.
var (
	errEndStream    = errors.New("end")
	errEndAfterSend = errors.New("end after send")
)

// TestUnsolicited: a second answer to one event is unsolicited: the
// request's next event fails, and it is counted.
func TestUnsolicited(t *testing.T) {
	_, addr, _ := startProcessor(t, func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
		return []*extprocsvc.ProcessingResponse{cont(req, nil), cont(req, nil)}, nil
	}, nil)
	c := newClient(t, addr, nil)
	ex := begin(t, c)
	defer ex.Finish()
	if _, err := ex.RequestHeaders(wait(), reqHeaders(false)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the unsolicited response", func() bool { return c.Counts()["unsolicited"] == 1 })
	_, err := ex.ResponseHeaders(wait(), &protocol.ResponseHeaders{StatusCode: 200})
	if !errors.Is(err, agentmux.ErrAgentProtocol) || !errors.Is(err, extproc.ErrUnsolicited) && !strings.Contains(err.Error(), "unsolicited") {
		t.Fatalf("next event: %v", err)
	}
}

// TestHungProcessor: no answer within the message timeout is a timeout
// (the failure policy decides) and the stream is canceled.
func TestHungProcessor(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	p, addr, _ := startProcessor(t, func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
		<-release
		return nil, nil
	}, nil)
	c := newClient(t, addr, func(cfg *extproc.Config) { cfg.MessageTimeout = 100 * time.Millisecond })
	ex := begin(t, c)
	_, err := ex.RequestHeaders(wait(), reqHeaders(false))
	if !errors.Is(err, agentmux.ErrAgentTimeout) {
		t.Fatalf("err %v, want a timeout", err)
	}
	ex.Finish()
	if st := c.Snapshot(); st.Timeouts != 1 {
		t.Errorf("timeouts %d", st.Timeouts)
	}
	_ = p
}

// TestProcessorDown: with the processor gone the agent is unavailable;
// it recovers when the processor is back.
func TestProcessorDown(t *testing.T) {
	_, addr, stop := startProcessor(t, continueAll, nil)
	c := newClient(t, addr, nil)
	stop()
	testutil.WaitFor(t, "the agent to notice", func() bool { return !c.Snapshot().Ready })
	_, err := c.Begin(wait())
	if !errors.Is(err, agentmux.ErrAgentUnavailable) {
		t.Fatalf("Begin: %v", err)
	}
	if c.Snapshot().LastError == "" {
		t.Error("no last error")
	}
}

// TestCancelEndsStream: a CancelRequest (client gone, another agent
// decided) resets that request's stream.
func TestCancelEndsStream(t *testing.T) {
	p, addr, _ := startProcessor(t, continueAll, nil)
	c := newClient(t, addr, nil)
	ex := begin(t, c)
	if _, err := ex.RequestHeaders(wait(), reqHeaders(false)); err != nil {
		t.Fatal(err)
	}
	ex.Cancel("decided")
	ex.Finish()
	testutil.WaitFor(t, "the stream to end", func() bool { return p.ended.Load() == 1 })
}

// TestConns: the streams share `conns` HTTP/2 connections, each a session
// of the agent.
func TestConns(t *testing.T) {
	p, addr, _ := startProcessor(t, continueAll, nil)
	c := newClient(t, addr, func(cfg *extproc.Config) { cfg.Conns = 3 })
	testutil.WaitFor(t, "three connections", func() bool { return c.Snapshot().Connections == 3 })
	var exs []*agentmux.Exchange
	for range 6 {
		ex := begin(t, c)
		if _, err := ex.RequestHeaders(wait(), reqHeaders(false)); err != nil {
			t.Fatal(err)
		}
		exs = append(exs, ex)
	}
	for i, s := range c.Sessions() {
		if s.InFlight() != 2 {
			t.Errorf("connection %d carries %d of 6 requests", i, s.InFlight())
		}
	}
	for _, ex := range exs {
		ex.Finish()
	}
	if n := p.opened.Load(); n != 6 {
		t.Errorf("%d streams for 6 requests", n)
	}
}

// TestOverrideAny: allow_mode_override without a list offers every phase
// and honours any override the proxy can carry; here the processor turns
// the response headers off for its request, which the transport then
// answers itself.
func TestOverrideAny(t *testing.T) {
	p, addr, _ := startProcessor(t, func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
		r := cont(req, nil)
		if path, _ := headerOf(req.GetRequestHeaders().GetHeaders(), ":path"); path == "/skip" {
			r.ModeOverride = &extprocfilter.ProcessingMode{ResponseHeaderMode: extprocfilter.ProcessingMode_SKIP}
		}
		if path, _ := headerOf(req.GetRequestHeaders().GetHeaders(), ":path"); path == "/trailers" {
			r.ModeOverride = &extprocfilter.ProcessingMode{ResponseHeaderMode: extprocfilter.ProcessingMode_SKIP, ResponseTrailerMode: extprocfilter.ProcessingMode_SEND}
		}
		return []*extprocsvc.ProcessingResponse{r}, nil
	}, nil)
	c := newClient(t, addr, func(cfg *extproc.Config) { cfg.AllowModeOverride = true })
	if caps := c.Capabilities(); !caps.HandlesResponseHeaders || !caps.HandlesRequestBody || !caps.HandlesResponseBody || !caps.SupportsStreaming {
		t.Fatalf("capabilities %+v", caps)
	}
	for _, path := range []string{"/skip", "/trailers"} {
		ex := begin(t, c)
		m := reqHeaders(false)
		m.URI = []byte(path)
		if _, err := ex.RequestHeaders(wait(), m); err != nil {
			t.Fatal(err)
		}
		if _, err := ex.ResponseHeaders(wait(), &protocol.ResponseHeaders{StatusCode: 200}); err != nil {
			t.Fatal(err)
		}
		ex.Finish()
	}
	var phases []string
	for _, m := range p.received() {
		phases = append(phases, phaseOf(m))
	}
	// /skip: honoured, no response headers; /trailers: refused (trailers
	// cannot be carried), so the response headers still go out.
	if want := []string{"request_headers", "request_headers", "response_headers"}; !slices.Equal(phases, want) {
		t.Errorf("processor saw %v, want %v", phases, want)
	}
	if got := c.Counts(); got["mode_overrides"] != 1 || got["mode_overrides_refused"] != 1 {
		t.Errorf("counters %v", got)
	}
}

// TestNoStreamLeak: whether a request finishes, is canceled or times
// out, its stream ends.
func TestNoStreamLeak(t *testing.T) {
	p, addr, _ := startProcessor(t, func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
		if path, _ := headerOf(req.GetRequestHeaders().GetHeaders(), ":path"); path == "/hang" {
			return nil, nil // never answered: the client times out
		}
		return continueAll(req)
	}, nil)
	c := newClient(t, addr, nil)
	for i := range 30 {
		ex := begin(t, c)
		m := reqHeaders(false)
		w := wait()
		if i%3 == 2 {
			// Only the hung request gets a short budget: answered ones
			// must not time out on a loaded machine.
			m.URI = []byte("/hang")
			w = agentmux.Wait{Deadline: time.Now().Add(50 * time.Millisecond)}
		}
		_, err := ex.RequestHeaders(w, m)
		switch i % 3 {
		case 0:
			if err != nil {
				t.Fatal(err)
			}
		case 1:
			if err != nil {
				t.Fatal(err)
			}
			ex.Cancel("client_disconnect")
		case 2:
			if !errors.Is(err, agentmux.ErrAgentTimeout) {
				t.Fatalf("hung request: %v", err)
			}
		}
		ex.Finish()
	}
	testutil.WaitFor(t, "every stream to end", func() bool { return p.ended.Load() == 30 })
	if st := c.Snapshot(); st.InFlight != 0 {
		t.Errorf("in flight %d", st.InFlight)
	}
}
