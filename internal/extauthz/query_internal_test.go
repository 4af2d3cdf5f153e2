package extauthz

import (
	"errors"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/zentinelproxy/sidecar/internal/authcall"
)

// TestRewriteQuery holds rewriteQuery to Envoy's QueryParamsMulti: split
// at '&' (an empty piece is a parameter with an empty name), names up to
// the first '=', nothing decoded, written sorted by name, values in
// order, a query without parameters dropped.
func TestRewriteQuery(t *testing.T) {
	set := func(kv ...string) []*corev3.QueryParameter {
		var out []*corev3.QueryParameter
		for i := 0; i+1 < len(kv); i += 2 {
			out = append(out, &corev3.QueryParameter{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	for _, tc := range []struct {
		uri    string
		set    []*corev3.QueryParameter
		remove []string
		want   string
	}{
		{"/p", set("a", "1"), nil, "a=1"},
		{"/p?", set("a", "1"), nil, "a=1"},
		{"/p?b=2&a=0", set("a", "1"), nil, "a=1&b=2"},
		{"/p?a=1&a=2&b", nil, []string{"b"}, "a=1&a=2"},
		{"/p?a=1", nil, []string{"a"}, ""},
		{"/p?a=1&", nil, []string{"x"}, "a=1"},
		{"/p?a=1&&b=2", nil, []string{"x"}, "=&a=1&b=2"},
		{"/p?x=a=b&y=%41", set("y", "%42"), nil, "x=a=b&y=%42"},
		{"/p?B=1&a=2", set("C", "3"), nil, "B=1&C=3&a=2"},
		{"/p?a=1", set("a", "2"), []string{"a"}, ""},
		{"/p?v=1", set("v", "a=b?c/d"), nil, "v=a=b?c/d"},
	} {
		got, err := rewriteQuery(nil, []byte(tc.uri), tc.set, tc.remove)
		if err != nil || string(got) != tc.want {
			t.Errorf("%s set %v remove %v: %q, %v; want %q", tc.uri, tc.set, tc.remove, got, err, tc.want)
		}
	}
	for _, bad := range [][2]string{{"", "1"}, {"a&b", "1"}, {"a=b", "1"}, {"a", "1&admin=1"}, {"a", "1#x"}, {"a", "x y"}, {"a", "\xe9"}, {"a\n", "1"}} {
		if _, err := rewriteQuery(nil, []byte("/p"), set(bad[0], bad[1]), nil); !errors.Is(err, authcall.ErrBadAnswer) {
			t.Errorf("set %q=%q: %v, want a refusal", bad[0], bad[1], err)
		}
	}
}
