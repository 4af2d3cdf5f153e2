package handshake

import (
	"errors"
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/protocol"
)

func TestCheckResponse(t *testing.T) {
	req := NewRequest("sidecar/test")
	caps := protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true, SupportsCancellation: true, SupportsStreaming: true,
		SupportsInlineBody: true, SupportsProtobufPayloads: true, MaxConcurrentRequests: 7}
	noPB := caps
	noPB.SupportsProtobufPayloads = false
	pbReq := NewRequestWith("sidecar/test", protocol.FeatureProtobufPayloads)
	tests := []struct {
		name string
		req  protocol.HandshakeRequest
		resp protocol.HandshakeResponse
		want error
		caps protocol.Capabilities
	}{
		{"accepted, protobuf_payloads not offered", req, protocol.HandshakeResponse{ProtocolVersion: 2, Accepted: true, Capabilities: caps}, nil, noPB},
		{"accepted, protobuf_payloads offered and declared", pbReq, protocol.HandshakeResponse{ProtocolVersion: 2, Accepted: true, Capabilities: caps}, nil, caps},
		{"refused", req, protocol.HandshakeResponse{ProtocolVersion: 2, Accepted: false}, ErrHandshakeRefused, protocol.Capabilities{}},
		{"error text", req, protocol.HandshakeResponse{ProtocolVersion: 2, Accepted: true, Error: "no"}, ErrHandshakeRefused, protocol.Capabilities{}},
		{"version 1", req, protocol.HandshakeResponse{ProtocolVersion: 1, Accepted: true}, ErrHandshakeVersion, protocol.Capabilities{}},
		{"version 3", req, protocol.HandshakeResponse{ProtocolVersion: 3, Accepted: true}, ErrHandshakeVersion, protocol.Capabilities{}},
		{"features not offered are masked",
			protocol.HandshakeRequest{ProtocolVersion: 2, SupportedFeatures: []string{protocol.FeatureBodyMutation}},
			protocol.HandshakeResponse{ProtocolVersion: 2, Accepted: true, Capabilities: caps}, nil,
			protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true, MaxConcurrentRequests: 7}},
		{"inline body offered and declared",
			protocol.HandshakeRequest{ProtocolVersion: 2, SupportedFeatures: []string{protocol.FeatureInlineBody}},
			protocol.HandshakeResponse{ProtocolVersion: 2, Accepted: true, Capabilities: caps}, nil,
			protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true, SupportsInlineBody: true, MaxConcurrentRequests: 7}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := CheckResponse(&tc.req, &tc.resp)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if got != tc.caps {
				t.Fatalf("caps = %+v, want %+v", got, tc.caps)
			}
		})
	}
}

// TestAnswerMasksProtobufPayloads: the agent side declares
// supports_protobuf_payloads only to a proxy that offered the feature.
func TestAnswerMasksProtobufPayloads(t *testing.T) {
	caps := protocol.Capabilities{HandlesRequestHeaders: true, SupportsProtobufPayloads: true}
	for _, tc := range []struct {
		req  protocol.HandshakeRequest
		want bool
	}{
		{NewRequest("p"), false},
		{NewRequestWith("p", protocol.FeatureProtobufPayloads), true},
	} {
		r, err := Answer(&tc.req, "a", caps)
		if err != nil || r.Capabilities.SupportsProtobufPayloads != tc.want {
			t.Errorf("offered %v: declared %v (%v), want %v", tc.req.SupportedFeatures, r.Capabilities.SupportsProtobufPayloads, err, tc.want)
		}
	}
	if got := NewRequestWith("p", protocol.FeatureProtobufPayloads).SupportedFeatures; len(got) != len(ProxyFeatures)+1 || len(ProxyFeatures) != 5 {
		t.Errorf("features %v: want ProxyFeatures plus protobuf_payloads, and ProxyFeatures untouched", got)
	}
}

