package main

import (
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// check-config reads the TLS files: a missing file, a bad PEM block and an
// unknown cipher suite are reported with the file's path, the key and its
// line.
func TestCheckConfigTLS(t *testing.T) {
	pki := testutil.NewPKI(t, "ca")
	srv := pki.Server(t, "srv", "a.example")
	notPEM := writeFile(t, "cert.pem", "this is not PEM\n")
	doc := func(tlsBlock string) string {
		return "listeners:\n  - address: 127.0.0.1:8443\n    tls:\n" + tlsBlock +
			"upstreams: [{name: app, address: \"127.0.0.1:9000\"}]\nroutes: [{upstream: app}]\n"
	}
	for _, c := range []struct {
		name, tls string
		code      int
		want      []string
	}{
		{"valid", "      certificates: [{cert_file: " + srv.CertFile + ", key_file: " + srv.KeyFile + "}]\n", 0, []string{"OK:"}},
		{"missing file", "      certificates:\n        - cert_file: /nonexistent/tls.pem\n          key_file: " + srv.KeyFile + "\n", 1,
			[]string{"line 5", "listeners[0].tls.certificates[0].cert_file", "/nonexistent/tls.pem", "no such file"}},
		{"bad PEM", "      certificates:\n        - cert_file: " + notPEM + "\n          key_file: " + srv.KeyFile + "\n", 1,
			[]string{"line 5", notPEM, "PEM"}},
		{"unknown cipher", "      certificates: [{cert_file: " + srv.CertFile + ", key_file: " + srv.KeyFile + "}]\n      cipher_suites: [TLS_BOGUS]\n", 1,
			[]string{"line 5", "listeners[0].tls.cipher_suites", "TLS_BOGUS"}},
	} {
		path := writeFile(t, "sidecar.yaml", doc(c.tls))
		code, stdout, stderr := runMain("check-config", path)
		out := stdout
		if c.code != 0 {
			out = stderr
		}
		if code != c.code {
			t.Errorf("%s: exit %d, want %d\nstdout: %s\nstderr: %s", c.name, code, c.code, stdout, stderr)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: output lacks %q:\n%s", c.name, w, out)
			}
		}
		if c.code != 0 && !strings.Contains(out, path) {
			t.Errorf("%s: output does not name the file:\n%s", c.name, out)
		}
	}
}
