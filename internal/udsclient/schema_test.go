package udsclient_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

// TestRepliesAreNormalized: the read path applies the protocol's schema
// (protocol.Decision.Normalize) to what the syntactic decoder returns. A
// reply that breaks it fails its own request with ErrAgentProtocol, the
// connection and the next request go on; a valid one arrives with the
// defaults applied.
func TestRepliesAreNormalized(t *testing.T) {
	replies := map[string]string{
		"no-verdict":       `{"request_id":%d}`,
		"redirect-no-url":  `{"request_id":%d,"decision":"redirect"}`,
		"op-without-name":  `{"request_id":%d,"decision":"allow","request_headers":[{"operation":"set","value":"v"}]}`,
		"bare-block":       `{"request_id":%d,"decision":"block","needs_more":true}`,
		"redirect-default": `{"request_id":%d,"decision":{"redirect":{"url":"/login","status":0}}}`,
		"needs-more":       `{"request_id":%d,"decision":{"needs_more":{}}}`,
	}
	path := testutil.SocketPath(t)
	testagent.Raw(t, path, allCaps, func(nc net.Conn, fr *uds.FrameReader) {
		answerRequestHeaders(nc, fr, func(m *protocol.RequestHeaders) []byte {
			payload := `{"request_id":%d,"decision":"allow"}`
			if r, ok := replies[string(m.Headers.Get("x-reply"))]; ok {
				payload = r
			}
			return []byte(fmt.Sprintf(payload, m.RequestID))
		})
	})
	c := newClient(t, path, nil)
	ctx := context.Background()
	for _, name := range []string{"no-verdict", "redirect-no-url", "op-without-name"} {
		if _, err := roundTrip(ctx, c, headers("x-reply", name)); !errors.Is(err, agentmux.ErrAgentProtocol) {
			t.Fatalf("%s: err = %v, want ErrAgentProtocol", name, err)
		}
		if _, err := roundTrip(ctx, c, headers()); err != nil {
			t.Fatalf("after %s: the connection did not carry on: %v", name, err)
		}
	}
	if c.Len() != 1 {
		t.Fatalf("connections = %d, want 1", c.Len())
	}
	for name, want := range map[string]struct {
		kind   protocol.DecisionKind
		status int
		final  bool
	}{
		"bare-block":       {protocol.DecisionBlock, 403, true},
		"redirect-default": {protocol.DecisionRedirect, 302, true},
		"needs-more":       {protocol.DecisionNeedsMore, 0, false},
	} {
		d, err := roundTrip(ctx, c, headers("x-reply", name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if d.Kind != want.kind || d.Status != want.status || d.Final() != want.final {
			t.Fatalf("%s: %s status %d final %v, want %s %d %v", name, d.Kind, d.Status, d.Final(), want.kind, want.status, want.final)
		}
	}
}

// answerRequestHeaders answers each RequestHeaders frame with the Decision
// payload reply returns, as written (not through the encoder), until the
// connection ends.
func answerRequestHeaders(nc net.Conn, fr *uds.FrameReader, reply func(m *protocol.RequestHeaders) []byte) {
	var m protocol.RequestHeaders
	for {
		typ, p, err := fr.Next()
		if err != nil {
			return
		}
		if typ != protocol.TypeRequestHeaders || m.Decode(p) != nil {
			continue
		}
		b, err := uds.AppendRawFrame(nil, protocol.TypeDecision, reply(&m))
		if err != nil {
			return
		}
		if _, err := nc.Write(b); err != nil {
			return
		}
	}
}
