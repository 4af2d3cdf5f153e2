package transports_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/transports"
)

// TestAuthzOptions: check-config validates the ext_authz and http_auth
// options and refuses what the proxy does not do, naming the line.
func TestAuthzOptions(t *testing.T) {
	const tmpl = `
listeners:
  - name: l
    address: 127.0.0.1:0
upstreams:
  - name: app
    address: 127.0.0.1:9
agents:
  - name: authz
    transport: TRANSPORT
    address: ADDRESS
    options:
OPTIONS
routes:
  - name: r
    upstream: app
    agents: [authz]
`
	for _, tc := range []struct {
		transport, addr, opts string
		want                  string // "" valid, else in the error
	}{
		{"ext_authz", "127.0.0.1:9191", `      context_extensions: "a=1,b=2"
      include_tls_session: "true"
      encode_raw_headers: "false"
      tls: "true"`, ""},
		{"ext_authz", "unix:/run/opa.sock", `      context_extensions: ""`, ""},
		// Each refusal names the option's own line (options start on
		// line 13).
		{"ext_authz", "127.0.0.1:9191", `      with_request_body: "true"`, "line 13: agents[0].options.with_request_body: extauthz: invalid config: option with_request_body: not supported: the request body is not sent"},
		{"ext_authz", "127.0.0.1:9191", `      context_extensions: "a=1"
      failure_mode_allow: "true"`, "line 14: agents[0].options.failure_mode_allow"},
		{"ext_authz", "127.0.0.1:9191", `      status_on_error: "503"`, "failure_status"},
		{"ext_authz", "127.0.0.1:9191", `      context_extensions: "novalue"`, "key=value"},
		{"ext_authz", "127.0.0.1:9191", `      nonsense: "1"`, "unknown option"},
		{"ext_authz", "127.0.0.1:9191", `      tls_cert_file: /x.pem`, "go together"},
		{"http_auth", "http://127.0.0.1:4180/oauth2/auth", `      style: nginx
      auth_request_headers: "Cookie, Authorization"
      auth_response_headers: "X-Auth-Request-User,X-Auth-Request-Email"
      auth_response_headers_regex: "^X-Auth-"
      max_body: "4096"
      health_interval: 5s`, ""},
		{"http_auth", "https://auth.internal/verify", `      tls_ca_file: /ca.pem
      tls_server_name: auth`, ""},
		{"http_auth", "http://127.0.0.1:4180/", `      style: apache`, "line 13: agents[0].options.style"},
		{"http_auth", "http://127.0.0.1:4180/", `      auth_response_headers_regex: "(["`, "auth_response_headers_regex"},
		{"http_auth", "http://127.0.0.1:4180/", `      auth_response_headers: "X Bad"`, "not a header name"},
		{"http_auth", "http://127.0.0.1:4180/", `      max_body: "9999999"`, "max_body"},
		{"http_auth", "http://127.0.0.1:4180/", `      tls_ca_file: /ca.pem`, "http:// URL"},
		{"http_auth", "http://127.0.0.1:4180/", `      with_request_body: "true"`, "unknown option"},
	} {
		y := strings.NewReplacer("TRANSPORT", tc.transport, "ADDRESS", tc.addr, "OPTIONS", tc.opts).Replace(tmpl)
		cfg, err := config.Parse([]byte(y))
		if err != nil {
			t.Fatalf("%s: %v", tc.opts, err)
		}
		err = transports.Check(cfg)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.opts, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "line ")):
			t.Errorf("%s: error %v, want one with %q and a line", tc.opts, err, tc.want)
		case tc.want != "" && !errors.Is(err, config.ErrConfigInvalid):
			t.Errorf("%s: %v does not wrap ErrConfigInvalid", tc.opts, err)
		}
	}
}

// TestHTTPAuthAddress: the address of an http_auth agent is an http(s)
// URL, refused at its line otherwise.
func TestHTTPAuthAddress(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"http://127.0.0.1:4180/oauth2/auth", ""},
		{"127.0.0.1:4180", "not an http:// or https:// URL"},
		{"ftp://x/", "not an http:// or https:// URL"},
		{"http:///path", "has no host"},
		{"http://user:pw@auth/", "credentials"},
	} {
		y := `
listeners:
  - name: l
    address: 127.0.0.1:0
upstreams:
  - name: app
    address: 127.0.0.1:9
agents:
  - name: auth
    transport: http_auth
    address: "` + tc.addr + `"
routes:
  - name: r
    upstream: app
    agents: [auth]
`
		_, err := config.Parse([]byte(y))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.addr, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "line 11")):
			t.Errorf("%s: error %v, want one with %q at line 11", tc.addr, err, tc.want)
		}
	}
}
