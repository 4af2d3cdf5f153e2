package extproc

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"

	"github.com/zentinelproxy/sidecar/protocol"
)

// FuzzParseMode: any option text parses or is refused with an error, and
// what parses prints back to the same mode.
func FuzzParseMode(f *testing.F) {
	for _, s := range []string{"", "request_body_mode=BUFFERED", "response_header_mode=skip,request_body_mode=STREAMED",
		"request_trailer_mode=SEND", "x=y", "request_body_mode", "request_body_mode=GRPC,request_body_mode=NONE", ",,="} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseMode(s)
		if err != nil {
			return
		}
		again, err := ParseMode(m.String())
		if err != nil || again != m {
			t.Fatalf("%q: %v round-trips to %v (%v)", s, m, again, err)
		}
		_ = m.check()
	})
}

// FuzzMapResponse: any ProcessingResponse the processor may send, in
// answer to any phase, maps to a reply or an error without panicking, and
// a mapped decision passes or fails Normalize (never both ways).
func FuzzMapResponse(f *testing.F) {
	seeds := []*extprocsvc.ProcessingResponse{
		{Response: &extprocsvc.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocsvc.HeadersResponse{Response: &extprocsvc.CommonResponse{
			HeaderMutation: &extprocsvc.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x", RawValue: []byte("1")}}}, RemoveHeaders: []string{"y"}},
		}}}},
		{Response: &extprocsvc.ProcessingResponse_ResponseBody{ResponseBody: &extprocsvc.BodyResponse{Response: &extprocsvc.CommonResponse{
			BodyMutation: &extprocsvc.BodyMutation{Mutation: &extprocsvc.BodyMutation_Body{Body: []byte("b")}},
		}}}},
		{Response: &extprocsvc.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocsvc.ImmediateResponse{Body: []byte("no")}}},
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		for k := kindRequestHeaders; k <= kindResponseBody; k++ {
			f.Add(b, uint8(k))
		}
	}
	f.Fuzz(func(t *testing.T, b []byte, k uint8) {
		var r extprocsvc.ProcessingResponse
		if proto.Unmarshal(b, &r) != nil {
			return
		}
		want := kind(k%4) + kindRequestHeaders
		c := &Client{cfg: DefaultConfig("fuzz", "127.0.0.1:1")}
		c.cfg.AllowModeOverride = true
		st := &reqStream{l: &link{c: c}, id: 7, chunk: 1, isHeld: k&8 != 0, held: []byte("held"), partial: k&16 != 0}
		if st.partial {
			st.rest = []byte("rest")
		}
		fill, err := st.mapResponse(want, &r)
		if err != nil {
			return
		}
		var d protocol.Decision
		d.RequestID = 7
		fill(&d)
		_ = d.Normalize()
	})
}