func TestRefusalReasonClipped(t *testing.T) {
	resp := protocol.HandshakeResponse{ProtocolVersion: 2, Error: strings.Repeat("x", 5000)}
	req := NewRequest("s")
	_, err := CheckResponse(&req, &resp)
	if err == nil || len(err.Error()) > 400 {
		t.Fatalf("reason not clipped: %d bytes", len(err.Error()))
	}
}

func TestAnswerAndRegistration(t *testing.T) {
	ok := protocol.HandshakeRequest{ProtocolVersion: 2}
	if r, err := Answer(&ok, "a", protocol.Capabilities{HandlesRequestHeaders: true}); err != nil || !r.Accepted || !r.Capabilities.HandlesRequestHeaders {
		t.Fatalf("answer = %+v, %v", r, err)
	}
	bad := protocol.HandshakeRequest{ProtocolVersion: 9}
	if r, err := Answer(&bad, "a", protocol.Capabilities{}); !errors.Is(err, ErrHandshakeVersion) || r.Accepted || r.Error == "" {
		t.Fatalf("answer to v9 = %+v, %v", r, err)
	}
	regs := []struct {
		req  protocol.RegistrationRequest
		want error
	}{
		{protocol.RegistrationRequest{ProtocolVersion: 2, AgentID: "waf-1"}, nil},
		{protocol.RegistrationRequest{ProtocolVersion: 1, AgentID: "waf-1"}, ErrHandshakeVersion},
		{protocol.RegistrationRequest{ProtocolVersion: 2}, ErrHandshakeInvalid},
		{protocol.RegistrationRequest{ProtocolVersion: 2, AgentID: strings.Repeat("a", 300)}, ErrHandshakeInvalid},
	}
	for _, r := range regs {
		if err := CheckRegistration(&r.req); !errors.Is(err, r.want) {
			t.Errorf("CheckRegistration(%q v%d) = %v, want %v", r.req.AgentID, r.req.ProtocolVersion, err, r.want)
		}
	}
	if err := CheckRegistrationResponse(&protocol.RegistrationResponse{Accepted: true}); err != nil {
		t.Fatal(err)
	}
	if err := CheckRegistrationResponse(&protocol.RegistrationResponse{Accepted: false, Error: "unknown agent"}); !errors.Is(err, ErrHandshakeRefused) {
		t.Fatal(err)
	}
}

// The proxy offers inline_body; an agent declares it only to a proxy that
// offered it, and the proxy uses it only when both have it.
func TestInlineBodyNegotiation(t *testing.T) {
	req := NewRequest("sidecar/test")
	found := false
	for _, f := range req.SupportedFeatures {
		found = found || f == protocol.FeatureInlineBody
	}
	if !found {
		t.Fatalf("proxy features %v lack %q", req.SupportedFeatures, protocol.FeatureInlineBody)
	}
	caps := protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true, SupportsInlineBody: true}
	r, err := Answer(&req, "a", caps)
	if err != nil || !r.Capabilities.SupportsInlineBody {
		t.Fatalf("answer to a proxy offering inline_body: %+v, %v", r.Capabilities, err)
	}
	old := protocol.HandshakeRequest{ProtocolVersion: 2, SupportedFeatures: []string{protocol.FeatureCancellation, protocol.FeatureStreaming}}
	r, err = Answer(&old, "a", caps)
	if err != nil || r.Capabilities.SupportsInlineBody {
		t.Fatalf("answer to a proxy without inline_body declares it: %+v, %v", r.Capabilities, err)
	}
	// An agent that does not declare it does not get it.
	resp := protocol.HandshakeResponse{ProtocolVersion: 2, Accepted: true, Capabilities: protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true}}
	if got, err := CheckResponse(&req, &resp); err != nil || got.SupportsInlineBody {
		t.Fatalf("undeclared inline_body: %+v, %v", got, err)
	}
}

