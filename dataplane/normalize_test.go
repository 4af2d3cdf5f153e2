package dataplane

import (
	"bufio"
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/dataplane/internal/upstream"
	"github.com/zentinelproxy/sidecar/internal/config"
)

func TestValidHost(t *testing.T) {
	for _, tc := range []struct {
		h  string
		ok bool
	}{
		{"example.com", true}, {"example.com:8080", true}, {"EXAMPLE.com", true},
		{"127.0.0.1", true}, {"127.0.0.1:1", true}, {"[::1]", true}, {"[::1]:443", true},
		{"[2001:db8::1]:65535", true}, {"xn--bcher-kva.example", true}, {"a_b.example", true},
		{"", false}, {":80", false}, {"a:", false}, {"a:99999", false}, {"a:123456", false},
		{"a:8x", false}, {"a b", false}, {"a@b", false}, {"a/b", false}, {"a\\b", false},
		{"[::1", false}, {"[]", false}, {"[::1]x", false}, {"[::1]:", false}, {"[g::1]", false},
		{"a\x00", false}, {strings.Repeat("a", 300), false},
	} {
		if got := validHost([]byte(tc.h)); got != tc.ok {
			t.Errorf("validHost(%q) = %v, want %v", tc.h, got, tc.ok)
		}
	}
}

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

func TestHeaderTokens(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want bool
	}{
		{"close", true}, {"Close", true}, {"keep-alive, close", true}, {"close, x-foo", true},
		{" x-foo ,\tCLOSE\t", true}, {"closed", false}, {"x-close", false}, {"", false}, {"keep-alive", false},
	} {
		if got := hasToken([]byte(tc.v), "close"); got != tc.want {
			t.Errorf("hasToken(%q, close) = %v", tc.v, got)
		}
	}
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

func TestValidRedirectRefusesOtherSites(t *testing.T) {
	for _, tc := range []struct {
		u  string
		ok bool
	}{
		{"/login", true}, {"/", true}, {"https://a.example/x", true}, {"http://a.example", true},
		{"//evil.example/", false}, {"/\\evil.example", false}, {"\\\\evil.example", false},
		{"javascript:alert(1)", false}, {"data:text/html,x", false}, {"https:/\\evil", false},
		{"https://", false}, {"/a b", false}, {"", false},
	} {
		if got := validRedirect([]byte(tc.u)); got != tc.ok {
			t.Errorf("validRedirect(%q) = %v, want %v", tc.u, got, tc.ok)
		}
	}
}

// headState parses raw as the listener would and returns a request state
// ready for prepareRequest, or nil when fasthttp refuses the head.
func headState(raw []byte) *reqState {
	ctx := &fasthttp.RequestCtx{}
	if err := ctx.Request.Header.Read(bufio.NewReader(bytes.NewReader(raw))); err != nil {
		return nil
	}
	rs := newReqState()
	rs.srv = &Server{log: zerolog.Nop()}
	rs.lst = &listener{cfg: config.Listener{}}
	rs.ctx = ctx
	rs.decider, rs.failedClosed = -1, -1
	rs.rt = &route{name: "r", nameB: []byte("r"), up: upstream.New(config.Upstream{Name: "u"}, nil)}
	rs.start = time.Now()
	return rs
}

// FuzzRequestHead drives raw request heads through fasthttp's parser and
// the sidecar's normalisation. It must never panic; a head it refuses must
// be answered 400 with the connection closed and nothing built for the
// upstream; a head it accepts must produce an upstream head that parses
// back, in origin-form (or "*" for OPTIONS), with exactly one valid Host
// equal to what routing and agents see, and no framing header the client
// did not send.
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
	f.Fuzz(func(t *testing.T, raw []byte) {
		rs := headState(raw)
		if rs == nil {
			return // refused by the parser: answered by parseError
		}
		h := &rs.ctx.Request.Header
		if !rs.prepareRequest() {
			if rs.ctx.Response.StatusCode() != fasthttp.StatusBadRequest || !rs.closeConn || !rs.answered {
				t.Fatalf("refused head not answered 400 with close: status %d close %v", rs.ctx.Response.StatusCode(), rs.closeConn)
			}
			return
		}
		_ = rs.ctx.Path()
		host := h.Host()
		rs.upHost = host
		if len(host) == 0 {
			rs.upHost = []byte("upstream.example")
		} else if canon, n, ok := canonHost(nil, host); !ok || !bytes.Equal(canon, host) || !bytes.Equal(canon[:n], rs.host) {
			t.Fatalf("accepted Host %q (routed as %q) is not canonical: %q %v", host, rs.host, canon, ok)
		}
		var out bytes.Buffer
		bw := bufio.NewWriter(&out)
		if err := rs.writeHead(bw); err != nil {
			t.Fatal(err)
		}
		_ = bw.Flush()
		var back fasthttp.RequestHeader
		if err := back.Read(bufio.NewReader(bytes.NewReader(out.Bytes()))); err != nil {
			t.Fatalf("upstream head does not parse: %v\n%q", err, out.Bytes())
		}
		uri := back.RequestURI()
		if !(len(uri) > 0 && uri[0] == '/') && !(string(uri) == "*" && back.IsOptions()) {
			t.Fatalf("upstream target %q not in origin-form", uri)
		}
		if bytes.IndexByte(uri, '#') >= 0 {
			t.Fatalf("upstream target %q carries a fragment", uri)
		}
		if !bytes.Equal(back.Host(), rs.upHost) {
			t.Fatalf("upstream Host %q, want %q", back.Host(), rs.upHost)
		}
		hosts, te := 0, false
		for k := range back.AllInOrder() {
			switch {
			case foldEq(k, "host"):
				hosts++
			case foldEq(k, "transfer-encoding"):
				te = true
			}
		}
		if hosts != 1 || te {
			t.Fatalf("upstream head with %d Host headers, Transfer-Encoding %v:\n%q", hosts, te, out.Bytes())
		}
		rs.buildRequestView()
		if !bytes.Equal(rs.rh.URI, uri) {
			t.Fatalf("agents see %q, upstream gets %q", rs.rh.URI, uri)
		}
	})
}

// TestOriginFormFragment: an origin-form target with a '#' is refused as
// a bad target, whatever follows it; one without passes.
func TestOriginFormFragment(t *testing.T) {
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
		rs := headState([]byte("GET " + tc.target + " HTTP/1.1\r\nHost: public.example\r\n\r\n"))
		if rs == nil {
			t.Fatalf("fasthttp refused %q", tc.target)
		}
		if got := rs.prepareRequest(); got != tc.ok {
			t.Errorf("%q: accepted %v, want %v", tc.target, got, tc.ok)
			continue
		}
		if !tc.ok && (rs.srv.stats.rejected[rejectTarget].Load() != 1 || rs.ctx.Response.StatusCode() != fasthttp.StatusBadRequest || !rs.closeConn) {
			t.Errorf("%q: status %d close %v target rejections %d", tc.target, rs.ctx.Response.StatusCode(), rs.closeConn, rs.srv.stats.rejected[rejectTarget].Load())
		}
	}
}
