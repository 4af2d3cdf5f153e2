package config

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse feeds arbitrary documents to the configuration parser: it must
// never panic, and every failure must be one of its two error kinds, so
// that check-config always prints a clear message.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("../../testdata/config/*.yaml")
	for _, name := range files {
		if b, err := os.ReadFile(name); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte("listeners: [{name: a, address: 127.0.0.1:1}]\nupstreams: [{name: u, address: 127.0.0.1:2}]\nroutes: [{name: r, upstream: u}]\n"))
	f.Add([]byte("agents:\n  - name: x\n    transport: uds\n    timeouts: {message: -1s}\n"))
	f.Add([]byte("&a [*a, *a]"))
	f.Add([]byte("routes: {name: 1}\n"))
	f.Add([]byte("listeners:\n  - address: 127.0.0.1:1\n    tls:\n      certificates: [{cert_file: /x.pem, key_file: /x-key.pem, server_names: ['*.a']}]\n" +
		"      cipher_suites: [TLS_X]\n      client_auth: optional\n    max_tunnels: 2\nupstreams: [{name: u, address: 127.0.0.1:2, tls: {ca_file: /ca.pem, insecure_skip_verify: true}}]\n" +
		"routes: [{upstream: u}]\n"))
	f.Fuzz(func(t *testing.T, doc []byte) {
		c, err := Parse(doc)
		if err != nil {
			if !errors.Is(err, ErrConfigSyntax) && !errors.Is(err, ErrConfigInvalid) {
				t.Fatalf("error of unexpected kind: %v", err)
			}
			return
		}
		if c == nil {
			t.Fatal("nil config without error")
		}
	})
}
