package dataplane_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

func TestAllowPassesAndSendsMetadata(t *testing.T) {
	seen := make(chan protocol.RequestHeaders, 1)
	agent := &agentFuncs{Base: sdk.Base{Caps: headersOnly()}, reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
		var c protocol.RequestHeaders
		c.Method = append([]byte(nil), m.Method...)
		c.URI = append([]byte(nil), m.URI...)
		for _, h := range m.Headers {
			c.Headers = append(c.Headers, protocol.Header{Name: append([]byte(nil), h.Name...), Value: append([]byte(nil), h.Value...)})
		}
		md := m.Metadata
		c.Metadata = protocol.Metadata{
			CorrelationID: append([]byte(nil), md.CorrelationID...),
			ClientIP:      append([]byte(nil), md.ClientIP...),
			ClientPort:    md.ClientPort,
			Protocol:      append([]byte(nil), md.Protocol...),
			ServerName:    append([]byte(nil), md.ServerName...),
			RouteID:       append([]byte(nil), md.RouteID...),
			UpstreamID:    append([]byte(nil), md.UpstreamID...),
			Traceparent:   append([]byte(nil), md.Traceparent...),
			Timestamp:     append([]byte(nil), md.Timestamp...),
		}
		seen <- c
		return nil
	}}
	p, up := setup(t, nil, []string{"a"}, map[string]sdk.Handler{"a": agent}, nil, nil)
	resp, body := p.do(t, "GET", "/api/x?y=1", nil,
		"Host", "Example.COM:8080", "X-Request-Id", "corr-123",
		"Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "X-Custom", "v")
	if resp.StatusCode != 200 || body != "hello from upstream" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	m := <-seen
	if string(m.Method) != "GET" || string(m.URI) != "/api/x?y=1" {
		t.Errorf("method/uri = %s %s", m.Method, m.URI)
	}
	md := m.Metadata
	checks := map[string][2]string{
		"correlation_id": {string(md.CorrelationID), "corr-123"},
		"client_ip":      {string(md.ClientIP), "127.0.0.1"},
		"protocol":       {string(md.Protocol), "HTTP/1.1"},
		"server_name":    {string(md.ServerName), "example.com"},
		"route_id":       {string(md.RouteID), "main"},
		"upstream_id":    {string(md.UpstreamID), "app"},
		"traceparent":    {string(md.Traceparent), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
	}
	for k, v := range checks {
		if v[0] != v[1] {
			t.Errorf("metadata %s = %q, want %q", k, v[0], v[1])
		}
	}
	if md.ClientPort == 0 || len(md.Timestamp) != len("2006-01-02T15:04:05Z") {
		t.Errorf("client_port %d timestamp %q", md.ClientPort, md.Timestamp)
	}
	for _, h := range m.Headers {
		if string(h.Name) != strings.ToLower(string(h.Name)) {
			t.Errorf("header name %q not lower case", h.Name)
		}
	}
	if v := (protocol.Headers(m.Headers)).Get("x-custom"); string(v) != "v" {
		t.Errorf("x-custom = %q", v)
	}
	got := up.last(t)
	if got.Host != "example.com:8080" {
		t.Errorf("upstream Host = %q, want the client's in canonical form", got.Host)
	}
	if got.Header.Get("X-Request-Id") != "corr-123" {
		t.Errorf("upstream X-Request-Id = %q", got.Header.Get("X-Request-Id"))
	}
}

func TestGeneratedCorrelationIDReachesUpstream(t *testing.T) {
	var corr string
	agent := &agentFuncs{Base: sdk.Base{Caps: headersOnly()}, reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
		corr = string(m.Metadata.CorrelationID)
		return nil
	}}
	p, up := setup(t, nil, []string{"a"}, map[string]sdk.Handler{"a": agent}, nil, nil)
	p.do(t, "GET", "/", nil)
	if len(corr) != 32 || up.last(t).Header.Get("X-Request-Id") != corr {
		t.Fatalf("correlation id %q, upstream X-Request-Id %q", corr, up.last(t).Header.Get("X-Request-Id"))
	}
}

