package config_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// hostsConfig is a config whose only route has hosts: [<hosts>].
func hostsConfig(hosts string) string {
	return fmt.Sprintf(`listeners:
  - address: 127.0.0.1:8080
upstreams:
  - name: app
    address: 127.0.0.1:9000
routes:
  - name: r
    upstream: app
    hosts: [%s]
`, hosts)
}

// TestRouteHostsCanonical: a route's hosts are valid in canonical form
// (one trailing dot, any case) and refused where a request's Host would
// be (an empty label, a percent-escape, a dot-only name); two spellings
// of one host on one path prefix are one route too many.
func TestRouteHostsCanonical(t *testing.T) {
	for _, tc := range []struct {
		hosts string
		err   string // "" when valid
	}{
		{`Admin.Example.`, ""},
		{`"*.Example."`, ""},
		{`"*"`, ""},
		{`admin.example, other.example.`, ""},
		{`admin.example..`, `routes[0].hosts[0]: "admin.example.." is not a host name`},
		{`.admin.example`, `routes[0].hosts[0]: ".admin.example" is not a host name`},
		{`a..b`, `routes[0].hosts[0]: "a..b" is not a host name`},
		{`"."`, `routes[0].hosts[0]: "." is not a host name`},
		{`"*."`, `routes[0].hosts[0]: "*." is not a host name`},
		{`"adm%69n.example"`, `routes[0].hosts[0]: "adm%69n.example" is not a host name`},
		{`"admin.exämple"`, `routes[0].hosts[0]: "admin.exämple" is not a host name`},
		{`admin.example, Admin.Example.`, `routes[0].hosts[1]: host "Admin.Example." with path_prefix "/" is already routed by routes[0]`},
	} {
		_, err := config.Parse([]byte(hostsConfig(tc.hosts)))
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("hosts [%s] refused: %v", tc.hosts, err)
		case tc.err != "" && err == nil:
			t.Errorf("hosts [%s] accepted, want %q", tc.hosts, tc.err)
		case tc.err != "" && (!strings.Contains(err.Error(), tc.err) || !errors.Is(err, config.ErrConfigInvalid)):
			t.Errorf("hosts [%s]: error %v, want %q", tc.hosts, err, tc.err)
		}
	}
}

func TestCanonicalHost(t *testing.T) {
	for in, want := range map[string]string{
		"Admin.Example.": "admin.example", "admin.example": "admin.example", "*.Example.": "*.example",
		"*": "*", "API.example.com": "api.example.com",
	} {
		if got := config.CanonicalHost(in); got != want {
			t.Errorf("CanonicalHost(%q) = %q, want %q", in, got, want)
		}
	}
}