// TestRegistrationPayloadEncoding: the proxy takes protobuf payloads only
// when declared, allowed and answerable; the agent refuses a choice it did
// not declare.
func TestRegistrationPayloadEncoding(t *testing.T) {
	for _, tc := range []struct {
		declared, allow, compat, want bool
	}{
		{true, true, false, true},
		{false, true, false, false},
		{true, false, false, false},
		{true, true, true, false},
	} {
		req := protocol.RegistrationRequest{Capabilities: protocol.Capabilities{HandlesRequestHeaders: true, SupportsProtobufPayloads: tc.declared}}
		caps, pb := AcceptRegistration(&req, tc.allow, tc.compat)
		if pb != tc.want || caps.SupportsProtobufPayloads != tc.want || !caps.HandlesRequestHeaders {
			t.Errorf("%+v: protobuf %v, caps %+v", tc, pb, caps)
		}
	}
	pbResp := &protocol.RegistrationResponse{Accepted: true, PayloadEncoding: protocol.EncodingProtobuf}
	if ok, err := RegistrationProtobuf(pbResp, true); !ok || err != nil {
		t.Errorf("declared: %v %v", ok, err)
	}
	if _, err := RegistrationProtobuf(pbResp, false); !errors.Is(err, ErrHandshakeInvalid) {
		t.Errorf("undeclared: %v, want ErrHandshakeInvalid", err)
	}
	if ok, err := RegistrationProtobuf(&protocol.RegistrationResponse{Accepted: true}, true); ok || err != nil {
		t.Errorf("JSON answer: %v %v", ok, err)
	}
}

// The proxy offers client_request; an agent declares it only to a proxy
// that offered it, the proxy keeps it only when it offered it and the
// agent declared it, and a registration keeps it as declared.
func TestClientRequestNegotiation(t *testing.T) {
	req := NewRequest("sidecar/test")
	if !slicesContains(req.SupportedFeatures, protocol.FeatureClientRequest) {
		t.Fatalf("proxy features %v lack %q", req.SupportedFeatures, protocol.FeatureClientRequest)
	}
	caps := protocol.Capabilities{HandlesRequestHeaders: true, SupportsClientRequest: true}
	r, err := Answer(&req, "a", caps)
	if err != nil || !r.Capabilities.SupportsClientRequest {
		t.Fatalf("answer to a proxy offering client_request: %+v, %v", r.Capabilities, err)
	}
	if got, err := CheckResponse(&req, &r); err != nil || !got.SupportsClientRequest {
		t.Fatalf("proxy side of a declared client_request: %+v, %v", got, err)
	}
	old := protocol.HandshakeRequest{ProtocolVersion: 2, SupportedFeatures: []string{protocol.FeatureCancellation, protocol.FeatureInlineBody}}
	r, err = Answer(&old, "a", caps)
	if err != nil || r.Capabilities.SupportsClientRequest {
		t.Fatalf("answer to a proxy without client_request declares it: %+v, %v", r.Capabilities, err)
	}
	// A proxy that did not offer it masks an agent's claim.
	claim := protocol.HandshakeResponse{ProtocolVersion: 2, Accepted: true, Capabilities: caps}
	if got, err := CheckResponse(&old, &claim); err != nil || got.SupportsClientRequest {
		t.Fatalf("client_request kept though not offered: %+v, %v", got, err)
	}
	// An agent that does not declare it does not get it.
	resp := protocol.HandshakeResponse{ProtocolVersion: 2, Accepted: true, Capabilities: protocol.Capabilities{HandlesRequestHeaders: true}}
	if got, err := CheckResponse(&req, &resp); err != nil || got.SupportsClientRequest {
		t.Fatalf("undeclared client_request: %+v, %v", got, err)
	}
	// Reverse connections: accepted as declared.
	for _, declared := range []bool{true, false} {
		reg := protocol.RegistrationRequest{ProtocolVersion: 2, AgentID: "a", Capabilities: protocol.Capabilities{HandlesRequestHeaders: true, SupportsClientRequest: declared}}
		if got, _ := AcceptRegistration(&reg, true, false); got.SupportsClientRequest != declared {
			t.Fatalf("registration declaring client_request=%v accepted as %v", declared, got.SupportsClientRequest)
		}
	}
}

func slicesContains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}
