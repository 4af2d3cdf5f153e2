package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"
	"time"
)

// ListenerTLS serves a listener over TLS (listeners[].tls).
type ListenerTLS struct {
	// Certificates are the server certificates. The first is the default;
	// the others are chosen by the client's SNI (server name indication)
	// against their ServerNames, or the DNS names of the certificate.
	Certificates []TLSCertificate `yaml:"certificates"`
	// MinVersion is the lowest protocol version accepted: 1.2 (default)
	// or 1.3.
	MinVersion string `yaml:"min_version"`
	// CipherSuites restricts the TLS 1.2 cipher suites, by their IANA
	// names (TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, ...). Empty: Go's
	// secure defaults. TLS 1.3 suites are not configurable.
	CipherSuites []string `yaml:"cipher_suites"`
	// ClientCAFile enables client certificates (mTLS): a PEM bundle of
	// the CAs that client certificates must chain to.
	ClientCAFile string `yaml:"client_ca_file"`
	// ClientAuth is require (default with a client_ca_file: a verified
	// client certificate is mandatory), optional (verified when sent) or
	// none (default without a client_ca_file).
	ClientAuth string `yaml:"client_auth"`
	// ReloadInterval is how often the certificate and CA files are
	// checked for changes (modification time and size) and re-read
	// without a restart (default 10s).
	ReloadInterval time.Duration `yaml:"reload_interval"`
}

// TLSCertificate is one certificate and its private key, PEM files.
type TLSCertificate struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerNames are the SNI names this certificate answers (exact, or
	// *.example.com for one label). Empty: the certificate's DNS names.
	ServerNames []string `yaml:"server_names"`
}

// UpstreamTLS connects to an upstream over TLS (upstreams[].tls).
type UpstreamTLS struct {
	// CAFile is a PEM bundle of the CAs the upstream's certificate must
	// chain to (default: the system roots).
	CAFile string `yaml:"ca_file"`
	// ServerName is the name sent as SNI and checked against the
	// upstream's certificate (default: the host of the address).
	ServerName string `yaml:"server_name"`
	// CertFile and KeyFile are a client certificate presented to the
	// upstream (both or neither).
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// InsecureSkipVerify accepts any upstream certificate. For tests
	// only: it is logged as a warning at every start and reload.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
	// MinVersion is 1.2 (default) or 1.3.
	MinVersion string `yaml:"min_version"`
	// CipherSuites restricts the TLS 1.2 cipher suites by name.
	CipherSuites []string `yaml:"cipher_suites"`
}

// Client authentication modes of ListenerTLS.ClientAuth.
const (
	ClientAuthNone     = "none"
	ClientAuthOptional = "optional"
	ClientAuthRequire  = "require"
)

func (t *ListenerTLS) setDefaults() {
	if t.MinVersion == "" {
		t.MinVersion = "1.2"
	}
	if t.ClientAuth == "" {
		t.ClientAuth = ClientAuthNone
		if t.ClientCAFile != "" {
			t.ClientAuth = ClientAuthRequire
		}
	}
	setDur(&t.ReloadInterval, 10*time.Second)
}

func (t *UpstreamTLS) setDefaults() {
	if t.MinVersion == "" {
		t.MinVersion = "1.2"
	}
}

// setTLSDefaults fills the TLS blocks' defaults; SetDefaults calls it.
func (c *Config) setTLSDefaults() {
	for i := range c.Listeners {
		if t := c.Listeners[i].TLS; t != nil {
			t.setDefaults()
		}
	}
	for i := range c.Upstreams {
		if t := c.Upstreams[i].TLS; t != nil {
			t.setDefaults()
		}
	}
}

// TLSVersion maps a min_version value to its crypto/tls constant.
func TLSVersion(s string) (uint16, error) {
	switch s {
	case "1.2", "TLS1.2", "tls1.2":
		return tls.VersionTLS12, nil
	case "1.3", "TLS1.3", "tls1.3":
		return tls.VersionTLS13, nil
	}
	return 0, fmt.Errorf("unknown TLS version %q (want 1.2 or 1.3)", s)
}

// CipherSuiteIDs maps cipher suite names to their ids. Only the suites
// crypto/tls considers secure are accepted.
func CipherSuiteIDs(names []string) ([]uint16, error) {
	if len(names) == 0 {
		return nil, nil
	}
	known := map[string]uint16{}
	for _, cs := range tls.CipherSuites() {
		known[cs.Name] = cs.ID
	}
	insecure := map[string]bool{}
	for _, cs := range tls.InsecureCipherSuites() {
		insecure[cs.Name] = true
	}
	ids := make([]uint16, 0, len(names))
	for _, n := range names {
		id, ok := known[n]
		switch {
		case ok:
			ids = append(ids, id)
		case insecure[n]:
			return nil, fmt.Errorf("cipher suite %s is insecure and not accepted", n)
		default:
			return nil, fmt.Errorf("unknown cipher suite %q (known: %s)", n, strings.Join(sortedKeys(known), ", "))
		}
	}
	return ids, nil
}