func TestBlock(t *testing.T) {
	agent := &agentFuncs{Base: sdk.Base{Caps: headersOnly()}, reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
		if strings.HasPrefix(string(m.URI), "/admin") {
			d.Kind = protocol.DecisionBlock
			d.Status = 451
			d.Body = []byte("denied by policy")
			d.BlockHeaders = protocol.Headers{
				{Name: []byte("x-reason"), Value: []byte("policy")},
				{Name: []byte("content-type"), Value: []byte("text/x-denied")},
				{Name: []byte("x-bad"), Value: []byte("a\r\nInjected: yes")},
				{Name: []byte("transfer-encoding"), Value: []byte("chunked")},
			}
		}
		return nil
	}}
	p, up := setup(t, nil, []string{"a"}, map[string]sdk.Handler{"a": agent}, nil, nil)
	resp, body := p.do(t, "POST", "/admin/users", strings.NewReader("payload"))
	if resp.StatusCode != 451 || body != "denied by policy" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	if resp.Header.Get("X-Reason") != "policy" || resp.Header.Get("Content-Type") != "text/x-denied" {
		t.Errorf("headers %v", resp.Header)
	}
	if resp.Header.Get("X-Bad") != "" || resp.Header.Get("Injected") != "" || len(resp.TransferEncoding) != 0 {
		t.Errorf("unsafe block headers applied: %v %v", resp.Header, resp.TransferEncoding)
	}
	if up.count() != 0 {
		t.Fatalf("upstream contacted %d times", up.count())
	}
	if st := p.srv.Stats(); st.Blocked != 1 || st.MutationsRefused != 2 {
		t.Errorf("stats %+v", st)
	}
	// The proxy still works after a block on the same client.
	resp, body = p.do(t, "GET", "/ok", nil)
	if resp.StatusCode != 200 || body != "hello from upstream" {
		t.Fatalf("after block: %d %q", resp.StatusCode, body)
	}
}

func TestBlockDefaultStatusAndInvalidStatus(t *testing.T) {
	agent := &agentFuncs{Base: sdk.Base{Caps: headersOnly()}, reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
		d.Kind = protocol.DecisionBlock
		switch string(m.URI) {
		case "/default":
		case "/bad":
			d.Status = 700
		case "/info":
			d.Status = 101
		}
		return nil
	}}
	p, up := setup(t, nil, []string{"a"}, map[string]sdk.Handler{"a": agent}, nil, nil)
	cases := []struct {
		path string
		want int
	}{{"/default", 403}, {"/bad", 503}, {"/info", 503}}
	for _, c := range cases {
		resp, body := p.do(t, "GET", c.path, nil)
		if resp.StatusCode != c.want {
			t.Errorf("%s: status %d, want %d (%q)", c.path, resp.StatusCode, c.want, body)
		}
		if c.want == 503 && body != "service unavailable" {
			t.Errorf("%s: body %q leaks detail", c.path, body)
		}
	}
	if up.count() != 0 {
		t.Fatalf("upstream contacted")
	}
}

func TestRedirect(t *testing.T) {
	agent := &agentFuncs{Base: sdk.Base{Caps: headersOnly()}, reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
		d.Kind = protocol.DecisionRedirect
		switch string(m.URI) {
		case "/login":
			d.RedirectURL = []byte("https://login.example.com/?next=%2Fapp")
			d.Status = 307
		case "/rel":
			d.RedirectURL = []byte("/elsewhere")
		case "/js":
			d.RedirectURL = []byte("javascript:alert(1)")
		case "/crlf":
			d.RedirectURL = []byte("/x\r\nSet-Cookie: a=b")
		case "/status":
			d.RedirectURL = []byte("/x")
			d.Status = 200
		}
		return nil
	}}
	p, up := setup(t, nil, []string{"a"}, map[string]sdk.Handler{"a": agent}, nil, nil)
	cases := []struct {
		path, loc string
		want      int
	}{
		{"/login", "https://login.example.com/?next=%2Fapp", 307},
		{"/rel", "/elsewhere", 302},
		{"/js", "", 503},
		{"/crlf", "", 503},
		{"/status", "", 503},
	}
	for _, c := range cases {
		resp, _ := p.do(t, "GET", c.path, nil)
		if resp.StatusCode != c.want || resp.Header.Get("Location") != c.loc {
			t.Errorf("%s: %d %q, want %d %q", c.path, resp.StatusCode, resp.Header.Get("Location"), c.want, c.loc)
		}
		if resp.Header.Get("Set-Cookie") != "" {
			t.Errorf("%s: header injection", c.path)
		}
	}
	if up.count() != 0 {
		t.Fatalf("upstream contacted")
	}
}

