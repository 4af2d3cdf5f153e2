package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/testutil"
)

func tlsDoc(listenerTLS, upstreamTLS string) string {
	doc := "listeners:\n  - address: 127.0.0.1:8443\n"
	if listenerTLS != "" {
		doc += "    tls:\n" + indent(listenerTLS, "      ")
	}
	doc += "upstreams:\n  - name: app\n    address: 127.0.0.1:9000\n"
	if upstreamTLS != "" {
		doc += "    tls:\n" + indent(upstreamTLS, "      ")
	}
	return doc + "routes:\n  - upstream: app\n"
}

func indent(s, pre string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		b.WriteString(pre + l + "\n")
	}
	return b.String()
}

func TestTLSDefaults(t *testing.T) {
	pki := testutil.NewPKI(t, "ca")
	srv := pki.Server(t, "srv", "a.example")
	c, err := config.Parse([]byte(tlsDoc("certificates: [{cert_file: "+srv.CertFile+", key_file: "+srv.KeyFile+"}]\nclient_ca_file: "+pki.CAFile,
		"ca_file: "+pki.CAFile)))
	if err != nil {
		t.Fatal(err)
	}
	l := c.Listeners[0]
	if l.TLS.MinVersion != "1.2" || l.TLS.ClientAuth != config.ClientAuthRequire || l.TLS.ReloadInterval != 10*time.Second {
		t.Errorf("listener TLS defaults %+v", l.TLS)
	}
	if l.TunnelIdleTimeout != 5*time.Minute || l.MaxTunnels != 1024 {
		t.Errorf("tunnel defaults %v %d", l.TunnelIdleTimeout, l.MaxTunnels)
	}
	if u := c.Upstreams[0].TLS; u.MinVersion != "1.2" || u.InsecureSkipVerify {
		t.Errorf("upstream TLS defaults %+v", u)
	}
	c, err = config.Parse([]byte(tlsDoc("certificates: [{cert_file: "+srv.CertFile+", key_file: "+srv.KeyFile+"}]", "")))
	if err != nil {
		t.Fatal(err)
	}
	if c.Listeners[0].TLS.ClientAuth != config.ClientAuthNone || c.Upstreams[0].TLS != nil {
		t.Errorf("without a client CA: %+v", c.Listeners[0].TLS)
	}
}

func TestTLSValidation(t *testing.T) {
	pki := testutil.NewPKI(t, "ca")
	srv := pki.Server(t, "srv", "a.example")
	other := pki.Server(t, "other", "b.example")
	garbage := filepath.Join(pki.Dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cert := "certificates: [{cert_file: " + srv.CertFile + ", key_file: " + srv.KeyFile + "}]\n"
	for _, c := range []struct {
		name, listener, upstream, path, msg string
	}{
		{"no certificate", "min_version: \"1.2\"", "", "listeners[0].tls.certificates", "at least one certificate"},
		{"missing cert file", "certificates: [{cert_file: /nonexistent.pem, key_file: " + srv.KeyFile + "}]", "",
			"listeners[0].tls.certificates[0].cert_file", "no such file"},
		{"no key file", "certificates: [{cert_file: " + srv.CertFile + "}]", "", "listeners[0].tls.certificates[0].key_file", "required"},
		{"mismatched key", "certificates: [{cert_file: " + srv.CertFile + ", key_file: " + other.KeyFile + "}]", "",
			"listeners[0].tls.certificates[0].cert_file", "private key does not match"},
		{"bad PEM", "certificates: [{cert_file: " + garbage + ", key_file: " + srv.KeyFile + "}]", "",
			"listeners[0].tls.certificates[0].cert_file", "loading"},
		{"bad server name", "certificates: [{cert_file: " + srv.CertFile + ", key_file: " + srv.KeyFile + ", server_names: [\"a.*.example\"]}]", "",
			"listeners[0].tls.certificates[0].server_names[0]", "invalid server name"},
		{"version", cert + "min_version: \"1.1\"", "", "listeners[0].tls.min_version", "unknown TLS version"},
		{"unknown cipher", cert + "cipher_suites: [TLS_FOO]", "", "listeners[0].tls.cipher_suites", "unknown cipher suite"},
		{"insecure cipher", cert + "cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]", "", "listeners[0].tls.cipher_suites", "insecure"},
		{"client auth without CA", cert + "client_auth: require", "", "listeners[0].tls.client_auth", "needs client_ca_file"},
		{"unknown client auth", cert + "client_ca_file: " + pki.CAFile + "\nclient_auth: maybe", "", "listeners[0].tls.client_auth", "unknown client_auth"},
		{"client CA not PEM", cert + "client_ca_file: " + garbage, "", "listeners[0].tls.client_ca_file", "no PEM certificate"},
		{"reload interval", cert + "reload_interval: 1ms", "", "listeners[0].tls.reload_interval", "at least 100ms"},
		{"upstream CA missing", "", "ca_file: /nonexistent-ca.pem", "upstreams[0].tls.ca_file", "no such file"},
		{"upstream cert without key", "", "cert_file: " + srv.CertFile, "upstreams[0].tls.key_file", "required"},
		{"upstream key without cert", "", "key_file: " + srv.KeyFile, "upstreams[0].tls.cert_file", "required"},
		{"upstream cipher", "", "cipher_suites: [nope]", "upstreams[0].tls.cipher_suites", "unknown cipher suite"},
	} {
		_, err := config.Parse([]byte(tlsDoc(c.listener, c.upstream)))
		var ce *config.Error
		if !errors.As(err, &ce) || !errors.Is(err, config.ErrConfigInvalid) {
			t.Errorf("%s: error %v, want a validation error", c.name, err)
			continue
		}
		if ce.Path != c.path || !strings.Contains(ce.Msg, c.msg) || ce.Line == 0 {
			t.Errorf("%s: %s (line %d), want %s: ...%s...", c.name, err, ce.Line, c.path, c.msg)
		}
	}
}

func TestTLSOnUnixListenerRefused(t *testing.T) {
	pki := testutil.NewPKI(t, "ca")
	srv := pki.Server(t, "srv", "a.example")
	doc := strings.Replace(tlsDoc("certificates: [{cert_file: "+srv.CertFile+", key_file: "+srv.KeyFile+"}]", ""),
		"127.0.0.1:8443", "unix:/tmp/x.sock", 1)
	if _, err := config.Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), "not unix") {
		t.Errorf("TLS on a unix listener: %v", err)
	}
	doc = strings.Replace(tlsDoc("", "ca_file: "+pki.CAFile), "127.0.0.1:9000", "unix:/tmp/up.sock", 1)
	if _, err := config.Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), "needs server_name") {
		t.Errorf("TLS to a unix upstream without server_name: %v", err)
	}
}

