package supervisor

import (
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// TestAuthzBodyWarnings: a body policy of an ext_authz or http_auth agent
// that takes no such body is warned about at its line; with_request_body
// makes an ext_authz agent's request body policy count.
func TestAuthzBodyWarnings(t *testing.T) {
	const y = `
listeners:
  - name: l
    address: 127.0.0.1:0
upstreams:
  - name: app
    address: 127.0.0.1:9
agents:
  - name: opa
    transport: ext_authz
    address: 127.0.0.1:9191
    request_body: {mode: buffered}
  - name: opa-body
    transport: ext_authz
    address: 127.0.0.1:9192
    request_body: {mode: buffered}
    options: {with_request_body: "true"}
  - name: oauth2
    transport: http_auth
    address: http://127.0.0.1:4180/oauth2/auth
routes:
  - name: r
    upstream: app
    agents:
      - opa
      - opa-body
      - name: oauth2
        response_body: {mode: streaming}
`
	cfg, err := config.Parse([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range authzBodies(cfg) {
		got = append(got, w.String())
	}
	all := strings.Join(got, "\n")
	if len(got) != 2 || !strings.Contains(all, "line 12: agents[0].request_body.mode: buffered has no effect: ext_authz agent \"opa\"") ||
		!strings.Contains(all, "with_request_body") || !strings.Contains(all, "routes[0].agents[2].response_body.mode: streaming has no effect: http_auth agent \"oauth2\"") {
		t.Errorf("warnings:\n%s", all)
	}
}
