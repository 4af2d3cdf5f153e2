package http1

import (
	"bufio"
	"bytes"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/dataplane/internal/exchange"
	"github.com/zentinelproxy/sidecar/internal/observe"
)

func TestSplitAbsolute(t *testing.T) {
	for _, tc := range []struct {
		uri, auth, rest string
		ok              bool
	}{
		{"http://a.example/x?y", "a.example", "/x?y", true},
		{"HTTPS://A.example:8443", "A.example:8443", "", true},
		{"http://a.example?q=1", "a.example", "?q=1", true},
		{"http://[::1]:80/p", "[::1]:80", "/p", true},
		{"http://u@a.example/", "", "", false},
		{"http://u:p@a.example/", "", "", false},
		{"http://a.example/#frag", "", "", false},
		{"http:///x", "", "", false},
		{"ftp://a.example/", "", "", false},
		{"//a.example/", "", "", false},
		{"http:/a.example", "", "", false},
	} {
		auth, rest, ok := splitAbsolute([]byte(tc.uri))
		if ok != tc.ok || string(auth) != tc.auth || string(rest) != tc.rest {
			t.Errorf("splitAbsolute(%q) = %q %q %v, want %q %q %v", tc.uri, auth, rest, ok, tc.auth, tc.rest, tc.ok)
		}
	}
}

func TestObsFold(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want bool
	}{
		{"Host: a\r\nX: b\r\n\r\n", false}, {"Host: a\r\nX: b\r\n c\r\n\r\n", true},
		{"Host: a\r\n\tX: b\r\n\r\n", true}, {"Host: a\r\n", false}, {"", false},
	} {
		if got := hasObsFold([]byte(tc.raw)); got != tc.want {
			t.Errorf("hasObsFold(%q) = %v", tc.raw, got)
		}
	}
}

// TestStatusTextIsFasthttps: the exchange's reason phrases (the body of a
// fail-closed agent's answer) are the ones fasthttp writes.
func TestStatusTextIsFasthttps(t *testing.T) {
	for s := 400; s <= 599; s++ {
		if got, want := exchange.StatusText(s), fasthttp.StatusMessage(s); got != want {
			t.Errorf("%d: %q, fasthttp says %q", s, got, want)
		}
	}
}

