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
		{"ext_authz", "127.0.0.1:9191", `      max_request_bytes: "8192"`, "line 13: agents[0].options.max_request_bytes: extauthz: invalid config: option max_request_bytes: not supported: use the agent's request_body.limit"},
		{"ext_authz", "127.0.0.1:9191", `      with_request_body: "true"
      pack_as_bytes: "true"`, ""},
		{"ext_authz", "127.0.0.1:9191", `      pack_as_bytes: "true"`, "pack_as_bytes without with_request_body"},
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

// TestAuthzBodyPolicy: with_request_body needs the body buffered and
// never passed unchecked, at the agent and on every route.
func TestAuthzBodyPolicy(t *testing.T) {
	for _, tc := range []struct{ agent, route, want string }{
		{"", "", ""},
		{"\n    request_body:\n      over_limit: prefix", "", ""},
		{"\n    request_body:\n      mode: streaming", "", "line 13: agents[0].request_body.mode"},
		{"\n    request_body:\n      over_limit: skip", "", "line 13: agents[0].request_body.over_limit: over_limit skip"},
		{"", "\n        request_body:\n          over_limit: stream", "line 20: routes[0].agents[0].request_body.over_limit"},
		{"", "\n        request_body:\n          limit: 2MiB", "routes[0].agents[0].request_body.limit: limit 2MiB is above"},
	} {
		y := `
listeners:
  - name: l
    address: 127.0.0.1:0
upstreams:
  - name: app
    address: 127.0.0.1:9
agents:
  - name: authz
    transport: ext_authz
    address: 127.0.0.1:9191` + tc.agent + `
    options:
      with_request_body: "true"
routes:
  - name: r
    upstream: app
    agents:
      - name: authz` + tc.route + `
`
		cfg, err := config.Parse([]byte(y))
		if err != nil {
			t.Fatalf("%v\n%s", err, y)
		}
		err = transports.Check(cfg)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s%s: %v", tc.agent, tc.route, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s%s: error %v, want one with %q", tc.agent, tc.route, err, tc.want)
		}
	}
}

// TestHTTPAuthAddresses: an http_auth agent's addresses are URLs too,
// each refused at its own line, and cannot share one unix_socket.
func TestHTTPAuthAddresses(t *testing.T) {
	for _, tc := range []struct{ addrs, opts, want string }{
		{`["http://127.0.0.1:4181/auth"]`, "", ""},
		{`["http://127.0.0.1:4181/auth", "127.0.0.1:4182"]`, "", "line 12: agents[0].addresses[1]: \"127.0.0.1:4182\" is not an http:// or https:// URL"},
		{`["http://127.0.0.1:4180/auth"]`, "", "is listed twice"},
		{`["http://127.0.0.1:4181/auth"]`, "\n    options:\n      unix_socket: /run/auth.sock", "line 12: agents[0].addresses: addresses with the unix_socket option"},
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
    address: http://127.0.0.1:4180/auth
    addresses: ` + tc.addrs + tc.opts + `
routes:
  - name: r
    upstream: app
    agents: [auth]
`
		cfg, err := config.Parse([]byte(y))
		if err == nil {
			err = transports.Check(cfg)
		}
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.addrs, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s%s: error %v, want one with %q", tc.addrs, tc.opts, err, tc.want)
		}
	}
}

// TestRouteExtAuthz: a route's ext_authz settings are for ext_authz
// agents, refused at their line otherwise; a change of a route's
// context_extensions changes the agent's instance key.
func TestRouteExtAuthz(t *testing.T) {
	const tmpl = `
listeners:
  - name: l
    address: 127.0.0.1:0
upstreams:
  - name: app
    address: 127.0.0.1:9
agents:
  - name: authz
    transport: ext_authz
    address: 127.0.0.1:9191
  - name: waf
    transport: uds
    address: /run/waf.sock
routes:
  - name: r
    upstream: app
    agents:
      - name: AGENT
        ext_authz:
SETTINGS
`
	for _, tc := range []struct{ agent, settings, want string }{
		{"authz", "          disabled: true", ""},
		{"authz", "          context_extensions: {a: \"1\"}", ""},
		{"waf", "          disabled: true", "line 20: routes[0].agents[0].ext_authz: agent \"waf\" is of transport uds"},
		{"nope", "          disabled: true", "line 19: routes[0].agents[0]: unknown agent \"nope\""},
		{"authz", "          context_extensions: {\"\": x}", "routes[0].agents[0].ext_authz.context_extensions: an empty key"},
		{"authz", "          nonsense: 1", "line 21: routes[0].agents[0].ext_authz.nonsense: unknown key"},
	} {
		y := strings.NewReplacer("AGENT", tc.agent, "SETTINGS", tc.settings).Replace(tmpl)
		cfg, err := config.Parse([]byte(y))
		if err == nil {
			err = transports.Check(cfg)
		}
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.settings, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s %s: error %v, want one with %q", tc.agent, tc.settings, err, tc.want)
		}
	}
	key := func(ext string) transports.Key {
		y := strings.NewReplacer("AGENT", "authz", "SETTINGS", "          context_extensions: {a: \""+ext+"\"}").Replace(tmpl)
		cfg, err := config.Parse([]byte(y))
		if err != nil {
			t.Fatal(err)
		}
		return transports.RouteKey(cfg, cfg.Agent("authz"))
	}
	if key("1") == key("2") || key("1") != key("1") {
		t.Error("a route's context_extensions do not decide the agent's instance key")
	}
}
