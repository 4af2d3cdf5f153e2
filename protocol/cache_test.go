package protocol

import (
	"errors"
	"testing"
)

func TestDecisionCacheDirective(t *testing.T) {
	cases := []struct {
		in   string
		want CacheDirective
		out  string // the canonical "cache" member, "" when omitted
	}{
		{`{"request_id":1,"decision":"allow"}`, CacheDirective{}, ``},
		{`{"request_id":1,"decision":"allow","cache":null}`, CacheDirective{}, ``},
		{`{"request_id":1,"decision":"allow","cache":{"ttl_ms":2500}}`, CacheDirective{TTLMs: 2500}, `,"cache":{"ttl_ms":2500}}`},
		{`{"request_id":1,"decision":"allow","cache":"no_store"}`, CacheDirective{NoStore: true}, `,"cache":"no_store"}`},
		{`{"request_id":1,"decision":"allow","cache":"NO_STORE"}`, CacheDirective{NoStore: true}, `,"cache":"no_store"}`},
		// no_store wins over a TTL (Normalize); unknown members are skipped.
		{`{"request_id":1,"decision":"allow","cache":{"no_store":true,"ttl_ms":5,"later":{}}}`, CacheDirective{NoStore: true}, `,"cache":"no_store"}`},
	}
	for _, c := range cases {
		var d Decision
		if err := d.Decode([]byte(c.in)); err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if err := d.Normalize(); err != nil {
			t.Fatalf("%s: normalize: %v", c.in, err)
		}
		if d.Cache != c.want {
			t.Errorf("%s: cache %+v, want %+v", c.in, d.Cache, c.want)
		}
		enc := string(AppendDecision(nil, &d))
		tail := enc[len(enc)-len(c.out):]
		if c.out == "" {
			tail = ""
		}
		if tail != c.out || (c.out == "" && containsCache(enc)) {
			t.Errorf("%s: encoded %s, want it to end in %s", c.in, enc, c.out)
		}
		var back Decision
		if err := back.Decode([]byte(enc)); err != nil || back.Cache != d.Cache {
			t.Errorf("%s: round trip %+v (%v)", c.in, back.Cache, err)
		}
	}
}

func containsCache(s string) bool {
	for i := 0; i+8 <= len(s); i++ {
		if s[i:i+8] == `"cache":` {
			return true
		}
	}
	return false
}

func TestDecisionCacheDirectiveErrors(t *testing.T) {
	for _, in := range []string{
		`{"request_id":1,"decision":"allow","cache":"forever"}`,
		`{"request_id":1,"decision":"allow","cache":5}`,
		`{"request_id":1,"decision":"allow","cache":{"ttl_ms":-1}}`,
		`{"request_id":1,"decision":"allow","cache":{"ttl_ms":4294967296}}`,
		`{"request_id":1,"decision":"allow","cache":{"no_store":"yes"}}`,
	} {
		var d Decision
		err := d.Decode([]byte(in))
		if err == nil {
			t.Errorf("%s: no error", in)
			continue
		}
		if !errors.Is(err, ErrProtocolField) && !errors.Is(err, ErrProtocolSyntax) {
			t.Errorf("%s: %v wraps no field error", in, err)
		}
	}
}