// TestPrepareRequestCanonicalHost: after the head is prepared, the
// upstream's Host, the routing host (server_name, what agents are told)
// and X-Forwarded-Host all carry the canonical host; a Host that is
// refused is a 400 counted under "host" (or "target" when it came in an
// absolute-form target).
func TestPrepareRequestCanonicalHost(t *testing.T) {
	h := newHeadHarness(t)
	for _, tc := range []struct {
		raw, host, routed string // host "": refused
	}{
		{"GET /x HTTP/1.1\r\nHost: admin.example.\r\n\r\n", "admin.example", "admin.example"},
		{"GET /x HTTP/1.1\r\nHost: ADMIN.EXAMPLE.\r\n\r\n", "admin.example", "admin.example"},
		{"GET /x HTTP/1.1\r\nHost: admin.example.:8080\r\n\r\n", "admin.example:8080", "admin.example"},
		{"GET http://Admin.Example./x HTTP/1.1\r\nHost: public.example\r\n\r\n", "admin.example", "admin.example"},
		{"GET /x HTTP/1.1\r\nHost: public.example\r\n\r\n", "public.example", "public.example"},
		{"GET /x HTTP/1.1\r\nHost: admin.example..\r\n\r\n", "", ""},
		{"GET /x HTTP/1.1\r\nHost: adm%69n.example\r\n\r\n", "", ""},
		{"GET http://adm%69n.example/x HTTP/1.1\r\nHost: public.example\r\n\r\n", "", ""},
		{"GET /x HTTP/1.1\r\nHost: .\r\n\r\n", "", ""},
	} {
		rejHost := h.rejected(observe.RejectHost) + h.rejected(observe.RejectTarget)
		ctx := h.run([]byte(tc.raw))
		if ctx == nil {
			t.Fatalf("fasthttp refused %q", tc.raw)
		}
		head := h.up.take()
		if ok := head != nil; ok != (tc.host != "") {
			t.Errorf("%q: forwarded %v", tc.raw, ok)
			continue
		}
		if head == nil {
			if ctx.Response.StatusCode() != fasthttp.StatusBadRequest || h.rejected(observe.RejectHost)+h.rejected(observe.RejectTarget) != rejHost+1 {
				t.Errorf("%q: refused with %d, not counted", tc.raw, ctx.Response.StatusCode())
			}
			continue
		}
		var back fasthttp.RequestHeader
		if err := back.Read(bufio.NewReader(bytes.NewReader(head))); err != nil {
			t.Fatalf("%q: upstream head does not parse: %v", tc.raw, err)
		}
		_, _, routed := h.agent.seen()
		if string(back.Host()) != tc.host || string(routed) != tc.routed {
			t.Errorf("%q: Host %q routed as %q, want %q and %q", tc.raw, back.Host(), routed, tc.host, tc.routed)
		}
		if xfh := back.Peek("X-Forwarded-Host"); string(xfh) != tc.host {
			t.Errorf("%q: X-Forwarded-Host %q, want %q", tc.raw, xfh, tc.host)
		}
	}
	// A refusal of the Host itself is counted as "host".
	before := h.rejected(observe.RejectHost)
	if h.run([]byte("GET /x HTTP/1.1\r\nHost: a..b\r\n\r\n")); h.up.take() != nil || h.rejected(observe.RejectHost) != before+1 {
		t.Errorf("a..b: not refused as host (rejected %d)", h.rejected(observe.RejectHost)-before)
	}
}

// canonical reports whether host is in its canonical form (lower case,
// no trailing dot, no empty label) and names the routing host routed.
func canonical(host, routed []byte) bool {
	name := host
	if len(name) > 0 && name[0] == '[' {
		name = name[:bytes.IndexByte(name, ']')+1]
	} else if i := bytes.LastIndexByte(name, ':'); i >= 0 {
		name = name[:i]
	}
	if !bytes.Equal(name, routed) || !bytes.Equal(name, bytes.ToLower(name)) {
		return false
	}
	return name[0] == '[' || (name[0] != '.' && name[len(name)-1] != '.' && !bytes.Contains(name, []byte("..")))
}

