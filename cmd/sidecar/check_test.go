package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// base is a valid configuration to which a case adds its lines.
const base = `listeners: [{address: "127.0.0.1:8080"}]
upstreams: [{name: app, address: "127.0.0.1:9000"}]
`

// TestCheckConfigStartChecks: check-config refuses what a start would
// refuse (the files and directories run opens), with the key and its
// line, and run refuses it the same way before starting anything.
func TestCheckConfigStartChecks(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "regular")
	empty := filepath.Join(dir, "empty-token")
	notPEM := filepath.Join(dir, "ca.pem")
	for p, content := range map[string]string{file: "x", empty: " \n", notPEM: "not PEM\n"} {
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pki := testutil.NewPKI(t, "ca")
	srv := pki.Server(t, "srv", "a.example")
	missingDir := filepath.Join(dir, "nope")
	cases := []struct {
		name, doc string
		want      []string
	}{
		{"access log in a missing directory", base + `routes: [{upstream: app}]
access_log:
  enabled: true
  output: ` + missingDir + `/access.log
`, []string{"line 6: access_log.output: access log " + missingDir + "/access.log: directory " + missingDir + " does not exist"}},
		{"access log is a directory", base + `routes: [{upstream: app}]
access_log: {enabled: true, output: ` + dir + `}
`, []string{"line 4: access_log.output: access log " + dir + ": is a directory"}},
		{"access log in a file's place", base + `routes: [{upstream: app}]
access_log: {enabled: true, output: ` + file + `/access.log}
`, []string{"line 4: access_log.output:", file + " is not a directory"}},
		{"unix listener in a missing directory", `listeners:
  - address: unix:` + missingDir + `/l.sock
upstreams: [{name: app, address: "127.0.0.1:9000"}]
routes: [{upstream: app}]
`, []string{"line 2: listeners[0].address: directory " + missingDir + " does not exist"}},
		{"unix listener on a regular file", `listeners:
  - address: unix:` + file + `
upstreams: [{name: app, address: "127.0.0.1:9000"}]
routes: [{upstream: app}]
`, []string{"line 2: listeners[0].address: " + file + " exists and is not a socket"}},
		{"grpc CA file missing", base + `agents:
  - name: g
    transport: grpc
    address: 127.0.0.1:9100
    options:
      tls: "true"
      tls_ca_file: ` + missingDir + `/ca.pem
routes: [{upstream: app, agents: [g]}]
`, []string{"line 9: agents[0].options.tls_ca_file: open " + missingDir + "/ca.pem: no such file or directory"}},
		{"grpc client key that is not the certificate's", base + `agents:
  - name: g
    transport: grpc
    address: 127.0.0.1:9100
    options: {tls: "true", tls_cert_file: ` + srv.CertFile + `, tls_key_file: ` + notPEM + `}
routes: [{upstream: app, agents: [g]}]
`, []string{"line 7: agents[0].options.tls_cert_file: loading " + srv.CertFile + " / " + notPEM}},
		{"ext_proc CA file not PEM", base + `agents:
  - name: x
    transport: ext_proc
    address: 127.0.0.1:9100
    options:
      tls_ca_file: ` + notPEM + `
routes: [{upstream: app, agents: [x]}]
`, []string{"line 8: agents[0].options.tls_ca_file: " + notPEM + ": no PEM certificate found"}},
		{"reverse token file missing", base + `agents:
  - name: r
    transport: reverse
    address: 127.0.0.1:7000
    options:
      token_file: ` + missingDir + `/token
routes: [{upstream: app, agents: [r]}]
`, []string{"line 8: agents[0].options.token_file: open " + missingDir + "/token: no such file or directory"}},
		{"reverse token file empty", base + `agents:
  - name: r
    transport: reverse
    address: 127.0.0.1:7000
    options:
      token_file: ` + empty + `
routes: [{upstream: app, agents: [r]}]
`, []string{"line 8: agents[0].options.token_file: " + empty + " is empty"}},
		{"reverse token variable unset", base + `agents:
  - name: r
    transport: reverse
    address: 127.0.0.1:7000
    options:
      token_env: SIDECAR_TEST_UNSET_TOKEN
routes: [{upstream: app, agents: [r]}]
`, []string{"line 8: agents[0].options.token_env: environment variable SIDECAR_TEST_UNSET_TOKEN is unset or empty"}},
		{"reverse socket in a missing directory", base + `agents:
  - name: r
    transport: reverse
    address: unix:` + missingDir + `/rev.sock
    options: {allow_no_token: "true"}
routes: [{upstream: app, agents: [r]}]
`, []string{"line 6: agents[0].address: directory " + missingDir + " does not exist"}},
		{"reverse TLS key missing", base + `agents:
  - name: r
    transport: reverse
    address: 127.0.0.1:7000
    options: {allow_no_token: "true", tls_cert_file: ` + srv.CertFile + `, tls_key_file: ` + missingDir + `/k.pem}
routes: [{upstream: app, agents: [r]}]
`, []string{"line 7: agents[0].options.tls_cert_file: loading " + srv.CertFile + " / " + missingDir + "/k.pem"}},
		{"unknown access log field", base + `routes: [{upstream: app}]
access_log:
  enabled: true
  fields:
    - status
    - protocl
`, []string{"line 8: access_log.fields[1]: unknown field \"protocl\" (known: time, req,"}},
	}
	if os.Geteuid() != 0 {
		ro := filepath.Join(dir, "ro")
		if err := os.Mkdir(ro, 0o500); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, struct {
			name, doc string
			want      []string
		}{"access log in a read-only directory", base + `routes: [{upstream: app}]
access_log: {enabled: true, output: ` + ro + `/access.log}
`, []string{"line 4: access_log.output: access log " + ro + "/access.log: cannot create files in " + ro + ": permission denied"}})
	}
	t.Setenv("SIDECAR_TEST_UNSET_TOKEN", "")
	os.Unsetenv("SIDECAR_TEST_UNSET_TOKEN")
	for _, c := range cases {
		path := writeFile(t, "sidecar.yaml", c.doc)
		for _, args := range [][]string{{"check-config", path}, {"run", "-config", path}} {
			code, stdout, stderr := runMain(args...)
			if code != 1 {
				t.Errorf("%s: %s: exit %d, want 1\nstdout: %s\nstderr: %s", c.name, args[0], code, stdout, stderr)
				continue
			}
			for _, w := range c.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("%s: %s: stderr lacks %q:\n%s", c.name, args[0], w, stderr)
				}
			}
		}
	}
}

