package exchange

import (
	"bytes"
	"strings"
	"testing"
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