// FuzzRequestHead drives raw request heads through fasthttp's parser,
// the front end's normalisation and the exchange's. It must never panic;
// a head it refuses must be answered 400 with the connection closed and
// nothing built for the upstream; a head it accepts must produce an
// upstream head that parses back, in origin-form (or "*" for OPTIONS),
// with exactly one valid Host equal to what routing and agents see, and
// no framing header the client did not send.
func FuzzRequestHead(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET http://admin.example/secret HTTP/1.1\r\nHost: public.example\r\n\r\n",
		"GET HTTP://A.example:80?x HTTP/1.1\r\nHost: b\r\n\r\n",
		"GET http://u@a/ HTTP/1.1\r\nHost: b\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nConnection: close, x-foo\r\nX-Foo: 1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n",
		"GET / HTTP/1.0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: [::1]:8080\r\nX-Forwarded-For: 1.2.3.4\r\n\r\n",
		"PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n",
		"GET /x HTTP/1.1\r\nHost: Admin.Example.:80\r\n\r\n",
		"GET http://admin.example./x HTTP/1.1\r\nHost: b\r\n\r\n",
		"GET /public#/../admin HTTP/1.1\r\nHost: a\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	h := newHeadHarness(f)
	f.Fuzz(func(t *testing.T, raw []byte) {
		ctx := h.run(raw)
		if ctx == nil {
			return // refused by the parser: answered by parseError
		}
		head := h.up.take()
		if head == nil {
			if ctx.Response.StatusCode() != fasthttp.StatusBadRequest || !ctx.Response.ConnectionClose() {
				t.Fatalf("refused head not answered 400 with close: status %d close %v", ctx.Response.StatusCode(), ctx.Response.ConnectionClose())
			}
			return
		}
		var back fasthttp.RequestHeader
		if err := back.Read(bufio.NewReader(bytes.NewReader(head))); err != nil {
			t.Fatalf("upstream head does not parse: %v\n%q", err, head)
		}
		uri := back.RequestURI()
		if !(len(uri) > 0 && uri[0] == '/') && !(string(uri) == "*" && back.IsOptions()) {
			t.Fatalf("upstream target %q not in origin-form", uri)
		}
		if bytes.IndexByte(uri, '#') >= 0 {
			t.Fatalf("upstream target %q carries a fragment", uri)
		}
		seenURI, seenHost, routed := h.agent.seen()
		upHost := back.Host()
		if len(routed) == 0 {
			if string(upHost) != "upstream.example" {
				t.Fatalf("a request without Host went upstream with Host %q", upHost)
			}
		} else if !canonical(upHost, routed) {
			t.Fatalf("accepted Host %q (routed as %q) is not canonical", upHost, routed)
		}
		if !bytes.Equal(seenHost, upHost) {
			t.Fatalf("agents see Host %q, upstream gets %q", seenHost, upHost)
		}
		hosts, te, cl := 0, false, false
		for k := range back.AllInOrder() {
			switch {
			case foldEq(k, "host"):
				hosts++
			case foldEq(k, "transfer-encoding"):
				te = true
			case foldEq(k, "content-length"):
				cl = true
			}
		}
		sent := ctx.Request.Header.ContentLength() // -1: the client's body is chunked
		clientCL := false
		for k := range ctx.Request.Header.AllInOrder() {
			clientCL = clientCL || foldEq(k, "content-length")
		}
		if hosts != 1 || (te && sent != -1) || (cl && !clientCL) {
			t.Fatalf("upstream head with %d Host headers, Transfer-Encoding %v, Content-Length %v (client's length %d):\n%q", hosts, te, cl, sent, head)
		}
		if !bytes.Equal(seenURI, uri) {
			t.Fatalf("agents see %q, upstream gets %q", seenURI, uri)
		}
	})
}

// TestOriginFormFragment: an origin-form target with a '#' is refused as
// a bad target, whatever follows it; one without passes.
func TestOriginFormFragment(t *testing.T) {
	h := newHeadHarness(t)
	for _, tc := range []struct {
		target string
		ok     bool
	}{
		{"/public", true},
		{"/public?a=b", true},
		{"/public%23x", true},
		{"/public#/../admin", false},
		{"/public#", false},
		{"/#", false},
		{"/a?b=#c", false},
	} {
		before := h.rejected(observe.RejectTarget)
		ctx := h.run([]byte("GET " + tc.target + " HTTP/1.1\r\nHost: public.example\r\n\r\n"))
		if ctx == nil {
			t.Fatalf("fasthttp refused %q", tc.target)
		}
		if got := h.up.take() != nil; got != tc.ok {
			t.Errorf("%q: accepted %v, want %v", tc.target, got, tc.ok)
			continue
		}
		if !tc.ok && (h.rejected(observe.RejectTarget) != before+1 || ctx.Response.StatusCode() != fasthttp.StatusBadRequest || !ctx.Response.ConnectionClose()) {
			t.Errorf("%q: status %d close %v target rejections %d", tc.target, ctx.Response.StatusCode(), ctx.Response.ConnectionClose(), h.rejected(observe.RejectTarget)-before)
		}
	}
}

