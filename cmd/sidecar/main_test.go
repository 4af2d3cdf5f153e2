package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runMain(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = sidecarMain(args, &o, &e)
	return code, o.String(), e.String()
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCheckConfig(t *testing.T) {
	tests := []struct {
		name    string
		content string
		code    int
		want    []string // substrings of stdout (code 0) or stderr
	}{
		{name: "embedded demo config", content: string(demoConfig), want: []string{"OK:", "1 agent(s)"}},
		{
			name: "unknown key",
			content: `listeners:
  - name: a
    address: 127.0.0.1:8080
    adress: typo
upstreams: [{name: app, address: "127.0.0.1:9000"}]
routes: [{upstream: app}]
`,
			code: 1, want: []string{"line 4", "adress"},
		},
		{
			name: "missing upstream",
			content: `listeners: [{address: "127.0.0.1:8080"}]
upstreams: [{name: app, address: "127.0.0.1:9000"}]
routes:
  - name: r
    upstream: nope
`,
			code: 1, want: []string{"line 5", "routes[0].upstream"},
		},
		{name: "not yaml", content: "listeners: [\n", code: 1, want: []string{"config"}},
		{
			name: "unknown grpc option",
			content: `listeners: [{address: "127.0.0.1:8080"}]
upstreams: [{name: app, address: "127.0.0.1:9000"}]
agents:
  - name: g
    transport: grpc
    address: 127.0.0.1:9100
    options:
      tls_ca: /etc/ca.pem
routes: [{upstream: app, agents: [g]}]
`,
			code: 1, want: []string{"line 7", "agents[0].options", "tls_ca", "unknown option"},
		},
		{
			name: "uds takes no options",
			content: `listeners: [{address: "127.0.0.1:8080"}]
upstreams: [{name: app, address: "127.0.0.1:9000"}]
agents:
  - name: u
    transport: uds
    address: /run/u.sock
    options: {x: "1"}
routes: [{upstream: app, agents: [u]}]
`,
			code: 1, want: []string{"line 7", "agents[0].options"},
		},
		{
			name: "reverse without token source",
			content: `listeners: [{address: "127.0.0.1:8080"}]
upstreams: [{name: app, address: "127.0.0.1:9000"}]
agents:
  - name: r
    transport: reverse
    address: 127.0.0.1:7000
routes: [{upstream: app, agents: [r]}]
`,
			code: 1, want: []string{"agents[0]", "token"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, "sidecar.yaml", tc.content)
			code, stdout, stderr := runMain("check-config", path)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.code, stdout, stderr)
			}
			out := stdout
			if tc.code != 0 {
				out = stderr
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
	// A file that cannot be read is not a syntax error.
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	for _, args := range [][]string{{"check-config", missing}, {"run", "-config", missing}} {
		code, _, stderr := runMain(args...)
		if want := "sidecar: config: cannot read " + missing + ": no such file or directory\n"; code != 1 || stderr != want {
			t.Errorf("%v: exit %d, %q; want %q", args, code, stderr, want)
		}
	}
}

func TestUsage(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "Usage:"},
		{[]string{"-h"}, 0, "sidecar demo"},
		{[]string{"help"}, 0, "check-config FILE"},
		{[]string{"bogus"}, 2, `unknown command "bogus"`},
		{[]string{"check-config"}, 2, "Usage: sidecar check-config FILE"},
		{[]string{"run"}, 2, "-config is required"},
		{[]string{"-config"}, 2, "flag needs an argument"},
		{[]string{"demo", "-h"}, 0, "-agent-transport"},
		{[]string{"demo", "-print-config"}, 0, "listeners:"},
		{[]string{"demo", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"version"}, 0, "sidecar "},
		{[]string{"sleep", "0s"}, 0, ""},
		{[]string{"sleep", "0"}, 0, ""},
		{[]string{"sleep"}, 2, "sleep: DURATION is required"},
		{[]string{"sleep", "soon"}, 2, `sleep: "soon" is not a duration (5s, 1m) or a number of seconds`},
		{[]string{"sleep", "2h"}, 2, "sleep: 2h0m0s is not in 0..1h0m0s"},
	}
	for _, tc := range tests {
		code, stdout, stderr := runMain(tc.args...)
		if code != tc.code || !strings.Contains(stdout+stderr, tc.want) {
			t.Errorf("%q: exit %d (want %d), output lacks %q:\n%s%s", tc.args, code, tc.code, tc.want, stdout, stderr)
		}
	}
	// A command without flags prints no empty "Flags:" section.
	_, _, stderr := runMain("check-config")
	if !strings.HasPrefix(stderr, "check-config: FILE is required\nUsage: sidecar check-config FILE\n\nValidates FILE") || strings.Contains(stderr, "Flags:") {
		t.Errorf("check-config usage:\n%s", stderr)
	}
}