func TestTunnelLimitsValidated(t *testing.T) {
	for key, val := range map[string]string{"max_tunnels": "-1", "tunnel_idle_timeout": "-1s",
		"lingering_timeout": "-1s", "max_lingering_bytes": "-1"} {
		doc := strings.Replace(tlsDoc("", ""), "127.0.0.1:8443\n", "127.0.0.1:8443\n    "+key+": "+val+"\n", 1)
		_, err := config.Parse([]byte(doc))
		if err == nil || !strings.Contains(err.Error(), "listeners[0]."+key) {
			t.Errorf("%s %s: %v", key, val, err)
		}
	}
}

func TestLingeringDefaults(t *testing.T) {
	c, err := config.Parse([]byte(tlsDoc("", "")))
	if err != nil {
		t.Fatal(err)
	}
	if l := c.Listeners[0]; l.LingeringTimeout != 5*time.Second || l.MaxLingeringBytes != 1<<20 {
		t.Errorf("lingering_timeout %v, max_lingering_bytes %v, want 5s and 1MiB", l.LingeringTimeout, l.MaxLingeringBytes)
	}
	doc := strings.Replace(tlsDoc("", ""), "127.0.0.1:8443\n", "127.0.0.1:8443\n    lingering_timeout: 250ms\n    max_lingering_bytes: 64KiB\n", 1)
	if c, err = config.Parse([]byte(doc)); err != nil {
		t.Fatal(err)
	}
	if l := c.Listeners[0]; l.LingeringTimeout != 250*time.Millisecond || l.MaxLingeringBytes != 64<<10 {
		t.Errorf("set: %v, %v", l.LingeringTimeout, l.MaxLingeringBytes)
	}
}

func TestListenersNeedRestart(t *testing.T) {
	base := func() []config.Listener {
		return []config.Listener{{Name: "l", Address: "127.0.0.1:1", TLS: &config.ListenerTLS{
			Certificates: []config.TLSCertificate{{CertFile: "a.pem", KeyFile: "a-key.pem"}}}}}
	}
	b := base()
	b[0].TLS.Certificates[0].CertFile = "b.pem"
	b[0].TLS.MinVersion = "1.3"
	if config.ListenersNeedRestart(base(), b) {
		t.Error("a certificate change is applied by a reload")
	}
	b = base()
	b[0].TLS = nil
	if !config.ListenersNeedRestart(base(), b) {
		t.Error("turning TLS off needs a restart")
	}
	b = base()
	b[0].Address = "127.0.0.1:2"
	if !config.ListenersNeedRestart(base(), b) {
		t.Error("an address change needs a restart")
	}
}