func TestHeaderOperations(t *testing.T) {
	agent := &agentFuncs{Base: sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true, HandlesResponseHeaders: true}},
		reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
			d.RequestHeaderOps = append(d.RequestHeaderOps,
				protocol.HeaderOp{Op: protocol.HeaderSet, Name: []byte("x-user"), Value: []byte("42")},
				protocol.HeaderOp{Op: protocol.HeaderAdd, Name: []byte("X-Multi"), Value: []byte("two")},
				protocol.HeaderOp{Op: protocol.HeaderRemove, Name: []byte("cookie")},
			)
			d.ResponseHeaderOps = append(d.ResponseHeaderOps,
				protocol.HeaderOp{Op: protocol.HeaderAdd, Name: []byte("x-frame-options"), Value: []byte("DENY")})
			return nil
		},
		respHeaders: func(_ context.Context, m *protocol.ResponseHeaders, d *protocol.Decision) error {
			if m.StatusCode != 200 || string(m.Headers.Get("x-up")) != "1" {
				d.Kind = protocol.DecisionBlock
				return nil
			}
			if string(m.Headers.Get("x-frame-options")) != "DENY" {
				// Response-phase agents see the operations decided before them.
				d.Kind = protocol.DecisionBlock
				return nil
			}
			d.ResponseHeaderOps = append(d.ResponseHeaderOps,
				protocol.HeaderOp{Op: protocol.HeaderSet, Name: []byte("x-checked"), Value: []byte("yes")},
				protocol.HeaderOp{Op: protocol.HeaderRemove, Name: []byte("x-secret")})
			return nil
		}}
	p, up := setup(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Up", "1")
		w.Header().Set("X-Secret", "s3cr3t")
		w.Write([]byte("ok"))
	}, []string{"a"}, map[string]sdk.Handler{"a": agent}, nil, nil)
	resp, body := p.do(t, "GET", "/", nil, "Cookie", "session=1", "X-Multi", "one")
	if resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	got := up.last(t)
	if got.Header.Get("X-User") != "42" || got.Header.Get("Cookie") != "" || strings.Join(got.Header.Values("X-Multi"), ",") != "one,two" {
		t.Errorf("upstream headers %v", got.Header)
	}
	if resp.Header.Get("X-Frame-Options") != "DENY" || resp.Header.Get("X-Checked") != "yes" || resp.Header.Get("X-Secret") != "" {
		t.Errorf("response headers %v", resp.Header)
	}
}

