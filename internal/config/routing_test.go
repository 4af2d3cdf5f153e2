package config_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/config"
)

const routingBase = `listeners:
  - address: 127.0.0.1:8080
upstreams:
  - name: app
    address: 127.0.0.1:9000
routes:
`

// TestRoutingInvalid: every routing key is validated, the error naming
// the key and its line.
func TestRoutingInvalid(t *testing.T) {
	for _, tc := range []struct{ route, want string }{
		{"  - {name: r, upstream: app, path: x}", `line 7: routes[0].path: "x" must start with /`},
		{"  - {name: r, upstream: app, path: /x, path_prefix: /y}", `routes[0].path: only one of path_prefix, path and path_regex`},
		{"  - name: r\n    upstream: app\n    path_regex: '('", `line 9: routes[0].path_regex: invalid RE2 expression`},
		{"  - {name: r, upstream: app, methods: [\"GE T\"]}", `routes[0].methods[0]: "GE T" is not an HTTP method token`},
		{"  - name: r\n    upstream: app\n    headers:\n      - {name: x-a}", `line 10: routes[0].headers[0]: exactly one of present, exact, prefix and regex is required`},
		{"  - name: r\n    upstream: app\n    headers:\n      - {name: host, present: true}", `routes[0].headers[0].name: the host is matched by hosts`},
		{"  - name: r\n    upstream: app\n    query:\n      - {name: a, regex: '[', invert: true}", `routes[0].query[0].regex: invalid RE2 expression`},
		{"  - {name: r, upstream: app, rewrite: {prefix: v2}}", `routes[0].rewrite.prefix: "v2" is not a /path`},
		{"  - {name: r, upstream: app, path_regex: /a, rewrite: {prefix: /v2}}", `routes[0].rewrite.prefix: a prefix rewrite needs a route matched by path_prefix or path`},
		{"  - name: r\n    upstream: app\n    request_headers:\n      set: [{name: Host, value: x}]", `line 10: routes[0].request_headers.set[0].name: "Host" is refused: host header`},
		{"  - name: r\n    upstream: app\n    response_headers:\n      add: [{name: Transfer-Encoding, value: x}]", `routes[0].response_headers.add[0].name: "Transfer-Encoding" is refused: hop-by-hop header`},
		{"  - name: r\n    upstream: app\n    request_headers:\n      remove: [X-Sidecar-Fail-Open]", `routes[0].request_headers.remove[0]: "X-Sidecar-Fail-Open" is refused: sidecar marker header`},
		{"  - name: r\n    upstream: app\n    response_headers:\n      set: [{name: Location, value: 'javascript:x'}]", `routes[0].response_headers.set[0].value: a Location must be`},
		{"  - {name: r, upstream: app, direct_response: {status: 200}}", `routes[0].upstream: a route with direct_response or redirect has no upstream`},
		{"  - {name: r, direct_response: {status: 99}}", `routes[0].direct_response.status: 99 is not in 200..599`},
		{"  - {name: r, redirect: {status: 200}}", `routes[0].redirect.status: 200 is not 301, 302, 303, 307 or 308`},
		{"  - {name: r, redirect: {host: 'a b'}}", `routes[0].redirect.host: "a b" is not a host name`},
		{"  - {name: r, redirect: {path: /a, prefix_rewrite: /b}}", `routes[0].redirect.prefix_rewrite: path and prefix_rewrite exclude each other`},
		{"  - {name: r, upstream: app, timeout: -1s}", `routes[0].timeout: must not be negative`},
		{"  - name: r\n    upstream: app\n    retry: {retry_on: [5xx]}", `line 9: routes[0].retry.retry_on[0]: unknown condition "5xx"`},
		{"  - {name: r, upstream: app, retry: {retry_on: []}}", `routes[0].retry.retry_on: at least one condition is required`},
		{"  - {name: r, upstream: app, retry: {retry_on: [reset], num_retries: 11}}", `routes[0].retry.num_retries: 11 is not in 1..10`},
		{"  - {name: r, upstream: app, retry: {retry_on: [reset], budget: {percent: 101}}}", `routes[0].retry.budget.percent: 101 is not in (0, 100]`},
		{"  - {name: r, upstream: app, retry: {retry_on: [reset], backoff_base: 1s, backoff_max: 10ms}}", `routes[0].retry.backoff_max: 10ms is below backoff_base (1s)`},
		{"  - {name: r, upstream: app, rate_limit: {period: 1s}}", `routes[0].rate_limit.requests: must be at least 1`},
		{"  - {name: r, upstream: app, rate_limit: {requests: 1, key: cookie}}", `routes[0].rate_limit.key: unknown key "cookie"`},
		{"  - {name: r, upstream: app, rate_limit: {requests: 1, key: header}}", `routes[0].rate_limit.header: key: header needs a header name`},
		{"  - {name: r, upstream: app, rate_limit: {requests: 1, max_keys: 20000000}}", `routes[0].rate_limit.max_keys: 20000000 is not in 1..10000000`},
		{"  - {name: r, upstream: app, rate_limit: {requests: 1, stage: never}}", `routes[0].rate_limit.stage: unknown stage "never"`},
		{"  - {name: r, upstream: app, global_rate_limit: {descriptors: [{entries: [{route_name: true}]}]}}", `routes[0].global_rate_limit: global_rate_limit needs a rate_limit_service`},
		{"  - {name: r, upstream: app, global_rate_limit: {descriptors: [{entries: [{route_name: true, remote_address: true}]}]}}\nrate_limit_service: {address: \"127.0.0.1:1\", domain: d}", `routes[0].global_rate_limit.descriptors[0].entries[0]: exactly one of remote_address, request_header, generic_key and route_name is required`},
		{"  - {name: r, upstream: app, global_rate_limit: {descriptors: [{entries: [{request_header: x-a}]}]}}\nrate_limit_service: {address: \"127.0.0.1:1\", domain: d}", `routes[0].global_rate_limit.descriptors[0].entries[0].descriptor_key: request_header needs a descriptor_key`},
		{"  - {name: r, upstream: app}\nrate_limit_service: {address: \"127.0.0.1:1\"}", `rate_limit_service.domain: domain is required`},
		{"  - {name: r, upstream: app}\nrate_limit_service:\n  address: \"127.0.0.1:1\"\n  domain: d\n  failure_mode: open", `line 11: rate_limit_service.failure_mode: unknown failure mode "open" (want allow or deny)`},
		{"  - {name: r, upstream: app}\nrate_limit_service:\n  address: \"127.0.0.1:1\"\n  domain: d\n  tls:\n    ca_file: /nonexistent/ca.pem", `line 12: rate_limit_service.tls.ca_file: `},
		{"  - {name: r, upstream: app}\nrate_limit_service:\n  address: \"127.0.0.1:1\"\n  domain: d\n  tls: {cert_file: /nonexistent/c.pem}", `rate_limit_service.tls.key_file: key_file is required`},
		{"  - {name: r, upstream: app}\nrate_limit_service:\n  address: \"unix:/run/rls.sock\"\n  domain: d\n  tls: {}", `rate_limit_service.tls.server_name: a unix: address over TLS needs server_name`},
		{"  - name: r\n    upstream: app\n    rate_limit: {requests: 1, headers: sometimes}", `line 9: routes[0].rate_limit.headers: unknown headers "sometimes" (want on_limit or always)`},
		{"  - {name: r, upstream: app, global_rate_limit: {headers: yes, descriptors: [{entries: [{route_name: true}]}]}}\nrate_limit_service: {address: \"127.0.0.1:1\", domain: d}", `routes[0].global_rate_limit.headers: unknown headers "yes"`},
		{"listener {requests: 1, headers: never}", `listeners[0].rate_limit.headers: unknown headers "never"`},
		{"listener {requests: 1, stage: after_agents}", `line 3: listeners[0].rate_limit.stage: a listener's limit is checked before routing`},
		{"listener {requests: 0}", `listeners[0].rate_limit.requests: must be at least 1`},
		{"  - {name: r, upstream: app, methods: [GET]}\n  - {name: s, upstream: app, methods: [get]}", `routes[1].hosts[0]: host "*" with the same conditions is already routed by routes[0]`},
	} {
		doc := routingBase + tc.route + "\n"
		if strings.HasPrefix(tc.route, "listener ") {
			doc = strings.Replace(routingBase, "127.0.0.1:8080", "127.0.0.1:8080\n    rate_limit: "+strings.TrimPrefix(tc.route, "listener "), 1) + "  - {name: r, upstream: app}\n"
		}
		_, err := config.Parse([]byte(doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, config.ErrConfigInvalid) {
			t.Errorf("%s\n  error %v\n  want %q", tc.route, err, tc.want)
		}
	}
}

// TestRoutingDefaults: the defaults of the new keys.
func TestRoutingDefaults(t *testing.T) {
	c, err := config.Parse([]byte(routingBase + `  - {name: a, path: /x, direct_response: {}}
  - {name: b, path_regex: /y, redirect: {https: true}}
  - {name: c, upstream: app, retry: {retry_on: ["503"]}, rate_limit: {requests: 10}}
`))
	if err != nil {
		t.Fatal(err)
	}
	a, b, r := c.Routes[0], c.Routes[1], c.Routes[2]
	if a.PathPrefix != "" || b.PathPrefix != "" || r.PathPrefix != "/" {
		t.Errorf("path_prefix defaults %q %q %q", a.PathPrefix, b.PathPrefix, r.PathPrefix)
	}
	if a.DirectResponse.Status != 200 || b.Redirect.Status != 301 {
		t.Errorf("statuses %d %d", a.DirectResponse.Status, b.Redirect.Status)
	}
	rt, rl := r.Retry, r.RateLimit
	if rt.NumRetries != 1 || rt.BackoffBase.Milliseconds() != 25 || rt.BackoffMax.Milliseconds() != 250 || rt.Budget.Percent != 20 || rt.Budget.MinRetries != 3 {
		t.Errorf("retry defaults %+v", *rt)
	}
	if rl.Period.Seconds() != 1 || rl.Burst != 10 || rl.Key != config.RateKeyNone || rl.MaxKeys != 100000 || rl.Stage != config.RateBeforeAgents ||
		rl.Headers != config.RateHeadersOnLimit {
		t.Errorf("rate_limit defaults %+v", *rl)
	}
}

// TestRoutingUnreachable: check-config warns about a route every request
// of which an earlier route in the match order takes, naming both lines;
// routes that differ in a condition are not warned about.
func TestRoutingUnreachable(t *testing.T) {
	c, err := config.Parse([]byte(routingBase + `  - {name: api, upstream: app, path_prefix: /api/}
  - {name: api-get, upstream: app, path_prefix: /api/, methods: [GET]}
  - {name: v1, upstream: app, path_prefix: /api/v1/}
  - {name: exact, upstream: app, path: /health}
  - {name: exact-hdr, upstream: app, path: /health, headers: [{name: x-a, present: true}]}
  - {name: other-host, upstream: app, hosts: [a.example], path_prefix: /api/, methods: [GET]}
  - {name: canary, upstream: app, path_prefix: /api/, headers: [{name: x-canary, exact: "1"}], methods: [GET, POST]}
`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range c.Warnings() {
		if strings.Contains(w.Msg, "unreachable") {
			got = append(got, w.String())
		}
	}
	want := []string{
		`config: line 8: routes[1]: route "api-get" is unreachable: every request it matches is matched first by routes[0] ("api", line 7)`,
		`config: line 11: routes[4]: route "exact-hdr" is unreachable: every request it matches is matched first by routes[3] ("exact", line 10)`,
		`config: line 13: routes[6]: route "canary" is unreachable: every request it matches is matched first by routes[0] ("api", line 7)`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("warnings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestRoutingExample: examples/routing.yaml is valid and warns about
// nothing.
func TestRoutingExample(t *testing.T) {
	data, err := os.ReadFile("../../examples/routing.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := config.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range c.Warnings() {
		t.Errorf("warning: %s", w)
	}
}

// TestListenerRateLimitNoRestart: a listener whose rate_limit alone
// changed is not replaced on reload (the limit lives in the routing
// table).
func TestListenerRateLimitNoRestart(t *testing.T) {
	a := []config.Listener{{Name: "l", Address: "127.0.0.1:1", RateLimit: &config.RateLimit{Requests: 1}}}
	b := []config.Listener{{Name: "l", Address: "127.0.0.1:1", RateLimit: &config.RateLimit{Requests: 2}}}
	c := []config.Listener{{Name: "l", Address: "127.0.0.1:2"}}
	if config.ListenersNeedRestart(a, b) || !config.ListenersNeedRestart(a, c) {
		t.Fatalf("rate_limit change: %v; address change: %v", config.ListenersNeedRestart(a, b), config.ListenersNeedRestart(a, c))
	}
}
