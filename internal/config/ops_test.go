package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/config"
)

func TestOpsDefaults(t *testing.T) {
	c, err := config.Parse([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Admin.On() || !c.Admin.MetricsOn() || c.Admin.Address != config.DefaultAdminAddress {
		t.Errorf("admin defaults %+v", c.Admin)
	}
	if c.AccessLog.Enabled || c.AccessLog.Output != "stdout" || c.AccessLog.SampleEvery != 1 {
		t.Errorf("access log defaults %+v", c.AccessLog)
	}
}

func TestOpsSettings(t *testing.T) {
	cases := []struct {
		name, yaml             string
		admin, metrics, access bool
		addr, output           string
		every                  int
	}{
		{"admin off", "admin: {enabled: false}\n", false, false, false, config.DefaultAdminAddress, "stdout", 1},
		{"metrics off", "admin: {metrics: false, address: \"0.0.0.0:9902\"}\n", true, false, false, "0.0.0.0:9902", "stdout", 1},
		{"port 0", "admin: {address: \"127.0.0.1:0\"}\n", true, true, false, "127.0.0.1:0", "stdout", 1},
		{"access log", "access_log: {enabled: true, output: /var/log/sidecar/access.log, sample_every: 100}\n",
			true, true, true, config.DefaultAdminAddress, "/var/log/sidecar/access.log", 100},
		{"access log stderr", "access_log:\n  enabled: true\n  output: stderr\n", true, true, true, config.DefaultAdminAddress, "stderr", 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := config.Parse([]byte(base + tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if c.Admin.On() != tc.admin || c.Admin.MetricsOn() != tc.metrics || c.Admin.Address != tc.addr {
				t.Errorf("admin %+v: on %v metrics %v", c.Admin, c.Admin.On(), c.Admin.MetricsOn())
			}
			if c.AccessLog.Enabled != tc.access || c.AccessLog.Output != tc.output || c.AccessLog.SampleEvery != tc.every {
				t.Errorf("access log %+v", c.AccessLog)
			}
		})
	}
}

// TestBadOpsConfigs: each error names the key and its line.
func TestBadOpsConfigs(t *testing.T) {
	cases := []struct {
		name, yaml, want string
	}{
		{"admin no port", "admin: {address: localhost}\n", `config: line 14: admin.address: "localhost" is not host:port`},
		{"admin bad port", "admin:\n  address: \"127.0.0.1:99999\"\n", `config: line 15: admin.address: invalid port "99999"`},
		{"admin unix", "admin: {address: \"unix:/run/admin.sock\"}\n", `config: line 14: admin.address: the admin listener takes host:port`},
		{"admin on a data listener", "admin: {address: \"127.0.0.1:8080\"}\n", `config: line 14: admin.address: address "127.0.0.1:8080" is also used by listeners[0]`},
		{"admin bad host", "admin: {address: \"a b:9901\"}\n", `config: line 14: admin.address: invalid host "a b"`},
		{"admin enabled not bool", "admin: {enabled: maybe}\n", `config: line 14: admin.enabled: invalid boolean "maybe"`},
		{"sample_every negative", "access_log:\n  enabled: true\n  sample_every: -2\n", `config: line 16: access_log.sample_every: must be at least 1`},
		{"access log unknown key", "access_log: {enable: true}\n", `config: line 14: access_log.enable: unknown key`},
		{"access log blank output", "access_log: {output: \" \"}\n", `config: line 14: access_log.output: output is required`},
		{"access log unknown field", "access_log:\n  fields: [status, protocl]\n", `config: line 15: access_log.fields[1]: unknown field "protocl" (known: time, req, corr,`},
		{"access log field twice", "access_log:\n  fields:\n    - status\n    - status\n", `config: line 17: access_log.fields[1]: "status" is listed twice`},
		{"access log no field", "access_log: {fields: []}\n", `config: line 14: access_log.fields: lists no field`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := config.Parse([]byte(base + c.yaml))
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.HasPrefix(err.Error(), c.want) {
				t.Errorf("error %q\nwant prefix %q", err, c.want)
			}
			if !errors.Is(err, config.ErrConfigInvalid) && !errors.Is(err, config.ErrConfigSyntax) {
				t.Errorf("error %v wraps neither sentinel", err)
			}
		})
	}
	// An admin listener that is off is not checked.
	if _, err := config.Parse([]byte(base + "admin: {enabled: false, address: nonsense}\n")); err != nil {
		t.Errorf("disabled admin listener checked: %v", err)
	}
}