func TestUnsafeMutationsRefused(t *testing.T) {
	agent := &agentFuncs{Base: sdk.Base{Caps: headersOnly()}, reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
		for _, op := range []protocol.HeaderOp{
			{Op: protocol.HeaderSet, Name: []byte("x-crlf"), Value: []byte("a\r\nX-Injected: 1")},
			{Op: protocol.HeaderSet, Name: []byte("x-lf"), Value: []byte("a\nb")},
			{Op: protocol.HeaderSet, Name: []byte("x-nul"), Value: []byte("a\x00b")},
			{Op: protocol.HeaderSet, Name: []byte("bad name"), Value: []byte("v")},
			{Op: protocol.HeaderSet, Name: []byte("connection"), Value: []byte("close")},
			{Op: protocol.HeaderSet, Name: []byte("Keep-Alive"), Value: []byte("timeout=5")},
			{Op: protocol.HeaderSet, Name: []byte("upgrade"), Value: []byte("websocket")},
			{Op: protocol.HeaderSet, Name: []byte("proxy-authorization"), Value: []byte("x")},
			{Op: protocol.HeaderSet, Name: []byte("host"), Value: []byte("evil.example")},
			{Op: protocol.HeaderSet, Name: []byte("content-length"), Value: []byte("0")},
			{Op: protocol.HeaderSet, Name: []byte("transfer-encoding"), Value: []byte("chunked")},
			{Op: protocol.HeaderRemove, Name: []byte("host")},
			{Op: protocol.HeaderSet, Name: []byte("x-fine"), Value: []byte("ok")},
		} {
			d.RequestHeaderOps = append(d.RequestHeaderOps, op)
		}
		d.ResponseHeaderOps = append(d.ResponseHeaderOps,
			protocol.HeaderOp{Op: protocol.HeaderSet, Name: []byte("set-cookie"), Value: []byte("a=b\r\nX-Evil: 1")},
			protocol.HeaderOp{Op: protocol.HeaderSet, Name: []byte("content-length"), Value: []byte("1")})
		return nil
	}}
	p, up := setup(t, nil, []string{"a"}, map[string]sdk.Handler{"a": agent}, nil, nil)
	resp, body := p.do(t, "POST", "/", strings.NewReader("body!"))
	if resp.StatusCode != 200 || body != "hello from upstream" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	got := up.last(t)
	for _, h := range []string{"X-Crlf", "X-Lf", "X-Nul", "X-Injected", "Bad Name", "Keep-Alive", "Upgrade", "Proxy-Authorization"} {
		if got.Header.Get(h) != "" {
			t.Errorf("upstream got refused header %s: %q", h, got.Header.Get(h))
		}
	}
	if got.Host != p.addr || string(got.Body) != "body!" || got.CL != 5 {
		t.Errorf("upstream host %q body %q cl %d", got.Host, got.Body, got.CL)
	}
	if got.Header.Get("X-Fine") != "ok" {
		t.Errorf("allowed op not applied")
	}
	if resp.Header.Get("X-Evil") != "" || resp.Header.Get("Set-Cookie") != "" {
		t.Errorf("response got refused header: %v", resp.Header)
	}
	if st := p.srv.Stats(); st.MutationsRefused != 14 {
		t.Errorf("refused %d, want 14", st.MutationsRefused)
	}
	if !strings.Contains(p.logs.String(), "agent header operations refused") {
		t.Errorf("refusal not logged")
	}
}

func TestHopByHopAndForwardedHeaders(t *testing.T) {
	p, up := setup(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "X-Up-Hop")
		w.Header().Set("X-Up-Hop", "1")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("Proxy-Authenticate", "Basic")
		w.Write([]byte("ok"))
	}, nil, nil, nil, nil)
	resp, _ := p.do(t, "GET", "/", nil,
		"Host", "svc.example",
		"Connection", "keep-alive, X-Hop",
		"X-Hop", "1", "Keep-Alive", "timeout=5", "Proxy-Authorization", "Basic x", "Proxy-Foo", "y",
		"Te", "trailers", "Upgrade", "websocket",
		"X-Forwarded-For", "6.6.6.6", "X-Forwarded-Proto", "https")
	got := up.last(t)
	for _, h := range []string{"X-Hop", "Keep-Alive", "Proxy-Authorization", "Proxy-Foo", "Te", "Upgrade"} {
		if v := got.Header.Get(h); v != "" {
			t.Errorf("upstream got hop-by-hop %s: %q", h, v)
		}
	}
	if c := got.Header.Get("Connection"); c != "" && !strings.EqualFold(c, "keep-alive") {
		t.Errorf("upstream Connection %q", c)
	}
	if xff := got.Header.Get("X-Forwarded-For"); xff != "127.0.0.1" {
		t.Errorf("X-Forwarded-For %q (untrusted client value must be replaced)", xff)
	}
	if got.Header.Get("X-Forwarded-Proto") != "http" || got.Header.Get("X-Forwarded-Host") != "svc.example" {
		t.Errorf("forwarded proto %q host %q", got.Header.Get("X-Forwarded-Proto"), got.Header.Get("X-Forwarded-Host"))
	}
	for _, h := range []string{"X-Up-Hop", "Keep-Alive", "Proxy-Authenticate"} {
		if v := resp.Header.Get(h); v != "" {
			t.Errorf("client got hop-by-hop %s: %q", h, v)
		}
	}
}