// TestObsFoldRefused: a head with a folded line is refused 400 with the
// connection closed, counted under obs_fold, and nothing is forwarded
// (reading the head's fields joins the fold in fasthttp's buffer, so the
// check must come first).
func TestObsFoldRefused(t *testing.T) {
	h := newHeadHarness(t)
	for _, raw := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\n\tX: b\r\n\r\n",
	} {
		before := h.rejected(observe.RejectObsFold)
		ctx := h.run([]byte(raw))
		if ctx == nil {
			t.Fatalf("fasthttp refused %q", raw)
		}
		if h.up.take() != nil || ctx.Response.StatusCode() != fasthttp.StatusBadRequest || !ctx.Response.ConnectionClose() || h.rejected(observe.RejectObsFold) != before+1 {
			t.Errorf("%q: status %d close %v obs_fold rejections %d", raw, ctx.Response.StatusCode(), ctx.Response.ConnectionClose(), h.rejected(observe.RejectObsFold)-before)
		}
	}
}

// TestCopiedHeadIsTheFieldsHead: a response head the front end copies
// whole from the upstream's (exchange.Response.Origin) goes out byte for
// byte as the one written field by field from the exchange's list:
// specials (Content-Type, Server, cookies, Content-Length) and repeated
// fields kept in their order, the status line in HTTP/1.1 with the
// upstream's reason; the hop-by-hop fields and those a Connection header
// names are left out, and fields of one name keep their order then too.
func TestCopiedHeadIsTheFieldsHead(t *testing.T) {
	h := newHeadHarness(t)
	for _, raw := range []string{
		"HTTP/1.1 200 OK\r\nServer: up\r\nDate: Sat, 28 Nov 2026 09:00:00 GMT\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\n",
		"HTTP/1.1 200 Fine\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.0 404 Not Here\r\nKeep-Alive: timeout=5\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nX-Keep: a\r\nX-Keep: b\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 302 Found\r\nLocation: /x\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2; Path=/\r\nTrailer: X-T\r\nProxy-Authenticate: Basic\r\nUpgrade: h2c\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nConnection: content-type\r\nContent-Type: text/html\r\nContent-Encoding: gzip\r\nX-A: 1\r\nContent-Length: 0\r\n\r\n",
		// Nothing to leave out: copied whole.
		"HTTP/1.0 200 OK\r\nX-A: 1\r\nX-A: 2\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 201 Made\r\nSet-Cookie: a=1\r\nServer: up\r\nSet-Cookie: b=2\r\nContent-Encoding: br\r\nX-Keep: a\r\nVary: x\r\nX-Keep: b\r\nContent-Length: 0\r\n\r\n",
	} {
		var heads [2][]byte
		for i, copying := range []bool{false, true} {
			canned := newCanned(t, raw)
			if copying {
				h.up.answer = func() exchange.UpstreamResponse { return copyingResponse{canned} }
			} else {
				h.up.answer = func() exchange.UpstreamResponse { return canned }
			}
			ctx := h.run([]byte("HEAD / HTTP/1.1\r\nHost: a\r\n\r\n"))
			h.up.take()
			// The Date line is the server's clock, not the upstream's.
			var kept []byte
			for _, l := range bytes.SplitAfter(ctx.Response.Header.AppendBytes(nil), []byte("\r\n")) {
				if !bytes.HasPrefix(l, []byte("Date: ")) {
					kept = append(kept, l...)
				}
			}
			heads[i] = kept
		}
		h.up.answer = nil
		if !bytes.Equal(heads[0], heads[1]) {
			t.Errorf("%q:\nfield by field:\n%s\ncopied:\n%s", raw, heads[0], heads[1])
		}
		if bytes.Contains(bytes.ToLower(heads[0]), []byte("keep-alive")) || bytes.Contains(heads[0], []byte("X-Hop")) || !bytes.HasPrefix(heads[0], []byte("HTTP/1.1 ")) {
			t.Errorf("%q: hop-by-hop fields or an old version left in:\n%s", raw, heads[0])
		}
		if a, b := bytes.Index(heads[0], []byte("X-Keep: a")), bytes.Index(heads[0], []byte("X-Keep: b")); a > b {
			t.Errorf("%q: fields of one name out of order:\n%s", raw, heads[0])
		}
	}
}
