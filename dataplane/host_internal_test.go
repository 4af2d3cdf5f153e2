package dataplane

import (
	"bytes"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// TestCanonHost: one canonical spelling per host (lower case, one
// trailing dot removed, the client's port kept), and refusals for what
// two servers could read as two hosts.
func TestCanonHost(t *testing.T) {
	for _, tc := range []struct {
		in, out, host string // out "" : refused
	}{
		{"admin.example", "admin.example", "admin.example"},
		{"admin.example.", "admin.example", "admin.example"},
		{"ADMIN.EXAMPLE.", "admin.example", "admin.example"},
		{"Admin.Example.:80", "admin.example:80", "admin.example"},
		{"admin.example.:8080", "admin.example:8080", "admin.example"},
		{"admin.example:080", "admin.example:080", "admin.example"},
		{"127.0.0.1", "127.0.0.1", "127.0.0.1"},
		{"127.0.0.1.:1", "127.0.0.1:1", "127.0.0.1"},
		{"[::1]", "[::1]", "[::1]"},
		{"[2001:DB8::A]:443", "[2001:db8::a]:443", "[2001:db8::a]"},
		{"localhost", "localhost", "localhost"},
		{"a", "a", "a"},
		{"a.", "a", "a"},
		{"xn--bcher-kva.example", "xn--bcher-kva.example", "xn--bcher-kva.example"},
		// Refused: empty labels, dots only, percent-escapes, non-ASCII,
		// and everything validHost refuses.
		{"admin.example..", "", ""},
		{"admin.example..:80", "", ""},
		{"a..b", "", ""},
		{".admin.example", "", ""},
		{".", "", ""},
		{"..", "", ""},
		{".:80", "", ""},
		{"adm%69n.example", "", ""},
		{"admin.example%2e", "", ""},
		{"[::1%25eth0]", "", ""},
		{"admin.ex\xc3\xa4mple", "", ""},
		{"admin.example\x80", "", ""},
		{"", "", ""},
		{":80", "", ""},
		{"a:", "", ""},
		{"a:99999", "", ""},
		{"a b", "", ""},
		{"a@b", "", ""},
		{"[::1]x", "", ""},
		{strings.Repeat("a", 300), "", ""},
	} {
		out, n, ok := canonHost(nil, []byte(tc.in))
		if ok != (tc.out != "") || string(out) != tc.out || (ok && string(out[:n]) != tc.host) {
			t.Errorf("canonHost(%q) = %q host %q ok %v, want %q host %q", tc.in, out, out[:n], ok, tc.out, tc.host)
		}
	}
	// dst is appended to, not overwritten; the host part is after it.
	out, n, ok := canonHost([]byte("x"), []byte("A.B.:1"))
	if !ok || string(out) != "xa.b:1" || string(out[1:1+n]) != "a.b" {
		t.Errorf("canonHost with a prefix: %q %d %v", out, n, ok)
	}
}

// canonHostRef is canonHost written plainly: validHost, then the split,
// the label check and lower-casing, each a pass of its own.
func canonHostRef(h []byte) (out []byte, n int, ok bool) {
	if !validHost(h) {
		return nil, 0, false
	}
	host, port := h, []byte(nil)
	if h[0] == '[' {
		end := bytes.IndexByte(h, ']') + 1
		host, port = h[:end], h[end:]
	} else {
		if i := bytes.LastIndexByte(h, ':'); i >= 0 {
			host, port = h[:i], h[i:]
		}
		host = bytes.TrimSuffix(host, []byte("."))
		for _, label := range bytes.Split(host, []byte(".")) {
			if len(label) == 0 {
				return nil, 0, false
			}
		}
	}
	out = bytes.ToLower(host)
	return append(out, port...), len(host), true
}

// FuzzCanonHost: never a panic; canonHost agrees with canonHostRef; the
// canonical form is valid (validHost accepts it), idempotent, lower case,
// without an empty label.
func FuzzCanonHost(f *testing.F) {
	for _, s := range []string{"admin.example.", "ADMIN.EXAMPLE.:80", "a..b", ".", "[::1]:8080", "[A::B]", "adm%69n.example", "1.2.3.4.", "a.:", "\xff"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, h []byte) {
		out, n, ok := canonHost(nil, h)
		if ref, rn, rok := canonHostRef(h); ok != rok || !bytes.Equal(out, ref) || n != rn {
			t.Fatalf("canonHost(%q) = %q %d %v, the plain version %q %d %v", h, out, n, ok, ref, rn, rok)
		}
		if !ok {
			if len(out) != 0 {
				t.Fatalf("refused %q but wrote %q", h, out)
			}
			return
		}
		if !validHost(h) {
			t.Fatalf("accepted %q, which validHost refuses", h)
		}
		if !validHost(out) {
			t.Fatalf("canonical %q of %q is refused by validHost", out, h)
		}
		again, n2, ok2 := canonHost(nil, out)
		if !ok2 || !bytes.Equal(again, out) || n2 != n {
			t.Fatalf("not idempotent: %q -> %q -> %q (%v)", h, out, again, ok2)
		}
		host := out[:n]
		if !bytes.Equal(host, bytes.ToLower(host)) {
			t.Fatalf("canonical host %q of %q not lower case", host, h)
		}
		if host[0] != '[' && (host[len(host)-1] == '.' || host[0] == '.' || bytes.Contains(host, []byte(".."))) {
			t.Fatalf("canonical host %q of %q has an empty label", host, h)
		}
		if port := out[n:]; len(port) > 0 && port[0] != ':' {
			t.Fatalf("canonical %q of %q: %q after the host", out, h, port)
		}
	})
}

