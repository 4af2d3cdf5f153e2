package agentcheck

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/examples/allowagent"
)

func TestParseExpectationsErrors(t *testing.T) {
	for _, c := range []struct{ name, in, want string }{
		{"empty", "", "empty file"},
		{"no cases", "expectations: []\n", "no expectations"},
		{"unknown key", "expectations:\n  - name: a\n    request: {uri: /}\n    expect: {decision: allow}\n    extra: 1\n", "line 5"},
		{"unknown nested key", "expectations:\n  - name: a\n    request: {uri: /, path: /x}\n    expect: {decision: allow}\n", "field path not found"},
		{"bad decision", "expectations:\n  - name: a\n    request: {uri: /}\n    expect: {decision: maybe}\n", "line 2: expectation \"a\": expect.decision \"maybe\""},
		{"relative uri", "expectations:\n  - name: a\n    request: {uri: x}\n    expect: {decision: allow}\n", "must start with /"},
		{"no name", "expectations:\n  - request: {uri: /}\n    expect: {decision: allow}\n", "name is required"},
		{"twice", "expectations:\n  - {name: a, request: {uri: /}, expect: {decision: allow}}\n  - {name: a, request: {uri: /}, expect: {decision: allow}}\n", "line 3: expectation name \"a\" used twice"},
		{"bad status", "expectations:\n  - {name: a, request: {uri: /}, expect: {decision: block, status: 42}}\n", "status 42"},
		{"bad op", "expectations:\n  - {name: a, request: {uri: /}, expect: {decision: allow, request_headers: [{name: x, op: append}]}}\n", "op \"append\""},
		{"header without name", "expectations:\n  - {name: a, request: {uri: /}, expect: {decision: allow, response_headers: [{value: x}]}}\n", "without a name"},
		{"body without response", "expectations:\n  - {name: a, request: {uri: /}, expect: {decision: allow, response_body: x}}\n", "needs a response"},
		{"crlf header", "expectations:\n  - {name: a, request: {uri: /, headers: {x: \"a\\r\\nb\"}}, expect: {decision: allow}}\n", "CR, LF"},
		{"wrong type", "expectations:\n  - {name: a, request: {uri: /}, expect: {decision: allow, status: high}}\n", "line 2"},
		{"not yaml", "expectations: [\n", "ErrExpectations"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseExpectations([]byte(c.in))
			if !errors.Is(err, ErrExpectations) {
				t.Fatalf("err %v, want ErrExpectations", err)
			}
			if c.want != "ErrExpectations" && !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %q lacks %q", err, c.want)
			}
		})
	}
	big := make([]byte, MaxExpectationsBytes+1)
	if _, err := ParseExpectations(big); !errors.Is(err, ErrExpectations) {
		t.Fatalf("oversized: %v", err)
	}
	if _, err := LoadExpectations(filepath.Join(t.TempDir(), "none.yaml")); !errors.Is(err, ErrExpectations) {
		t.Fatalf("missing file: %v", err)
	}
}

// TestExpectationsCatchPolicy: an expectation the agent does not meet is
// a FAIL naming what differs; one it meets passes.
func TestExpectationsCatchPolicy(t *testing.T) {
	x, err := ParseExpectations([]byte(`expectations:
  - name: allowed
    request: {uri: /}
    expect: {decision: allow}
  - name: wants a block
    request: {uri: /admin}
    expect: {decision: block, status: 403}
  - name: wants a header
    request: {uri: /x}
    expect: {decision: allow, request_headers: [{name: x-demo, value: "1"}]}
  - name: body passes
    request: {uri: /up, body: "a body of more than sixteen bytes, in chunks"}
    expect: {decision: allow}
`))
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, TransportUDS, allowagent.New(true))
	rep := run(t, Config{Address: addr, SkipChecks: true, Expectations: x})
	want := map[string]Status{"expect:allowed": Pass, "expect:wants a block": Fail, "expect:wants a header": Fail, "expect:body passes": Pass}
	for id, s := range want {
		r := rep.Find(id)
		if r == nil || r.Status != s {
			dump(t, rep)
			t.Fatalf("%s: %+v, want %s", id, r, s)
		}
	}
	if d := rep.Find("expect:wants a block").Detail; !strings.Contains(d, "decision allow, expected block") {
		t.Errorf("detail %q", d)
	}
	if d := rep.Find("expect:wants a header").Detail; !strings.Contains(d, "no request header operation x-demo: 1") {
		t.Errorf("detail %q", d)
	}
	if !rep.Failed() {
		t.Error("no FAIL")
	}
}

func TestExampleExpectationsFile(t *testing.T) {
	b, err := os.ReadFile("../../examples/python-agent/expectations.yaml")
	if err != nil {
		t.Fatal(err)
	}
	x, err := ParseExpectations(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(x.Cases) < 5 || x.Cases[0].line == 0 {
		t.Fatalf("%d cases, first at line %d", len(x.Cases), x.Cases[0].line)
	}
}

// FuzzParseExpectations: any input is parsed or refused with
// ErrExpectations, never a panic; what parses is valid.
func FuzzParseExpectations(f *testing.F) {
	f.Add([]byte("expectations:\n  - {name: a, request: {uri: /}, expect: {decision: allow}}\n"))
	f.Add([]byte("expectations:\n  - name: b\n    request: {method: POST, uri: /x, body: hi, headers: {a: b}}\n    response: {status: 200, body: s}\n    expect: {decision: redirect, location: /y, response_body: s}\n"))
	f.Add([]byte("expectations: [\n"))
	f.Add([]byte("{}"))
	f.Add([]byte("expectations:\n  - &a {name: a}\n  - *a\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		x, err := ParseExpectations(b)
		if err != nil {
			if !errors.Is(err, ErrExpectations) {
				t.Fatalf("error without ErrExpectations: %v", err)
			}
			return
		}
		for i := range x.Cases {
			if err := x.Cases[i].validate(); err != nil {
				t.Fatalf("parsed an invalid case: %v", err)
			}
		}
	})
}
