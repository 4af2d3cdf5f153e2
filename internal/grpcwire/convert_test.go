package grpcwire

import (
	"reflect"
	"testing"

	"github.com/zentinelproxy/sidecar/grpcagent/pb"
	"github.com/zentinelproxy/sidecar/protocol"
)

func TestCapabilitiesRoundTrip(t *testing.T) {
	caps := protocol.Capabilities{HandlesRequestHeaders: true, HandlesResponseBody: true, SupportsCancellation: true, MaxConcurrentRequests: 100}
	if got := CapabilitiesFromPB(CapabilitiesToPB(caps)); got != caps {
		t.Fatalf("capabilities %+v, want %+v", got, caps)
	}
	inline := protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true, SupportsInlineBody: true}
	if p := CapabilitiesToPB(inline); !p.SupportsInlineBody {
		t.Fatal("supports_inline_body lost on the way to protobuf")
	} else if got := CapabilitiesFromPB(p); got != inline {
		t.Fatalf("capabilities %+v, want %+v", got, inline)
	}
	client := protocol.Capabilities{HandlesRequestHeaders: true, SupportsClientRequest: true}
	if p := CapabilitiesToPB(client); !p.SupportsClientRequest {
		t.Fatal("supports_client_request lost on the way to protobuf")
	} else if got := CapabilitiesFromPB(p); got != client {
		t.Fatalf("capabilities %+v, want %+v", got, client)
	}
	if got := CapabilitiesFromPB(nil); got != (protocol.Capabilities{}) {
		t.Fatalf("nil capabilities %+v", got)
	}
	req := protocol.HandshakeRequest{ProtocolVersion: 2, ClientName: "sidecar", SupportedFeatures: []string{"cancellation", "streaming"}}
	if got := CapabilityRequestFromPB(CapabilityRequestToPB(&req)); !reflect.DeepEqual(got, req) {
		t.Fatalf("request %+v, want %+v", got, req)
	}
	for _, resp := range []protocol.HandshakeResponse{
		{ProtocolVersion: 2, AgentName: "waf", Accepted: true, Capabilities: caps},
		{ProtocolVersion: 3, AgentName: "waf", Accepted: false, Error: "version"},
	} {
		if got := CapabilityResponseFromPB(CapabilityResponseToPB(&resp)); !reflect.DeepEqual(got, resp) {
			t.Fatalf("response %+v, want %+v", got, resp)
		}
	}
	// Without accepted (the seed's shape) a response is an acceptance.
	if got := CapabilityResponseFromPB(&pb.CapabilityResponse{ProtocolVersion: 2}); !got.Accepted {
		t.Fatal("response without accepted was not an acceptance")
	}
}