// TestPrepareRequestCanonicalHost: after the head is prepared, fasthttp's
// Host, rs.host (routing, server_name) and X-Forwarded-Host all carry the
// canonical host; a Host that is refused is a 400 counted under "host".
func TestPrepareRequestCanonicalHost(t *testing.T) {
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
		rs := headState([]byte(tc.raw))
		if rs == nil {
			t.Fatalf("fasthttp refused %q", tc.raw)
		}
		rejHost := rs.srv.stats.rejected[rejectHost].Load() + rs.srv.stats.rejected[rejectTarget].Load()
		ok := rs.prepareRequest()
		if ok != (tc.host != "") {
			t.Errorf("%q: prepareRequest %v", tc.raw, ok)
			continue
		}
		if !ok {
			if rs.ctx.Response.StatusCode() != fasthttp.StatusBadRequest || rs.srv.stats.rejected[rejectHost].Load()+rs.srv.stats.rejected[rejectTarget].Load() != rejHost+1 {
				t.Errorf("%q: refused with %d, not counted", tc.raw, rs.ctx.Response.StatusCode())
			}
			continue
		}
		h := &rs.ctx.Request.Header
		if string(h.Host()) != tc.host || string(rs.host) != tc.routed {
			t.Errorf("%q: Host %q routed as %q, want %q and %q", tc.raw, h.Host(), rs.host, tc.host, tc.routed)
		}
		var xfh []byte
		for _, kv := range rs.hdr {
			if eqFold(kv.name, hdrXForwardedHost) {
				xfh = kv.value
			}
		}
		if string(xfh) != tc.host {
			t.Errorf("%q: X-Forwarded-Host %q, want %q", tc.raw, xfh, tc.host)
		}
	}
	// A refusal of the Host itself is counted as "host".
	rs := headState([]byte("GET /x HTTP/1.1\r\nHost: a..b\r\n\r\n"))
	if rs.prepareRequest() || rs.srv.stats.rejected[rejectHost].Load() != 1 {
		t.Errorf("a..b: not refused as host (rejected %d)", rs.srv.stats.rejected[rejectHost].Load())
	}
}
