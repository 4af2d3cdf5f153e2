package exchange

import (
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/protocol"
)

// TestHeaderOpRules is the rule table of an agent's header operations:
// names must be RFC 9110 tokens, values RFC 9110 field-values (VCHAR,
// obs-text, SP, HTAB; no SP or HTAB at either end).
func TestHeaderOpRules(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		op          protocol.HeaderOpKind
		why         string // "" : allowed
	}{
		{"x-fine", "ok", protocol.HeaderSet, ""},
		{"x-fine", "a b\tc", protocol.HeaderSet, ""},
		{"x-fine", "", protocol.HeaderSet, ""},
		{"x-fine", "caf\xe9 \x80\xff", protocol.HeaderAdd, ""},
		{"x-fine", "!~\"(),/:;<=>?@[\\]{}", protocol.HeaderSet, ""},
		{"X-Fine_2!#$%&'*+-.^`|~", "v", protocol.HeaderSet, ""},
		// Values: every control but HTAB, DEL, and SP/HTAB at an end.
		{"x-v", "a\x00b", protocol.HeaderSet, "value"},
		{"x-v", "a\rb", protocol.HeaderSet, "value"},
		{"x-v", "a\nb", protocol.HeaderSet, "value"},
		{"x-v", "a\x01b", protocol.HeaderSet, "value"},
		{"x-v", "a\x0bb", protocol.HeaderAdd, "value"},
		{"x-v", "a\x0cb", protocol.HeaderAdd, "value"},
		{"x-v", "a\x1bb", protocol.HeaderSet, "value"},
		{"x-v", "a\x1fb", protocol.HeaderSet, "value"},
		{"x-v", "a\x7fb", protocol.HeaderSet, "value"},
		{"x-v", " a", protocol.HeaderSet, "value"},
		{"x-v", "a ", protocol.HeaderSet, "value"},
		{"x-v", "\ta", protocol.HeaderAdd, "value"},
		{"x-v", "a\t", protocol.HeaderAdd, "value"},
		{"x-v", " ", protocol.HeaderSet, "value"},
		// A remove carries no value to check.
		{"x-v", "a\x01b", protocol.HeaderRemove, ""},
		// Names: RFC 9110 tokens, 1–256 bytes.
		{"", "v", protocol.HeaderSet, "name"},
		{"bad name", "v", protocol.HeaderSet, "name"},
		{"x:y", "v", protocol.HeaderSet, "name"},
		{"x\x01", "v", protocol.HeaderSet, "name"},
		{"x\x7f", "v", protocol.HeaderSet, "name"},
		{"x\xe9", "v", protocol.HeaderSet, "name"},
		{"x(y)", "v", protocol.HeaderSet, "name"},
		{"x\"y", "v", protocol.HeaderSet, "name"},
		{"x/y", "v", protocol.HeaderRemove, "name"},
		{strings.Repeat("x", 257), "v", protocol.HeaderSet, "name"},
	} {
		op := protocol.HeaderOp{Op: tc.op, Name: []byte(tc.name), Value: []byte(tc.value)}
		_, why := checkOp(nil, &op)
		switch {
		case tc.why == "" && why != "":
			t.Errorf("%q: %q refused: %s", tc.name, tc.value, why)
		case tc.why != "" && !strings.Contains(why, tc.why):
			t.Errorf("%q: %q: refusal %q, want one about the %s", tc.name, tc.value, why, tc.why)
		}
	}
	// The value rule byte by byte.
	for c := 0; c < 256; c++ {
		want := c == '\t' || c == ' ' || (c >= 0x21 && c != 0x7f)
		if got := validValue([]byte{'a', byte(c), 'b'}); got != want {
			t.Errorf("validValue with byte %#02x inside = %v, want %v", c, got, want)
		}
	}
}

// TestHopName: the hop-by-hop names, any case, and the Proxy-* family;
// nothing else.
func TestHopName(t *testing.T) {
	for _, h := range hopByHop {
		for _, k := range []string{h, strings.ToUpper(h), strings.ToUpper(h[:1]) + h[1:]} {
			if !hopName([]byte(k)) {
				t.Errorf("%q: not hop-by-hop", k)
			}
		}
	}
	for _, k := range []string{"Proxy-Foo", "proxy-status", "PROXY-X"} {
		if !hopName([]byte(k)) {
			t.Errorf("%q: not hop-by-hop", k)
		}
	}
	for _, k := range []string{"", "t", "tee", "host", "content-length", "x-connection", "connections", "keep-alives", "proxy-", "proxy", "transfer-encodings", "Upgrade-Insecure-Requests", "trailers"} {
		if hopName([]byte(k)) {
			t.Errorf("%q: taken for hop-by-hop", k)
		}
	}
}