func sortedKeys(m map[string]uint16) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// LoadCertPool reads a PEM bundle of CA certificates; it fails when the
// file holds no certificate.
func LoadCertPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificate found", path)
	}
	return pool, nil
}

// tls checks the TLS blocks, reading their files: a missing file, a bad
// PEM block or a key that does not match its certificate is reported at
// its key.
func (v *validator) tls() {
	for i := range v.c.Listeners {
		t := v.c.Listeners[i].TLS
		if t == nil {
			continue
		}
		p := fmt.Sprintf("listeners[%d].tls", i)
		if strings.HasPrefix(v.c.Listeners[i].Address, "unix:") {
			v.failf(p, "TLS is for TCP listeners (not unix: sockets)")
		}
		if len(t.Certificates) == 0 {
			v.failf(p+".certificates", "at least one certificate is required")
		}
		for j := range t.Certificates {
			c := &t.Certificates[j]
			cp := fmt.Sprintf("%s.certificates[%d]", p, j)
			v.keyPair(cp, c.CertFile, c.KeyFile, true)
			for k, n := range c.ServerNames {
				if n == "" || strings.ContainsAny(n, " /:") || strings.Count(n, "*") > 1 ||
					(strings.Contains(n, "*") && !strings.HasPrefix(n, "*.")) {
					v.failf(fmt.Sprintf("%s.server_names[%d]", cp, k), "invalid server name %q (want a DNS name or *.domain)", n)
				}
			}
		}
		v.tlsParams(p, t.MinVersion, t.CipherSuites)
		switch t.ClientAuth {
		case ClientAuthNone:
		case ClientAuthOptional, ClientAuthRequire:
			if t.ClientCAFile == "" {
				v.failf(p+".client_auth", "client_auth %s needs client_ca_file", t.ClientAuth)
			}
		default:
			v.failf(p+".client_auth", "unknown client_auth %q (want require, optional or none)", t.ClientAuth)
		}
		if t.ClientCAFile != "" {
			if _, err := LoadCertPool(t.ClientCAFile); err != nil {
				v.failf(p+".client_ca_file", "%v", err)
			}
		}
		if t.ReloadInterval < 100*time.Millisecond {
			v.failf(p+".reload_interval", "must be at least 100ms")
		}
	}
	for i := range v.c.Upstreams {
		t := v.c.Upstreams[i].TLS
		if t == nil {
			continue
		}
		p := fmt.Sprintf("upstreams[%d].tls", i)
		if t.CertFile != "" || t.KeyFile != "" {
			v.keyPair(p, t.CertFile, t.KeyFile, false)
		}
		if t.CAFile != "" {
			if _, err := LoadCertPool(t.CAFile); err != nil {
				v.failf(p+".ca_file", "%v", err)
			}
		}
		if t.ServerName == "" && !t.InsecureSkipVerify && strings.HasPrefix(v.c.Upstreams[i].Address, "unix:") {
			v.failf(p+".server_name", "a unix: upstream over TLS needs server_name")
		}
		v.tlsParams(p, t.MinVersion, t.CipherSuites)
	}
}

func (v *validator) keyPair(p, certFile, keyFile string, required bool) {
	switch {
	case certFile == "" && (required || keyFile != ""):
		v.failf(p+".cert_file", "cert_file is required")
	case keyFile == "":
		v.failf(p+".key_file", "key_file is required")
	default:
		if _, err := tls.LoadX509KeyPair(certFile, keyFile); err != nil {
			v.failf(p+".cert_file", "loading %s / %s: %v", certFile, keyFile, err)
		}
	}
}

func (v *validator) tlsParams(p, minVersion string, suites []string) {
	if _, err := TLSVersion(minVersion); err != nil {
		v.failf(p+".min_version", "%v", err)
	}
	if _, err := CipherSuiteIDs(suites); err != nil {
		v.failf(p+".cipher_suites", "%v", err)
	}
}

// ListenersNeedRestart reports whether a and b differ in more than what a
// running listener re-reads on reload: the contents of their TLS blocks
// (certificates, client CAs, versions, suites), and their rate_limit
// (held by the routing table, not the listener); turning TLS on or off
// is more. A listener that differs so is replaced by a reload (the
// dataplane's Swap), not restarted.
func ListenersNeedRestart(a, b []Listener) bool {
	if len(a) != len(b) {
		return true
	}
	for i := range a {
		x, y := a[i], b[i]
		if (x.TLS == nil) != (y.TLS == nil) {
			return true
		}
		x.TLS, y.TLS = nil, nil
		x.RateLimit, y.RateLimit = nil, nil
		if !reflect.DeepEqual(x, y) {
			return true
		}
	}
	return false
}
