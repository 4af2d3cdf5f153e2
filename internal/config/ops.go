package config

import (
	"net"
	"slices"
	"strconv"
	"strings"
)

// DefaultAdminAddress is where the admin listener binds unless configured:
// loopback only, so metrics, status and reload are not exposed by default.
const DefaultAdminAddress = "127.0.0.1:9901"

// Access log outputs besides a file path.
const (
	AccessLogStdout = "stdout"
	AccessLogStderr = "stderr"
)

// Admin configures the operator listener: Prometheus metrics, health and
// readiness, status and reload.
type Admin struct {
	// Enabled runs the admin listener (default true).
	Enabled *bool `yaml:"enabled"`
	// Address is host:port (default 127.0.0.1:9901). Inside a container
	// probes need a non-loopback address such as 0.0.0.0:9901.
	Address string `yaml:"address"`
	// Metrics serves /metrics and counts every request (default true).
	Metrics *bool `yaml:"metrics"`
	// AllowedHosts are host names, besides IP literals and localhost, that
	// a request to the admin listener may name in its Host header, with
	// any port (default none). Names only, without port, IP address or
	// wildcard (see ValidAdminHost). Any other Host is refused with 421,
	// so that a DNS-rebinding web page cannot read the admin endpoints.
	AllowedHosts []string `yaml:"allowed_hosts"`
}

// ValidAdminHost reports whether h may be listed in admin.allowed_hosts: a
// host name of dot-separated labels of letters, digits, '-' and '_' (not
// at a label's ends for '-'; a trailing dot allowed) that a browser would
// not read as an IPv4 address (its last label is not all digits).
func ValidAdminHost(h string) bool {
	h = strings.TrimSuffix(h, ".")
	if !validHostname(h) {
		return false
	}
	labels := strings.Split(h, ".")
	for _, l := range labels {
		if l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
	}
	return strings.Trim(labels[len(labels)-1], "0123456789") != ""
}

// On reports whether the admin listener runs.
func (a *Admin) On() bool { return a.Enabled == nil || *a.Enabled }

// MetricsOn reports whether metrics are collected and served.
func (a *Admin) MetricsOn() bool { return a.On() && (a.Metrics == nil || *a.Metrics) }

// AccessLog configures the per-request access log.
type AccessLog struct {
	// Enabled writes one JSON line per request (default false).
	Enabled bool `yaml:"enabled"`
	// Output is stdout (default), stderr or a file path (appended to).
	Output string `yaml:"output"`
	// SampleEvery logs one in this many ordinary requests (default 1:
	// all); blocks, redirects, failures and 5xx are always logged.
	SampleEvery int `yaml:"sample_every"`
	// Fields lists the fields of a line, by name (AccessLogFields), in
	// any order; a line carries them in a fixed order, and "level" and
	// "message" always. Default: DefaultAccessLogFields.
	Fields []string `yaml:"fields"`
}

// AccessLogFields are the fields an access log line may carry
// (access_log.fields). "agent_time" is the four agent_<phase>_us fields,
// the inspected and mutated byte counts are per direction.
var AccessLogFields = []string{
	"time", "req", "corr", "route", "method", "host", "path", "client",
	"status", "outcome", "agent", "reason", "agent_time",
	"bytes_in", "bytes_out", "duration_us", "fail_open", "inspection_skipped", "aborted",
	"start", "request_bytes_inspected", "response_bytes_inspected",
	"request_bytes_mutated", "response_bytes_mutated", "protocol",
}

// DefaultAccessLogFields are the fields of a line unless configured.
var DefaultAccessLogFields = []string{
	"time", "req", "corr", "route", "method", "host", "path", "client",
	"status", "outcome", "agent", "reason", "agent_time",
	"bytes_in", "bytes_out", "duration_us", "fail_open", "inspection_skipped", "aborted",
	"protocol",
}

func (c *Config) setOpsDefaults() {
	if c.Admin.Address == "" {
		c.Admin.Address = DefaultAdminAddress
	}
	if c.AccessLog.Output == "" {
		c.AccessLog.Output = AccessLogStdout
	}
	if c.AccessLog.SampleEvery == 0 {
		c.AccessLog.SampleEvery = 1
	}
	if c.AccessLog.Fields == nil {
		c.AccessLog.Fields = slices.Clone(DefaultAccessLogFields)
	}
}

func (v *validator) ops() {
	a := &v.c.Admin
	if a.On() {
		host, port, err := net.SplitHostPort(a.Address)
		n, perr := strconv.Atoi(port)
		switch {
		case strings.HasPrefix(a.Address, "unix:"):
			v.failf("admin.address", "the admin listener takes host:port, not a Unix socket")
		case err != nil:
			v.failf("admin.address", "%q is not host:port", a.Address)
		case perr != nil || n < 0 || n > 65535:
			v.failf("admin.address", "invalid port %q", port)
		case host != "" && net.ParseIP(host) == nil && !validHostname(host):
			v.failf("admin.address", "invalid host %q", host)
		}
		for i := range v.c.Listeners {
			if l := &v.c.Listeners[i]; l.Address == a.Address && n != 0 {
				v.failf("admin.address", "address %q is also used by listeners[%d]", a.Address, i)
			}
		}
		for i, h := range a.AllowedHosts {
			if !ValidAdminHost(h) {
				v.failf("admin.allowed_hosts["+strconv.Itoa(i)+"]", "%q is not a host name (no port, IP address or wildcard; IP addresses and localhost are always accepted)", h)
			}
		}
	}
	l := &v.c.AccessLog
	if l.SampleEvery < 1 {
		v.failf("access_log.sample_every", "must be at least 1")
	}
	if strings.TrimSpace(l.Output) == "" {
		v.failf("access_log.output", "output is required (stdout, stderr or a file path)")
	}
	if l.Fields != nil && len(l.Fields) == 0 {
		v.failf("access_log.fields", "lists no field (leave it out for the default ones)")
	}
	seen := map[string]bool{}
	for i, f := range l.Fields {
		p := "access_log.fields[" + strconv.Itoa(i) + "]"
		switch {
		case !slices.Contains(AccessLogFields, f):
			v.failf(p, "unknown field %q (known: %s)", f, strings.Join(AccessLogFields, ", "))
		case seen[f]:
			v.failf(p, "%q is listed twice", f)
		}
		seen[f] = true
	}
}
