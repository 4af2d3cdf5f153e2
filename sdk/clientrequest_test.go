package sdk_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/uds"
)

// handshakeCaps runs a proxy's handshake offering features against
// ServeConn with opts and returns the capabilities the agent answered.
func handshakeCaps(t *testing.T, opts *sdk.Options, features ...string) protocol.Capabilities {
	t.Helper()
	proxy, agent := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- sdk.ServeConn(ctx, agent, sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true}}, opts)
	}()
	defer func() {
		cancel()
		_ = proxy.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("ServeConn did not return")
		}
	}()
	_ = proxy.SetDeadline(time.Now().Add(10 * time.Second))
	req := protocol.HandshakeRequest{ProtocolVersion: 2, ClientName: "test", SupportedFeatures: features}
	if err := uds.WriteFrame(proxy, &req); err != nil {
		t.Fatal(err)
	}
	typ, p, err := uds.NewFrameReader(proxy).Next()
	if err != nil || typ != protocol.TypeHandshakeResponse {
		t.Fatalf("handshake answer: type %s, %v", typ, err)
	}
	var resp protocol.HandshakeResponse
	if err := protocol.DecodeHandshakeResponse(p, &resp); err != nil {
		t.Fatal(err)
	}
	return resp.Capabilities
}

// TestClientRequestDeclaredByDefault: the SDK declares
// supports_client_request to a proxy that offers client_request, not to
// one that does not, and never with NoClientRequest.
func TestClientRequestDeclaredByDefault(t *testing.T) {
	for _, tc := range []struct {
		name     string
		opts     *sdk.Options
		features []string
		want     bool
	}{
		{"offered", &sdk.Options{JSONPayloads: true}, []string{protocol.FeatureClientRequest}, true},
		{"not offered", &sdk.Options{JSONPayloads: true}, []string{protocol.FeatureCancellation}, false},
		{"offered, turned off", &sdk.Options{JSONPayloads: true, NoClientRequest: true}, []string{protocol.FeatureClientRequest}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := handshakeCaps(t, tc.opts, tc.features...).SupportsClientRequest; got != tc.want {
				t.Fatalf("supports_client_request %v, want %v", got, tc.want)
			}
		})
	}
}

// TestReverseNoClientRequest: a registration declares
// supports_client_request unless NoClientRequest is set.
func TestReverseNoClientRequest(t *testing.T) {
	for _, off := range []bool{false, true} {
		path := testutil.SocketPath(t)
		reqs, _, _ := fakeProxy(t, path, protocol.EncodingJSON)
		serveReverse(t, sdk.ReverseConfig{Address: path, AgentID: "waf-1", Token: "t", NoClientRequest: off,
			BackoffMin: time.Millisecond, BackoffMax: time.Millisecond})
		if req := recv(t, reqs); req.Capabilities.SupportsClientRequest == off {
			t.Fatalf("NoClientRequest=%v: registration capabilities %+v", off, req.Capabilities)
		}
	}
}