func TestHeadersForwardedVerbatim(t *testing.T) {
	var view protocol.Headers
	agent := &agentFuncs{Base: sdk.Base{Caps: headersOnly()}, reqHeaders: func(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
		for _, h := range m.Headers {
			view = append(view, protocol.Header{Name: append([]byte(nil), h.Name...), Value: append([]byte(nil), h.Value...)})
		}
		d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderSet, Name: []byte("x-set"), Value: []byte("new")})
		return nil
	}}
	p, up := setup(t, nil, []string{"a"}, map[string]sdk.Handler{"a": agent}, nil, func(m map[string]any) {})
	cookie := `a=b;  c="d e"; flag; =v`
	resp, _ := p.do(t, "POST", "/p?q=%2F", strings.NewReader("xyz"),
		"Cookie", cookie, "X-Set", "old1", "X-Set", "old2", "X-Spaces", "a  b")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	got := up.last(t)
	if got.Header.Get("Cookie") != cookie || got.Header.Get("X-Spaces") != "a  b" || got.URI != "/p?q=%2F" {
		t.Errorf("cookie %q spaces %q uri %q", got.Header.Get("Cookie"), got.Header.Get("X-Spaces"), got.URI)
	}
	if v := got.Header.Values("X-Set"); len(v) != 1 || v[0] != "new" {
		t.Errorf("x-set %v: set replaces every value", v)
	}
	if string(view.Get("cookie")) != cookie || string(view.Get("content-length")) != "3" || string(view.Get("host")) != p.addr {
		t.Errorf("agent view %q", view)
	}
}

func TestTrustedForwardedHeaders(t *testing.T) {
	u := newUpstream(t, nil)
	cfg := configText(t, strings.Replace(oneAgentConfig, "    disconnect_check: 20ms", "    disconnect_check: 20ms\n    trust_forwarded: true", 1),
		map[string]any{"Upstream": u.addr(), "Chain": ""})
	p := startProxy(t, cfg, nil, nil)
	p.do(t, "GET", "/", nil, "X-Forwarded-For", "10.0.0.1", "X-Forwarded-For", "10.0.0.2", "X-Forwarded-Proto", "https", "X-Forwarded-Host", "public.example")
	got := u.last(t)
	if xff := got.Header.Values("X-Forwarded-For"); len(xff) != 1 || xff[0] != "10.0.0.1, 10.0.0.2, 127.0.0.1" {
		t.Errorf("X-Forwarded-For %q", xff)
	}
	if got.Header.Get("X-Forwarded-Proto") != "https" || got.Header.Get("X-Forwarded-Host") != "public.example" {
		t.Errorf("proto %q host %q", got.Header.Get("X-Forwarded-Proto"), got.Header.Get("X-Forwarded-Host"))
	}
}

func TestResponseHeadersHasBody(t *testing.T) {
	got := make(chan bool, 4)
	agent := &agentFuncs{Base: sdk.Base{Caps: protocol.Capabilities{HandlesResponseHeaders: true}},
		respHeaders: func(_ context.Context, m *protocol.ResponseHeaders, d *protocol.Decision) error {
			got <- m.HasBody
			return nil
		}}
	p, _ := setup(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/empty" {
			w.WriteHeader(204)
			return
		}
		w.Write([]byte("body"))
	}, []string{"a"}, map[string]sdk.Handler{"a": agent}, nil, nil)
	for _, c := range []struct {
		method, path string
		want         bool
	}{{"GET", "/", true}, {"HEAD", "/", false}, {"GET", "/empty", false}} {
		p.do(t, c.method, c.path, nil)
		if b := <-got; b != c.want {
			t.Errorf("%s %s: has_body %v, want %v", c.method, c.path, b, c.want)
		}
	}
}