// TestCheckConfigWarnings: valid settings that are probably wrong are
// warnings with their key and line, on stderr, and the check passes.
func TestCheckConfigWarnings(t *testing.T) {
	dir := testutil.SocketDir(t)
	notSocket := filepath.Join(dir, "agent.sock")
	if err := os.WriteFile(notSocket, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	doc := base + fmt.Sprintf(`agents:
  - name: slow
    transport: uds
    address: %s
    timeouts: {message: 3s, request: 2s}
  - name: idle
    transport: uds
    address: %s/idle.sock
  - name: envoy
    transport: ext_proc
    address: 127.0.0.1:9100
    request_body: {mode: buffered}
    response_body: {over_limit: prefix}
routes:
  - name: main
    upstream: app
    agents:
      - slow
      - name: envoy
        timeout: 500ms
`, notSocket, dir)
	path := writeFile(t, "sidecar.yaml", doc)
	code, stdout, stderr := runMain("check-config", path)
	if code != 0 || !strings.HasPrefix(stdout, "OK: ") || !strings.Contains(stdout, "6 warning(s)") {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	for _, w := range []string{
		"warning: " + path + ": config: line 7: agents[0].timeouts.message: 3s is above timeouts.request (2s)",
		"warning: " + path + ": config: line 8: agents[1].name: agent \"idle\" is on no route",
		"warning: " + path + ": config: line 22: routes[0].agents[1].timeout: 500ms is below agent \"envoy\"'s timeouts.message (1s)",
		"warning: " + path + ": config: line 15: agents[2].response_body.over_limit: prefix applies to request bodies",
		"warning: " + path + ": config: line 14: agents[2].request_body.mode: buffered on route \"main\" has no effect: ext_proc agent \"envoy\"'s processing_mode sends it no request body",
		"warning: " + path + ": config: line 6: agents[0].address: " + notSocket + " exists and is not a socket (a regular file)",
	} {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr lacks %q:\n%s", w, stderr)
		}
	}
}

// TestCheckConfigRoutingExample: examples/routing.yaml passes
// check-config without a warning, and a route another one shadows is
// warned about with both lines.
func TestCheckConfigRoutingExample(t *testing.T) {
	code, stdout, stderr := runMain("check-config", "../../examples/routing.yaml")
	if code != 0 || !strings.HasPrefix(stdout, "OK: ") || stderr != "" {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	path := writeFile(t, "sidecar.yaml", base+`routes:
  - name: api
    upstream: app
    path_prefix: /api/
  - name: api-get
    upstream: app
    path_prefix: /api/
    methods: [GET]
`)
	code, stdout, stderr = runMain("check-config", path)
	want := "warning: " + path + `: config: line 7: routes[1]: route "api-get" is unreachable: every request it matches is matched first by routes[0] ("api", line 4)`
	if code != 0 || !strings.Contains(stderr, want) {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s\nwant %s", code, stdout, stderr, want)
	}
}
