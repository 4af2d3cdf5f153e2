package conformance

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// The client view (feature client_request): an SDK agent declares
// supports_client_request on every transport, and the view's fields
// (request_target, the client's framing and hop-by-hop headers, the
// listener and the upstream's facts in metadata) reach its handler intact.

func testClientRequest(t *testing.T, dial Dial) {
	h := &handler{Base: sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true}}}
	h.reqHeaders = func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
		var names []string
		for _, f := range m.Headers {
			names = append(names, string(f.Name)+"="+string(f.Value))
		}
		md := &m.Metadata
		d.RequestHeaderOps = append(d.RequestHeaderOps,
			setOp("x-target", string(m.RequestTarget)),
			setOp("x-uri", string(m.URI)),
			setOp("x-fields", strings.Join(names, "|")),
			setOp("x-server", string(md.ServerIP)+" "+strconv.Itoa(md.ServerPort)+" "+string(md.ListenerID)),
			setOp("x-upstream", strings.Join([]string{string(md.UpstreamHost), string(md.ForwardedFor),
				string(md.ForwardedProto), string(md.ForwardedHost), string(md.Protocol)}, "|")),
		)
		return nil
	}
	a := dial(t, h)
	ex := begin(t, a)
	defer ex.Finish()
	if !ex.Capabilities().SupportsClientRequest || !a.Capabilities().SupportsClientRequest {
		t.Fatalf("an SDK agent did not negotiate client_request: %+v", ex.Capabilities())
	}
	m := request("GET", "/",
		"host", "localhost",
		"transfer-encoding", "chunked",
		"connection", "keep-alive,keep-alive",
		"content-length", "0",
		"x-forwarded-for", "198.51.100.1",
	)
	m.RequestTarget = []byte("http://localhost")
	m.Metadata = protocol.Metadata{
		Protocol: []byte("HTTP/1.0"), ServerIP: []byte("2001:db8::2"), ServerPort: 8443, ListenerID: []byte("public"),
		UpstreamHost: []byte("app.internal:9000"), ForwardedFor: []byte("192.0.2.7"),
		ForwardedProto: []byte("https"), ForwardedHost: []byte("localhost"),
	}
	ctx, cancel := ctxWait()
	defer cancel()
	r, err := ex.RequestHeaders(agentmux.WaitFor(ctx), m)
	if err != nil {
		t.Fatal(err)
	}
	d := copyDecision(&r.Decision)
	wantOp(t, &d, "x-target", "http://localhost")
	wantOp(t, &d, "x-uri", "/")
	wantOp(t, &d, "x-fields", "host=localhost|transfer-encoding=chunked|connection=keep-alive,keep-alive|content-length=0|x-forwarded-for=198.51.100.1")
	wantOp(t, &d, "x-server", "2001:db8::2 8443 public")
	wantOp(t, &d, "x-upstream", "app.internal:9000|192.0.2.7|https|localhost|HTTP/1.0")
}
